/* Transfers large enough for Hira to stream through its data window in chunks:
 * buffers created from host memory (COPY and USE_HOST_PTR, sizes that are no multiple
 * of a chunk, one the host may not write), blocking writes and reads at odd offsets,
 * a kernel right after a streamed write, two threads streaming at once, and a create
 * that fails. With the argument `shmem` it also prints, to stderr, how many KiB of
 * shared memory the process has touched before the failing create (the window's pages
 * among them). With `small` the transfers are a quarter of the size, and Hira is asked
 * to stream from 1 MiB (`HIRA_STREAM_MIN_KB`, which nothing else reads): for VM guests
 * under emulation. */
#include "cl30.h"
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define MIB (1u << 20)

static cl_context ctx;
static cl_device_id device;
/* Sizes are divided by this (4 with `small`). */
static size_t scale = 1;

static void pattern(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)((i * 2654435761u + seed) >> 13);
}

static int same(const unsigned char *a, const unsigned char *b, size_t n) {
    return memcmp(a, b, n) == 0;
}

struct job {
    unsigned seed;
    int ok;
};

static void *worker(void *arg) {
    struct job *j = arg;
    size_t n = 24 * MIB / scale + 4093;
    unsigned char *src = malloc(n), *dst = calloc(1, n);
    pattern(src, n, j->seed);
    cl_int err;
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, device, NULL, &err);
    cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n, src, &err);
    j->ok = err == CL_SUCCESS;
    for (int round = 0; round < 3 && j->ok; round++) {
        pattern(src, n, j->seed + round);
        j->ok &= clEnqueueWriteBuffer(q, m, CL_TRUE, 0, n, src, 0, NULL, NULL) == CL_SUCCESS;
        j->ok &= clEnqueueReadBuffer(q, m, CL_TRUE, 0, n, dst, 0, NULL, NULL) == CL_SUCCESS;
        j->ok &= same(src, dst, n);
    }
    clReleaseMemObject(m);
    clReleaseCommandQueue(q);
    free(src);
    free(dst);
    return NULL;
}

static long shmem_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "RssShmem: %ld kB", &kib) == 1) break;
    if (f) fclose(f);
    return kib;
}

int main(int argc, char **argv) {
    cl_platform_id platform;
    cl_int err;
    int shmem = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "shmem") == 0) shmem = 1;
        if (strcmp(argv[i], "small") == 0) {
            scale = 4;
            setenv("HIRA_STREAM_MIN_KB", "1024", 0);
        }
    }
    ctx = first_context(&platform, &device);
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, device, NULL, &err);
    size_t n = 40 * MIB / scale + 12345;
    unsigned char *src = malloc(n), *dst = malloc(n);
    pattern(src, n, 1);

    /* Created from host memory: contents as given, flags as asked. */
    cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n, src, &err);
    memset(dst, 0, n);
    cl_int rerr = clEnqueueReadBuffer(q, m, CL_TRUE, 0, n, dst, 0, NULL, NULL);
    cl_mem_flags flags = 0;
    clGetMemObjectInfo(m, CL_MEM_FLAGS, sizeof flags, &flags, NULL);
    printf("copy_host_ptr: create %d read %d same %d flags 0x%llx\n", err, rerr,
           same(src, dst, n), (unsigned long long)flags);

    /* A blocking write at an odd offset, then a read of a part at another. */
    size_t p = 17 * MIB / scale;
    unsigned char *part = malloc(p);
    pattern(part, p, 7);
    cl_int werr = clEnqueueWriteBuffer(q, m, CL_TRUE, MIB + 7, p, part, 0, NULL, NULL);
    memcpy(src + MIB + 7, part, p);
    memset(dst, 0, n);
    rerr = clEnqueueReadBuffer(q, m, CL_TRUE, 3, n - 3, dst + 3, 0, NULL, NULL);
    printf("offset write %d, offset read %d, same %d\n", werr, rerr, same(src + 3, dst + 3, n - 3));

    /* A kernel right after a streamed write sees all of it. */
    const char *kernel_src =
        "__kernel void twice(__global uchar *p) { size_t i = get_global_id(0); p[i] = (uchar)(p[i] * 2); }";
    cl_kernel k = build_kernel(ctx, device, kernel_src, "twice");
    pattern(src, n, 3);
    werr = clEnqueueWriteBuffer(q, m, CL_TRUE, 0, n, src, 0, NULL, NULL);
    clSetKernelArg(k, 0, sizeof m, &m);
    size_t global = n;
    cl_int kerr = clEnqueueNDRangeKernel(q, k, 1, NULL, &global, NULL, 0, NULL, NULL);
    rerr = clEnqueueReadBuffer(q, m, CL_TRUE, 0, n, dst, 0, NULL, NULL);
    int doubled = 1;
    for (size_t i = 0; i < n; i++) doubled &= dst[i] == (unsigned char)(src[i] * 2);
    printf("write, kernel, read: %d %d %d doubled %d\n", werr, kerr, rerr, doubled);

    /* USE_HOST_PTR: the buffer starts with the host memory's contents. */
    size_t u = 12 * MIB / scale + 1;
    unsigned char *host = malloc(u);
    pattern(host, u, 5);
    cl_mem um = clCreateBuffer(ctx, CL_MEM_USE_HOST_PTR, u, host, &err);
    memset(dst, 0, u);
    rerr = clEnqueueReadBuffer(q, um, CL_TRUE, 0, u, dst, 0, NULL, NULL);
    printf("use_host_ptr: create %d read %d same %d\n", err, rerr, same(host, dst, u));

    /* One the host may not write: its contents still arrive (copied to a readable one). */
    cl_mem hm = clCreateBuffer(ctx, CL_MEM_HOST_NO_ACCESS | CL_MEM_COPY_HOST_PTR, u, host, &err);
    cl_mem rm = clCreateBuffer(ctx, CL_MEM_READ_WRITE, u, NULL, &rerr);
    cl_int cerr = clEnqueueCopyBuffer(q, hm, rm, 0, 0, u, 0, NULL, NULL);
    memset(dst, 0, u);
    rerr = clEnqueueReadBuffer(q, rm, CL_TRUE, 0, u, dst, 0, NULL, NULL);
    printf("host_no_access: create %d copy %d read %d same %d\n", err, cerr, rerr,
           same(host, dst, u));

    if (shmem) fprintf(stderr, "shmem %ld\n", shmem_kib());

    /* A create the host refuses. */
    cl_ulong max_alloc = 0;
    clGetDeviceInfo(device, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max_alloc, &max_alloc, NULL);
    cl_mem big = clCreateBuffer(ctx, CL_MEM_COPY_HOST_PTR | CL_MEM_HOST_READ_ONLY | CL_MEM_HOST_WRITE_ONLY,
                                n, src, &err);
    printf("contradictory flags: %d %s\n", err, big ? "object" : "null");

    /* Two threads at once. */
    pthread_t t[2];
    struct job jobs[2] = {{11, 0}, {29, 0}};
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, worker, &jobs[i]);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    printf("threads: %d %d\n", jobs[0].ok, jobs[1].ok);

    clReleaseMemObject(m);
    clReleaseMemObject(um);
    clReleaseMemObject(hm);
    clReleaseMemObject(rm);
    clReleaseKernel(k);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    free(src);
    free(dst);
    free(part);
    free(host);
    return 0;
}
