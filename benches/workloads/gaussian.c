/* Gaussian elimination (after Rodinia's gaussian): two kernels per row, launched
 * back to back with no host synchronisation, then one read. Interposition-dominant. */
#include "workload.h"

static const char *SRC =
    "__kernel void fan1(__global float *m, __global const float *a, int n, int t) {\n"
    "    int i = get_global_id(0); if (i >= n - 1 - t) return;\n"
    "    m[n * (i + t + 1) + t] = a[n * (i + t + 1) + t] / a[n * t + t];\n"
    "}\n"
    "__kernel void fan2(__global const float *m, __global float *a, __global float *b, int n, int t) {\n"
    "    int x = get_global_id(0), y = get_global_id(1);\n"
    "    if (x >= n - 1 - t || y >= n - t) return;\n"
    "    a[n * (x + 1 + t) + (y + t)] -= m[n * (x + 1 + t) + t] * a[n * t + (y + t)];\n"
    "    if (y == 0) b[x + 1 + t] -= m[n * (x + 1 + t) + (y + t)] * b[t];\n"
    "}\n";

int main(int argc, char **argv) {
    int n = is_short(argc, argv) ? 64 : 384;
    float *a = malloc(sizeof(float) * n * n), *b = malloc(sizeof(float) * n), *x = malloc(sizeof(float) * n);
    float *ra = malloc(sizeof(float) * n * n), *rb = malloc(sizeof(float) * n), *rx = malloc(sizeof(float) * n);
    /* Diagonally dominant, so elimination without pivoting is stable. */
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < n; j++) a[i * n + j] = (i == j) ? (float)(2 * n) : (float)((i * 7 + j * 3) % 11) / 10.0f;
        b[i] = (float)(i % 17);
    }
    memcpy(ra, a, sizeof(float) * n * n);
    memcpy(rb, b, sizeof(float) * n);
    cl_platform_id platform;
    cl_device_id device;
    cl_context ctx;
    cl_command_queue q;
    setup(&platform, &device, &ctx, &q, 0);
    cl_program p = build(ctx, device, SRC);
    cl_kernel k1 = kernel(p, "fan1"), k2 = kernel(p, "fan2");
    cl_mem da = buffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof(float) * n * n, a);
    cl_mem db = buffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof(float) * n, b);
    cl_mem dm = buffer(ctx, CL_MEM_READ_WRITE, sizeof(float) * n * n, NULL);
    float zero = 0;
    CHECK(clEnqueueFillBuffer(q, dm, &zero, sizeof zero, 0, sizeof(float) * n * n, 0, NULL, NULL));
    for (int t = 0; t < n - 1; t++) {
        size_t g1 = (size_t)n, g2[2] = {(size_t)n, (size_t)n};
        CHECK(clSetKernelArg(k1, 0, sizeof dm, &dm));
        CHECK(clSetKernelArg(k1, 1, sizeof da, &da));
        CHECK(clSetKernelArg(k1, 2, sizeof n, &n));
        CHECK(clSetKernelArg(k1, 3, sizeof t, &t));
        CHECK(clEnqueueNDRangeKernel(q, k1, 1, NULL, &g1, NULL, 0, NULL, NULL));
        CHECK(clSetKernelArg(k2, 0, sizeof dm, &dm));
        CHECK(clSetKernelArg(k2, 1, sizeof da, &da));
        CHECK(clSetKernelArg(k2, 2, sizeof db, &db));
        CHECK(clSetKernelArg(k2, 3, sizeof n, &n));
        CHECK(clSetKernelArg(k2, 4, sizeof t, &t));
        CHECK(clEnqueueNDRangeKernel(q, k2, 2, NULL, g2, NULL, 0, NULL, NULL));
    }
    CHECK(clEnqueueReadBuffer(q, da, CL_TRUE, 0, sizeof(float) * n * n, a, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, db, CL_TRUE, 0, sizeof(float) * n, b, 0, NULL, NULL));
    /* Back substitution on the host, for the device result and for a CPU reference. */
    for (int t = 0; t < n - 1; t++)
        for (int i = t + 1; i < n; i++) {
            float m = ra[i * n + t] / ra[t * n + t];
            for (int j = t; j < n; j++) ra[i * n + j] -= m * ra[t * n + j];
            rb[i] -= m * rb[t];
        }
    for (int i = n - 1; i >= 0; i--) {
        double s = b[i], rs = rb[i];
        for (int j = i + 1; j < n; j++) {
            s -= a[i * n + j] * x[j];
            rs -= ra[i * n + j] * rx[j];
        }
        x[i] = (float)(s / a[i * n + i]);
        rx[i] = (float)(rs / ra[i * n + i]);
    }
    double err = 0, sum = 0;
    for (int i = 0; i < n; i++) {
        err = fmax(err, fabs(x[i] - rx[i]));
        sum += x[i];
    }
    char d[128];
    snprintf(d, sizeof d, "n=%d launches=%d sum=%.3f", n, 2 * (n - 1), sum);
    return finish("gaussian", err < 1e-3, d);
}
