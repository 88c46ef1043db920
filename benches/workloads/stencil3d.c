/* 3-D heat stencil (after Rodinia's hotspot3D): thousands of short iterations, each
 * followed by clFinish and two profiling queries. Interposition-dominant. */
#include "workload.h"

static const char *SRC =
    "__kernel void step3d(__global const float *in, __global float *out, int nx, int ny, int nz) {\n"
    "    int x = get_global_id(0), y = get_global_id(1), z = get_global_id(2);\n"
    "    int i = (z * ny + y) * nx + x;\n"
    "    float c = in[i];\n"
    "    float w = x > 0 ? in[i - 1] : c, e = x < nx - 1 ? in[i + 1] : c;\n"
    "    float n = y > 0 ? in[i - nx] : c, s = y < ny - 1 ? in[i + nx] : c;\n"
    "    float b = z > 0 ? in[i - nx * ny] : c, t = z < nz - 1 ? in[i + nx * ny] : c;\n"
    "    out[i] = 0.4f * c + 0.1f * (w + e + n + s + b + t);\n"
    "}\n";

static void cpu_step(const float *in, float *out, int nx, int ny, int nz) {
    for (int z = 0; z < nz; z++)
        for (int y = 0; y < ny; y++)
            for (int x = 0; x < nx; x++) {
                int i = (z * ny + y) * nx + x;
                float c = in[i];
                float w = x > 0 ? in[i - 1] : c, e = x < nx - 1 ? in[i + 1] : c;
                float n = y > 0 ? in[i - nx] : c, s = y < ny - 1 ? in[i + nx] : c;
                float b = z > 0 ? in[i - nx * ny] : c, t = z < nz - 1 ? in[i + nx * ny] : c;
                out[i] = 0.4f * c + 0.1f * (w + e + n + s + b + t);
            }
}

int main(int argc, char **argv) {
    int nx = 32, ny = 32, nz = 8, iters = is_short(argc, argv) ? 100 : 2000;
    size_t cells = (size_t)nx * ny * nz, bytes = cells * sizeof(float);
    float *h = malloc(bytes), *r = malloc(bytes), *tmp = malloc(bytes);
    for (size_t i = 0; i < cells; i++) h[i] = r[i] = (float)((i * 37) % 100);
    cl_platform_id platform;
    cl_device_id device;
    cl_context ctx;
    cl_command_queue q;
    setup(&platform, &device, &ctx, &q, CL_QUEUE_PROFILING_ENABLE);
    cl_program p = build(ctx, device, SRC);
    cl_kernel k = kernel(p, "step3d");
    cl_mem a = buffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, bytes, h);
    cl_mem b = buffer(ctx, CL_MEM_READ_WRITE, bytes, NULL);
    CHECK(clSetKernelArg(k, 2, sizeof nx, &nx));
    CHECK(clSetKernelArg(k, 3, sizeof ny, &ny));
    CHECK(clSetKernelArg(k, 4, sizeof nz, &nz));
    size_t g[3] = {(size_t)nx, (size_t)ny, (size_t)nz};
    cl_ulong device_ns = 0;
    for (int it = 0; it < iters; it++) {
        cl_mem in = it % 2 ? b : a, out = it % 2 ? a : b;
        CHECK(clSetKernelArg(k, 0, sizeof in, &in));
        CHECK(clSetKernelArg(k, 1, sizeof out, &out));
        cl_event ev;
        CHECK(clEnqueueNDRangeKernel(q, k, 3, NULL, g, NULL, 0, NULL, &ev));
        CHECK(clFinish(q));
        cl_ulong t0, t1;
        CHECK(clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_START, sizeof t0, &t0, NULL));
        CHECK(clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_END, sizeof t1, &t1, NULL));
        device_ns += t1 - t0;
        CHECK(clReleaseEvent(ev));
    }
    CHECK(clEnqueueReadBuffer(q, iters % 2 ? b : a, CL_TRUE, 0, bytes, h, 0, NULL, NULL));
    for (int it = 0; it < iters; it++) {
        cpu_step(r, tmp, nx, ny, nz);
        memcpy(r, tmp, bytes);
    }
    double err = 0, sum = 0;
    for (size_t i = 0; i < cells; i++) {
        err = fmax(err, fabs(h[i] - r[i]));
        sum += h[i];
    }
    char d[128];
    snprintf(d, sizeof d, "grid=%dx%dx%d iters=%d sum=%.2f device_time_positive=%d", nx, ny, nz, iters, sum,
             device_ns > 0);
    return finish("stencil3d", err < 1e-2, d);
}
