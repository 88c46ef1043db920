/* Makes N blocking writes of S bytes each into one buffer and prints a checksum of
 * what it reads back: a call stream whose payload size is chosen, for measuring what
 * the host spends per call as payloads grow. Usage: payload N S */
#include "common.h"
#include <string.h>

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1000;
    size_t s = argc > 2 ? (size_t)atol(argv[2]) : 16;
    cl_platform_id platform;
    cl_device_id device;
    cl_context ctx;
    cl_command_queue q;
    cl_int err;
    setup(&platform, &device, &ctx, &q, 0);
    unsigned char *h = malloc(s);
    cl_mem b = clCreateBuffer(ctx, CL_MEM_READ_WRITE, s, NULL, &err);
    CHECK_ERR(err, "clCreateBuffer");
    for (int i = 0; i < n; i++) {
        memset(h, i & 0xFF, s);
        CHECK(clEnqueueWriteBuffer(q, b, CL_TRUE, 0, s, h, 0, NULL, NULL));
    }
    CHECK(clEnqueueReadBuffer(q, b, CL_TRUE, 0, s, h, 0, NULL, NULL));
    unsigned long sum = 0;
    for (size_t i = 0; i < s; i++) sum += h[i];
    printf("payload calls=%d size=%zu sum=%lu\n", n, s, sum);
    free(h);
    clReleaseMemObject(b);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    return 0;
}
