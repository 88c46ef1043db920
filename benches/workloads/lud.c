/* LU decomposition without pivoting (after Rodinia's lud): per column, one kernel
 * scales it and one updates the trailing matrix. Moderate interposition. */
#include "workload.h"

static const char *SRC =
    "__kernel void scale(__global float *a, int n, int k) {\n"
    "    int i = k + 1 + get_global_id(0); if (i >= n) return;\n"
    "    a[i * n + k] /= a[k * n + k];\n"
    "}\n"
    "__kernel void update(__global float *a, int n, int k) {\n"
    "    int i = k + 1 + get_global_id(1), j = k + 1 + get_global_id(0);\n"
    "    if (i >= n || j >= n) return;\n"
    "    a[i * n + j] -= a[i * n + k] * a[k * n + j];\n"
    "}\n";

int main(int argc, char **argv) {
    int n = is_short(argc, argv) ? 64 : 320;
    size_t bytes = sizeof(float) * n * n;
    float *a = malloc(bytes), *orig = malloc(bytes);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) a[i * n + j] = orig[i * n + j] = (i == j) ? (float)n : (float)((i + 2 * j) % 7) / 7.0f;
    cl_platform_id platform;
    cl_device_id device;
    cl_context ctx;
    cl_command_queue q;
    setup(&platform, &device, &ctx, &q, 0);
    cl_program p = build(ctx, device, SRC);
    cl_kernel ks = kernel(p, "scale"), ku = kernel(p, "update");
    cl_mem da = buffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, bytes, a);
    CHECK(clSetKernelArg(ks, 0, sizeof da, &da));
    CHECK(clSetKernelArg(ks, 1, sizeof n, &n));
    CHECK(clSetKernelArg(ku, 0, sizeof da, &da));
    CHECK(clSetKernelArg(ku, 1, sizeof n, &n));
    for (int k = 0; k < n - 1; k++) {
        /* Fixed work-group sizes: one compiled kernel for every trailing size. */
        size_t rest = (size_t)(n - k - 1), l1 = 64, l2[2] = {8, 8};
        size_t g1 = (rest + l1 - 1) / l1 * l1, r8 = (rest + 7) / 8 * 8, g2[2] = {r8, r8};
        CHECK(clSetKernelArg(ks, 2, sizeof k, &k));
        CHECK(clEnqueueNDRangeKernel(q, ks, 1, NULL, &g1, &l1, 0, NULL, NULL));
        CHECK(clSetKernelArg(ku, 2, sizeof k, &k));
        CHECK(clEnqueueNDRangeKernel(q, ku, 2, NULL, g2, l2, 0, NULL, NULL));
    }
    CHECK(clEnqueueReadBuffer(q, da, CL_TRUE, 0, bytes, a, 0, NULL, NULL));
    /* Verify L * U reproduces the matrix. */
    double err = 0, trace = 0;
    for (int i = 0; i < n; i++) {
        trace += a[i * n + i];
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int k = 0; k <= (i < j ? i : j); k++) s += (k == i ? 1.0 : a[i * n + k]) * a[k * n + j];
            err = fmax(err, fabs(s - orig[i * n + j]));
        }
    }
    char d[128];
    snprintf(d, sizeof d, "n=%d launches=%d trace=%.3f", n, 2 * (n - 1), trace);
    return finish("lud", err < 1e-2, d);
}
