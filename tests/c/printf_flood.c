/* A kernel that prints far more than a session may send, launched ROUNDS times
 * (argument 1, default 4); then the session must still compute: prints
 * "usable: 1" when a vector add gives the right sums. */
#include "common.h"

static const char *SRC =
    "__kernel void flood(int lines) {\n"
    "    for (int i = 0; i < lines; i++)\n"
    "        printf(\"flood %d %d\\n\", (int)get_global_id(0), i);\n"
    "}\n"
    "__kernel void add(__global const int *a, __global const int *b, __global int *c) {\n"
    "    size_t i = get_global_id(0);\n"
    "    c[i] = a[i] + b[i];\n"
    "}\n";

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 4;
    cl_platform_id platform;
    cl_device_id device;
    cl_context ctx;
    cl_command_queue q;
    cl_int err;
    setup(&platform, &device, &ctx, &q, 0);
    cl_program p = build(ctx, device, SRC);
    cl_kernel flood = clCreateKernel(p, "flood", &err);
    CHECK_ERR(err, "clCreateKernel");
    int lines = 500;
    CHECK(clSetKernelArg(flood, 0, sizeof lines, &lines));
    size_t g = 256;
    for (int r = 0; r < rounds; r++) {
        CHECK(clEnqueueNDRangeKernel(q, flood, 1, NULL, &g, NULL, 0, NULL, NULL));
        CHECK(clFinish(q));
    }
    enum { N = 1024 };
    int a[N], b[N], c[N];
    for (int i = 0; i < N; i++) {
        a[i] = i;
        b[i] = 3 * i;
    }
    cl_mem ma = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof a, a, &err);
    CHECK_ERR(err, "clCreateBuffer");
    cl_mem mb = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof b, b, &err);
    CHECK_ERR(err, "clCreateBuffer");
    cl_mem mc = clCreateBuffer(ctx, CL_MEM_WRITE_ONLY, sizeof c, NULL, &err);
    CHECK_ERR(err, "clCreateBuffer");
    cl_kernel add = clCreateKernel(p, "add", &err);
    CHECK_ERR(err, "clCreateKernel");
    CHECK(clSetKernelArg(add, 0, sizeof ma, &ma));
    CHECK(clSetKernelArg(add, 1, sizeof mb, &mb));
    CHECK(clSetKernelArg(add, 2, sizeof mc, &mc));
    size_t n = N;
    CHECK(clEnqueueNDRangeKernel(q, add, 1, NULL, &n, NULL, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, mc, CL_TRUE, 0, sizeof c, c, 0, NULL, NULL));
    int ok = 1;
    for (int i = 0; i < N; i++) ok &= c[i] == 4 * i;
    printf("usable: %d\n", ok);
    return ok ? 0 : 1;
}
