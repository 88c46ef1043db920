/* Transfers larger than Hira's frames and data window (256 MiB): a buffer created from
 * 300 MiB of host memory, written, read back blocking and non-blocking, rectangle-read;
 * and a 4 MiB pitched rectangle (through the window) written and read back, the gaps
 * between its rows untouched. */
#include "cl30.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void) {
    const size_t n = (300u << 20) / sizeof(unsigned);
    unsigned *src = malloc(n * sizeof *src), *dst = malloc(n * sizeof *dst);
    if (!src || !dst) return 2;
    for (size_t i = 0; i < n; i++) src[i] = (unsigned)(i * 2654435761u);
    cl_platform_id platform;
    cl_device_id device;
    cl_int err;
    cl_context ctx = first_context(&platform, &device);
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, device, NULL, &err);
    cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n * sizeof *src, src, &err);
    printf("create from 300 MiB: %d\n", err);
    if (err) return 1;
    memset(dst, 0, n * sizeof *dst);
    err = clEnqueueReadBuffer(q, m, CL_TRUE, 0, n * sizeof *dst, dst, 0, NULL, NULL);
    printf("blocking read: %d, same: %d\n", err, memcmp(src, dst, n * sizeof *src) == 0);
    for (size_t i = 0; i < n; i++) src[i] ^= 0x5a5a5a5au;
    err = clEnqueueWriteBuffer(q, m, CL_TRUE, 0, n * sizeof *src, src, 0, NULL, NULL);
    printf("blocking write: %d\n", err);
    memset(dst, 0, n * sizeof *dst);
    cl_event done;
    err = clEnqueueReadBuffer(q, m, CL_FALSE, 0, n * sizeof *dst, dst, 0, NULL, &done);
    cl_int werr = clWaitForEvents(1, &done);
    printf("non-blocking read: %d %d, same: %d\n", err, werr, memcmp(src, dst, n * sizeof *src) == 0);
    /* The buffer as 1024-byte rows; read 280 MiB worth of rows, each from offset 16. */
    size_t rows = (280u << 20) / 1024;
    size_t borigin[3] = {16, 0, 0}, horigin[3] = {0, 0, 0}, region[3] = {1000, rows, 1};
    unsigned char *rect = malloc(1000 * rows);
    err = clEnqueueReadBufferRect(q, m, CL_TRUE, borigin, horigin, region, 1024, 0, 1000, 0,
                                  rect, 0, NULL, NULL);
    int bad = 0;
    for (size_t r = 0; r < rows; r++)
        bad += memcmp(rect + r * 1000, (unsigned char *)src + r * 1024 + 16, 1000) != 0;
    printf("rect read: %d, rows differing: %d\n", err, bad);
    size_t hrows = 4096, hbytes = 1024 * hrows + 8;
    size_t bo2[3] = {0, 0, 0}, ho2[3] = {8, 0, 0}, rg2[3] = {1000, hrows, 1};
    unsigned char *h = malloc(hbytes), *back = malloc(hbytes);
    for (size_t i = 0; i < hbytes; i++) h[i] = (unsigned char)(i * 31 + 7);
    memset(back, 0xEE, hbytes);
    cl_int werr2 = clEnqueueWriteBufferRect(q, m, CL_TRUE, bo2, ho2, rg2, 2048, 0, 1024, 0, h, 0,
                                            NULL, NULL);
    cl_int rerr2 = clEnqueueReadBufferRect(q, m, CL_TRUE, bo2, ho2, rg2, 2048, 0, 1024, 0, back,
                                           0, NULL, NULL);
    int rows_bad = 0, gaps_touched = back[0] != 0xEE;
    for (size_t r = 0; r < hrows; r++) {
        rows_bad += memcmp(back + 8 + r * 1024, h + 8 + r * 1024, 1000) != 0;
        for (size_t g = 1000; g < 1024 && 8 + r * 1024 + g < hbytes; g++)
            gaps_touched += back[8 + r * 1024 + g] != 0xEE;
    }
    printf("pitched rect write/read: %d %d, rows differing: %d, gap bytes touched: %d\n", werr2,
           rerr2, rows_bad, gaps_touched);
    free(h);
    free(back);
    clReleaseEvent(done);
    clReleaseMemObject(m);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    free(rect);
    free(src);
    free(dst);
    return 0;
}
