/* Round trip of a synchronous no-op call, clGetCommandQueueInfo(CL_QUEUE_REFERENCE_COUNT)
 * (a query Hira never caches), the cost of an asynchronously forwarded call,
 * clSetKernelArg, and the medians of a blocking 4-byte clEnqueueWriteBuffer and of an
 * empty kernel launch followed by clFinish. Usage: rtt [calls [sync [barrier]]]
 * (default 20000; a tenth of that for the last two). `sync` leaves out all but the
 * first, so that concurrent copies measure synchronous calls alone; with `barrier`,
 * the program prints `ready` once set up and warmed, and starts measuring when a line
 * arrives on its standard input, so that concurrent copies call at the same time.
 * Prints nanoseconds. */
#include "common.h"
#include <string.h>
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
    if (argc > 3 && !strcmp(argv[3], "barrier")) {
        char line[16];
        printf("ready\n");
        fflush(stdout);
        if (!fgets(line, sizeof line, stdin)) {
            fprintf(stderr, "rtt: no start line\n");
            return 1;
        }
    }
    for (int i = 0; i < n; i++) {
        long long t0 = now_ns();
        CHECK(clGetCommandQueueInfo(q, CL_QUEUE_REFERENCE_COUNT, sizeof refs, &refs, NULL));
        t[i] = now_ns() - t0;
    }
    qsort(t, n, sizeof *t, cmp);
    long long sync_median = t[n / 2], sync_p99 = t[n * 99 / 100];
    if (argc > 2 && !strcmp(argv[2], "sync")) {
        printf("sync_median_ns=%lld sync_p99_ns=%lld calls=%d\n", sync_median, sync_p99, n);
        return 0;
    }
    long long t0 = now_ns();
    for (int i = 0; i < n; i++) CHECK(clSetKernelArg(k, 0, sizeof i, &i));
    CHECK(clFinish(q));
    double async_ns = (double)(now_ns() - t0) / n;
    int m = n / 10 > 0 ? n / 10 : 1;
    cl_mem buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 4, NULL, &err);
    CHECK_ERR(err, "clCreateBuffer");
    for (int i = 0; i < m; i++) {
        long long t1 = now_ns();
        CHECK(clEnqueueWriteBuffer(q, buf, CL_TRUE, 0, 4, &i, 0, NULL, NULL));
        t[i] = now_ns() - t1;
    }
    CHECK(clFinish(q));
    qsort(t, m, sizeof *t, cmp);
    long long write_median = t[m / 2];
    size_t one = 1;
    int zero = 0;
    CHECK(clSetKernelArg(k, 0, sizeof zero, &zero));
    for (int i = 0; i < m; i++) {
        long long t1 = now_ns();
        CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &one, NULL, 0, NULL, NULL));
        CHECK(clFinish(q));
        t[i] = now_ns() - t1;
    }
    qsort(t, m, sizeof *t, cmp);
    printf("sync_median_ns=%lld sync_p99_ns=%lld async_mean_ns=%.0f write4_median_ns=%lld "
           "kernel_finish_median_ns=%lld calls=%d\n",
           sync_median, sync_p99, async_ns, write_median, t[m / 2], n);
    clReleaseMemObject(buf);
    free(t);
    clReleaseKernel(k);
    clReleaseProgram(prog);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    return 0;
}
