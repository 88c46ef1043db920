/* Vector addition: buffers with COPY_HOST_PTR, a kernel, a blocking read. */
#include "common.h"

static const char *SRC =
    "__kernel void add(__global const float *a, __global const float *b,\n"
    "                  __global float *c) {\n"
    "    size_t i = get_global_id(0);\n"
    "    c[i] = a[i] + b[i];\n"
    "}\n";

int main(void) {
    enum { N = 1 << 16 };
    static float a[N], b[N], c[N];
    for (int i = 0; i < N; i++) {
        a[i] = (float)i * 0.5f;
        b[i] = (float)(N - i) * 0.25f;
    }
    cl_platform_id platform;
    cl_device_id device;
    cl_context ctx;
    cl_command_queue q;
    cl_int err;
    setup(&platform, &device, &ctx, &q, 0);
    cl_program prog = build(ctx, device, SRC);
    cl_kernel k = clCreateKernel(prog, "add", &err);
    CHECK_ERR(err, "clCreateKernel");
    cl_mem da = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof a, a, &err);
    CHECK_ERR(err, "clCreateBuffer a");
    cl_mem db = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof b, b, &err);
    CHECK_ERR(err, "clCreateBuffer b");
    cl_mem dc = clCreateBuffer(ctx, CL_MEM_WRITE_ONLY, sizeof c, NULL, &err);
    CHECK_ERR(err, "clCreateBuffer c");
    CHECK(clSetKernelArg(k, 0, sizeof da, &da));
    CHECK(clSetKernelArg(k, 1, sizeof db, &db));
    CHECK(clSetKernelArg(k, 2, sizeof dc, &dc));
    size_t global = N;
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &global, NULL, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, dc, CL_TRUE, 0, sizeof c, c, 0, NULL, NULL));
    double sum = 0;
    int bad = 0;
    for (int i = 0; i < N; i++) {
        sum += c[i];
        if (c[i] != a[i] + b[i]) bad++;
    }
    printf("vecadd n=%d sum=%.3f c[0]=%.3f c[%d]=%.3f mismatches=%d\n", N, sum, c[0], N - 1,
           c[N - 1], bad);
    clReleaseMemObject(da);
    clReleaseMemObject(db);
    clReleaseMemObject(dc);
    clReleaseKernel(k);
    clReleaseProgram(prog);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    return bad != 0;
}
