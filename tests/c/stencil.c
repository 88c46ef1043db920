/* Iterative 1-D heat stencil: ITERS kernel launches, a clFinish after each.
 * Usage: stencil [iterations] (default 1000). */
#include "common.h"

static const char *SRC =
    "__kernel void heat_step(__global const float *in, __global float *out, int n) {\n"
    "    int i = get_global_id(0);\n"
    "    if (i == 0 || i == n - 1) { out[i] = in[i]; return; }\n"
    "    out[i] = 0.25f * in[i - 1] + 0.5f * in[i] + 0.25f * in[i + 1];\n"
    "}\n";

int main(int argc, char **argv) {
    enum { N = 4096 };
    int iters = argc > 1 ? atoi(argv[1]) : 1000;
    static float h[N], ref[N], tmp[N];
    for (int i = 0; i < N; i++) h[i] = ref[i] = (i % 64 == 0) ? 100.0f : 0.0f;
    cl_platform_id platform;
    cl_device_id device;
    cl_context ctx;
    cl_command_queue q;
    cl_int err;
    setup(&platform, &device, &ctx, &q, 0);
    cl_program prog = build(ctx, device, SRC);
    cl_kernel k = clCreateKernel(prog, "heat_step", &err);
    CHECK_ERR(err, "clCreateKernel");
    cl_mem a = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof h, h, &err);
    CHECK_ERR(err, "buffer a");
    cl_mem b = clCreateBuffer(ctx, CL_MEM_READ_WRITE, sizeof h, NULL, &err);
    CHECK_ERR(err, "buffer b");
    int n = N;
    CHECK(clSetKernelArg(k, 2, sizeof n, &n));
    size_t global = N;
    /* For tests that act while the loop runs (stderr is not compared). */
    fprintf(stderr, "stencil: running\n");
    fflush(stderr);
    for (int it = 0; it < iters; it++) {
        cl_mem src = (it % 2 == 0) ? a : b, dst = (it % 2 == 0) ? b : a;
        CHECK(clSetKernelArg(k, 0, sizeof src, &src));
        CHECK(clSetKernelArg(k, 1, sizeof dst, &dst));
        CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &global, NULL, 0, NULL, NULL));
        CHECK(clFinish(q));
    }
    cl_mem last = (iters % 2 == 0) ? a : b;
    CHECK(clEnqueueReadBuffer(q, last, CL_TRUE, 0, sizeof h, h, 0, NULL, NULL));
    for (int it = 0; it < iters; it++) {
        for (int i = 0; i < N; i++)
            tmp[i] = (i == 0 || i == N - 1) ? ref[i]
                                            : 0.25f * ref[i - 1] + 0.5f * ref[i] + 0.25f * ref[i + 1];
        for (int i = 0; i < N; i++) ref[i] = tmp[i];
    }
    double sum = 0, maxdiff = 0;
    for (int i = 0; i < N; i++) {
        sum += h[i];
        double d = h[i] > ref[i] ? h[i] - ref[i] : ref[i] - h[i];
        if (d > maxdiff) maxdiff = d;
    }
    printf("stencil n=%d iters=%d sum=%.4f h[64]=%.6f maxdiff_ok=%d\n", N, iters, sum, h[64],
           maxdiff < 1e-3);
    clReleaseMemObject(a);
    clReleaseMemObject(b);
    clReleaseKernel(k);
    clReleaseProgram(prog);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    return maxdiff >= 1e-3;
}
