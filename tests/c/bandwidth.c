/* Times a blocking write and a blocking read of one buffer (default 64 MiB) and prints
 * MiB/s. For measurement only: its output differs from run to run.
 * Usage: bandwidth [MiB] */
#include "common.h"
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? (size_t)atoi(argv[1]) : 64, n = mib << 20;
    cl_platform_id platform;
    cl_device_id device;
    cl_context ctx;
    cl_command_queue q;
    cl_int err;
    setup(&platform, &device, &ctx, &q, 0);
    unsigned char *h = malloc(n);
    memset(h, 0x5A, n);
    cl_mem b = clCreateBuffer(ctx, CL_MEM_READ_WRITE, n, NULL, &err);
    CHECK_ERR(err, "clCreateBuffer");
    double t0 = now();
    CHECK(clEnqueueWriteBuffer(q, b, CL_TRUE, 0, n, h, 0, NULL, NULL));
    double t1 = now();
    memset(h, 0, n);
    CHECK(clEnqueueReadBuffer(q, b, CL_TRUE, 0, n, h, 0, NULL, NULL));
    double t2 = now();
    int ok = h[0] == 0x5A && h[n - 1] == 0x5A;
    printf("bandwidth %zu MiB: write %.1f MiB/s, read %.1f MiB/s, data ok=%d\n", mib, mib / (t1 - t0), mib / (t2 - t1), ok);
    return !ok;
}
