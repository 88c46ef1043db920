/* Two threads, each with its own queue on a shared context, running at once. */
#include "common.h"
#include <pthread.h>

static const char *SRC =
    "__kernel void fill(__global uint *x, uint seed) {\n"
    "    uint i = get_global_id(0); uint v = seed ^ i;\n"
    "    for (int r = 0; r < 64; r++) v = v * 1664525u + 1013904223u;\n"
    "    x[i] = v;\n"
    "}\n";

enum { N = 1 << 14, ROUNDS = 50 };

struct job {
    cl_context ctx;
    cl_device_id device;
    cl_program prog;
    unsigned seed;
    unsigned long long checksum;
    int status;
};

static void *worker(void *arg) {
    struct job *j = arg;
    cl_int err;
    cl_command_queue q = clCreateCommandQueue(j->ctx, j->device, 0, &err);
    if (err != CL_SUCCESS) { j->status = err; return NULL; }
    cl_kernel k = clCreateKernel(j->prog, "fill", &err);
    if (err != CL_SUCCESS) { j->status = err; return NULL; }
    cl_mem buf = clCreateBuffer(j->ctx, CL_MEM_READ_WRITE, N * sizeof(cl_uint), NULL, &err);
    if (err != CL_SUCCESS) { j->status = err; return NULL; }
    static __thread cl_uint out[N];
    unsigned long long sum = 0;
    for (int r = 0; r < ROUNDS; r++) {
        cl_uint seed = j->seed + r;
        size_t global = N;
        if ((err = clSetKernelArg(k, 0, sizeof buf, &buf)) ||
            (err = clSetKernelArg(k, 1, sizeof seed, &seed)) ||
            (err = clEnqueueNDRangeKernel(q, k, 1, NULL, &global, NULL, 0, NULL, NULL)) ||
            (err = clEnqueueReadBuffer(q, buf, CL_TRUE, 0, sizeof out, out, 0, NULL, NULL))) {
            j->status = err;
            return NULL;
        }
        for (int i = 0; i < N; i++) sum += out[i];
    }
    j->checksum = sum;
    clReleaseMemObject(buf);
    clReleaseKernel(k);
    clReleaseCommandQueue(q);
    return NULL;
}

static unsigned long long expected(unsigned seed) {
    unsigned long long sum = 0;
    for (int r = 0; r < ROUNDS; r++)
        for (unsigned i = 0; i < N; i++) {
            cl_uint v = (seed + r) ^ i;
            for (int k = 0; k < 64; k++) v = v * 1664525u + 1013904223u;
            sum += v;
        }
    return sum;
}

int main(void) {
    cl_platform_id platform;
    cl_device_id device;
    cl_context ctx;
    cl_command_queue q;
    setup(&platform, &device, &ctx, &q, 0);
    cl_program prog = build(ctx, device, SRC);
    struct job jobs[2] = {{ctx, device, prog, 11, 0, 0}, {ctx, device, prog, 977, 0, 0}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, worker, &jobs[i]);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    int ok = 1;
    for (int i = 0; i < 2; i++) {
        int match = jobs[i].status == 0 && jobs[i].checksum == expected(jobs[i].seed);
        ok &= match;
        printf("thread %d status=%d checksum=%llu matches=%d\n", i, jobs[i].status, jobs[i].checksum, match);
    }
    clReleaseProgram(prog);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    return !ok;
}
