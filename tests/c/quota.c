/* Device memory on command, for the memory-quota tests: reads one command per line
 * from stdin and answers one line on stdout, so a test can change the VM's quota
 * between allocations without any timing assumption.
 *
 *   buf BYTES        clCreateBuffer          -> "ok ID" or "err CODE"
 *   hostbuf BYTES    the same, CL_MEM_COPY_HOST_PTR
 *   image W H        clCreateImage (2D, RGBA, 8 bit)
 *   sub ID           a sub-buffer of the first half of buffer ID (no new memory)
 *   svm BYTES        clSVMAlloc              -> "ok ID" or "null"
 *   use ID           writes, runs nothing, reads back: the object works -> "ok"
 *   free ID          clReleaseMemObject / clSVMFree -> "ok"
 */
#include "cl30.h"
#include <stdio.h>
#include <string.h>

enum { MAX_OBJECTS = 256 };

static cl_mem mems[MAX_OBJECTS];
static size_t sizes[MAX_OBJECTS];
static void *svms[MAX_OBJECTS];
static int count;

int main(void) {
    cl_platform_id platform;
    cl_device_id device;
    cl_context ctx = first_context(&platform, &device);
    cl_int err;
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, device, NULL, &err);
    if (err != CL_SUCCESS) return 2;
    char line[256];
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("ready\n");
    while (fgets(line, sizeof line, stdin)) {
        char cmd[32];
        unsigned long long a = 0, b = 0;
        int n = sscanf(line, "%31s %llu %llu", cmd, &a, &b);
        if (n < 1 || count >= MAX_OBJECTS) return 2;
        if (!strcmp(cmd, "buf") || !strcmp(cmd, "hostbuf")) {
            void *host = NULL;
            cl_mem_flags flags = CL_MEM_READ_WRITE;
            if (cmd[0] == 'h') {
                host = calloc(1, a);
                flags |= CL_MEM_COPY_HOST_PTR;
            }
            cl_mem m = clCreateBuffer(ctx, flags, a, host, &err);
            free(host);
            if (err != CL_SUCCESS || !m) {
                printf("err %d\n", err);
                continue;
            }
            mems[count] = m;
            sizes[count] = a;
            printf("ok %d\n", count++);
        } else if (!strcmp(cmd, "image")) {
            cl_image_format fmt = {CL_RGBA, CL_UNORM_INT8};
            cl_image_desc desc = {0};
            desc.image_type = CL_MEM_OBJECT_IMAGE2D;
            desc.image_width = a;
            desc.image_height = b;
            cl_mem m = clCreateImage(ctx, CL_MEM_READ_WRITE, &fmt, &desc, NULL, &err);
            if (err != CL_SUCCESS || !m) {
                printf("err %d\n", err);
                continue;
            }
            mems[count] = m;
            printf("ok %d\n", count++);
        } else if (!strcmp(cmd, "sub")) {
            cl_buffer_region r = {0, sizes[a] / 2};
            cl_mem m = clCreateSubBuffer(mems[a], CL_MEM_READ_WRITE,
                                         CL_BUFFER_CREATE_TYPE_REGION, &r, &err);
            if (err != CL_SUCCESS || !m) {
                printf("err %d\n", err);
                continue;
            }
            mems[count] = m;
            sizes[count] = r.size;
            printf("ok %d\n", count++);
        } else if (!strcmp(cmd, "svm")) {
            void *p = clSVMAlloc(ctx, CL_MEM_READ_WRITE, a, 0);
            if (!p) {
                printf("null\n");
                continue;
            }
            svms[count] = p;
            printf("ok %d\n", count++);
        } else if (!strcmp(cmd, "use")) {
            size_t len = sizes[a] < 4096 ? sizes[a] : 4096;
            unsigned char out[4096], in[4096];
            for (size_t i = 0; i < len; i++) out[i] = (unsigned char)(i * 7 + a);
            err = clEnqueueWriteBuffer(q, mems[a], CL_TRUE, 0, len, out, 0, NULL, NULL);
            if (err == CL_SUCCESS)
                err = clEnqueueReadBuffer(q, mems[a], CL_TRUE, 0, len, in, 0, NULL, NULL);
            if (err == CL_SUCCESS && memcmp(in, out, len)) err = -9999;
            printf(err == CL_SUCCESS ? "ok\n" : "err %d\n", err);
        } else if (!strcmp(cmd, "free")) {
            if (svms[a]) {
                clSVMFree(ctx, svms[a]);
                svms[a] = NULL;
            } else {
                err = clReleaseMemObject(mems[a]);
                if (err != CL_SUCCESS) {
                    printf("err %d\n", err);
                    continue;
                }
            }
            /* A release is forwarded without a reply: a finished queue makes sure
             * the host has run it before the test looks at the VM's usage. */
            clFinish(q);
            printf("ok\n");
        } else {
            return 2;
        }
    }
    return 0;
}
