/* Bulk-transfer bandwidth: blocking writes and reads of one buffer of MiB mebibytes,
 * `rounds` times each (the first of each unmeasured), beside memcpy between two
 * buffers of the same size in this process: the machine's own copy bandwidth. Prints
 * medians in MiB/s as key=value. For measurement only: its output differs from run
 * to run. Usage: bandwidth [MiB] [rounds] */
#include "common.h"
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, n, sizeof *v, cmp);
    return v[n / 2];
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? (size_t)atoi(argv[1]) : 64, n = mib << 20;
    int rounds = argc > 2 ? atoi(argv[2]) : 5;
    if (rounds < 1 || rounds > 1000 || mib == 0) return 2;
    cl_platform_id platform;
    cl_device_id device;
    cl_context ctx;
    cl_command_queue q;
    cl_int err;
    setup(&platform, &device, &ctx, &q, 0);
    unsigned char *h = malloc(n), *copy = malloc(n);
    memset(h, 0x5A, n);
    memset(copy, 0, n);
    double *w = calloc(rounds, sizeof *w), *r = calloc(rounds, sizeof *r), *m = calloc(rounds, sizeof *m);
    cl_mem b = clCreateBuffer(ctx, CL_MEM_READ_WRITE, n, NULL, &err);
    CHECK_ERR(err, "clCreateBuffer");
    int ok = 1;
    for (int i = -1; i < rounds; i++) {
        double t0 = now();
        memcpy(copy, h, n);
        double t1 = now();
        CHECK(clEnqueueWriteBuffer(q, b, CL_TRUE, 0, n, h, 0, NULL, NULL));
        CHECK(clFinish(q));
        double t2 = now();
        memset(h, 0, n);
        double t3 = now();
        CHECK(clEnqueueReadBuffer(q, b, CL_TRUE, 0, n, h, 0, NULL, NULL));
        double t4 = now();
        ok &= h[0] == 0x5A && h[n / 2] == 0x5A && h[n - 1] == 0x5A && copy[n - 1] == 0x5A;
        if (i >= 0) {
            m[i] = mib / (t1 - t0);
            w[i] = mib / (t2 - t1);
            r[i] = mib / (t4 - t3);
        }
    }
    printf("bandwidth mib=%zu memcpy_mibs=%.1f write_mibs=%.1f read_mibs=%.1f ok=%d\n", mib,
           median(m, rounds), median(w, rounds), median(r, rounds), ok);
    return !ok;
}
