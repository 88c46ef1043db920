/* Round trip of a synchronous no-op call, clGetCommandQueueInfo(CL_QUEUE_REFERENCE_COUNT)
 * (a query Hira never caches), and the cost of an asynchronously forwarded call,
 * clSetKernelArg. Usage: rtt [calls] (default 20000). Prints nanoseconds. */
#include "common.h"
#include <time.h>

static const char *SRC = "__kernel void k(int x) { }\n";

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 20000;
    cl_platform_id platform;
    cl_device_id device;
    cl_context ctx;
    cl_command_queue q;
    cl_int err;
    setup(&platform, &device, &ctx, &q, 0);
    cl_program prog = build(ctx, device, SRC);
    cl_kernel k = clCreateKernel(prog, "k", &err);
    CHECK_ERR(err, "clCreateKernel");
    long long *t = malloc(sizeof *t * n);
    cl_uint refs;
    for (int i = 0; i < 1000; i++)
        CHECK(clGetCommandQueueInfo(q, CL_QUEUE_REFERENCE_COUNT, sizeof refs, &refs, NULL));
    for (int i = 0; i < n; i++) {
        long long t0 = now_ns();
        CHECK(clGetCommandQueueInfo(q, CL_QUEUE_REFERENCE_COUNT, sizeof refs, &refs, NULL));
        t[i] = now_ns() - t0;
    }
    qsort(t, n, sizeof *t, cmp);
    long long t0 = now_ns();
    for (int i = 0; i < n; i++) CHECK(clSetKernelArg(k, 0, sizeof i, &i));
    CHECK(clFinish(q));
    double async_ns = (double)(now_ns() - t0) / n;
    printf("sync_median_ns=%lld sync_p99_ns=%lld async_mean_ns=%.0f calls=%d\n", t[n / 2], t[n * 99 / 100],
           async_ns, n);
    free(t);
    clReleaseKernel(k);
    clReleaseProgram(prog);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    return 0;
}
