/* Coarse-grained buffer SVM: a linked list built by the host in one allocation,
 * pointing into another, followed by a kernel; SVM arguments, exec-info pointers,
 * map/unmap, memcpy, memfill, a buffer on SVM memory, and a free callback. */
#include "cl30.h"
#include <stdio.h>
#include <string.h>

typedef struct Node { struct Node *next; int value; } Node;

static const char *src =
    "typedef struct Node { __global struct Node *next; int value; } Node;\n"
    "__kernel void walk(__global Node *head, __global int *out) {\n"
    "  int sum = 0; for (__global Node *n = head; n; n = n->next) sum += n->value;\n"
    "  out[0] = sum; }\n"
    "__kernel void twice(__global int *a) { a[get_global_id(0)] *= 2; }\n";

static volatile int freed = -1;
static void CL_CALLBACK on_free(cl_command_queue q, cl_uint n, void **ptrs, void *data) {
    (void)q;
    for (cl_uint i = 0; i < n; i++) clSVMFree((cl_context)data, ptrs[i]);
    freed = (int)n;
}

int main(void) {
    cl_platform_id platform;
    cl_device_id device;
    cl_int err;
    cl_context ctx = first_context(&platform, &device);
    cl_device_svm_capabilities caps = 0;
    clGetDeviceInfo(device, CL_DEVICE_SVM_CAPABILITIES, sizeof caps, &caps, NULL);
    printf("coarse-grained buffers: %d\n", (caps & CL_DEVICE_SVM_COARSE_GRAIN_BUFFER) != 0);
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, device, NULL, &err);
    cl_program p = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
    if (clBuildProgram(p, 1, &device, NULL, NULL, NULL) != CL_SUCCESS) return 2;
    cl_kernel walk = clCreateKernel(p, "walk", &err), twice = clCreateKernel(p, "twice", &err);

    Node *a = clSVMAlloc(ctx, CL_MEM_READ_WRITE, 4 * sizeof(Node), 0);
    Node *b = clSVMAlloc(ctx, CL_MEM_READ_WRITE, 4 * sizeof(Node), 0);
    int *out = clSVMAlloc(ctx, CL_MEM_READ_WRITE, 64 * sizeof(int), 0);
    printf("allocated: %d\n", a && b && out);
    clEnqueueSVMMap(q, CL_TRUE, CL_MAP_WRITE, a, 4 * sizeof(Node), 0, NULL, NULL);
    clEnqueueSVMMap(q, CL_TRUE, CL_MAP_WRITE, b, 4 * sizeof(Node), 0, NULL, NULL);
    for (int i = 0; i < 4; i++) {   /* a0 -> b0 -> a1 -> b1 -> ... */
        a[i].value = i + 1;
        a[i].next = &b[i];
        b[i].value = 10 * (i + 1);
        b[i].next = i < 3 ? &a[i + 1] : NULL;
    }
    clEnqueueSVMUnmap(q, a, 0, NULL, NULL);
    clEnqueueSVMUnmap(q, b, 0, NULL, NULL);
    clSetKernelArgSVMPointer(walk, 0, a);
    clSetKernelArgSVMPointer(walk, 1, out);
    void *reached[] = {b};
    err = clSetKernelExecInfo(walk, CL_KERNEL_EXEC_INFO_SVM_PTRS, sizeof reached, reached);
    size_t one = 1;
    err |= clEnqueueNDRangeKernel(q, walk, 1, NULL, &one, NULL, 0, NULL, NULL);
    clEnqueueSVMMap(q, CL_TRUE, CL_MAP_READ, out, sizeof(int), 0, NULL, NULL);
    printf("kernel followed the list: %d (sum %d)\n", err, out[0]);
    clEnqueueSVMUnmap(q, out, 0, NULL, NULL);

    int pattern = 3;
    cl_event filled;
    clEnqueueSVMMemFill(q, out, &pattern, sizeof pattern, 64 * sizeof(int), 0, NULL, &filled);
    cl_command_type type;
    clWaitForEvents(1, &filled);
    clGetEventInfo(filled, CL_EVENT_COMMAND_TYPE, sizeof type, &type, NULL);
    printf("fill command type is SVM_MEMFILL: %d\n", type == CL_COMMAND_SVM_MEMFILL);
    clReleaseEvent(filled);
    clSetKernelArgSVMPointer(twice, 0, out);
    size_t n = 64;
    clEnqueueNDRangeKernel(q, twice, 1, NULL, &n, NULL, 0, NULL, NULL);
    int host[64];
    clEnqueueSVMMemcpy(q, CL_TRUE, host, out, sizeof host, 0, NULL, NULL);
    int bad = 0;
    for (int i = 0; i < 64; i++) bad += host[i] != 6;
    printf("fill, kernel, memcpy to host: mismatches=%d\n", bad);

    /* A buffer on SVM memory shares it. */
    cl_mem over = clCreateBuffer(ctx, CL_MEM_USE_HOST_PTR, 64 * sizeof(int), out, &err);
    clSetKernelArg(twice, 0, sizeof over, &over);
    clEnqueueNDRangeKernel(q, twice, 1, NULL, &n, NULL, 0, NULL, NULL);
    cl_event mapped;
    clEnqueueSVMMap(q, CL_FALSE, CL_MAP_READ, out, 64 * sizeof(int), 0, NULL, &mapped);
    clWaitForEvents(1, &mapped);
    clGetEventInfo(mapped, CL_EVENT_COMMAND_TYPE, sizeof type, &type, NULL);
    bad = 0;
    for (int i = 0; i < 64; i++) bad += out[i] != 12;
    printf("buffer on SVM memory aliases it: %d, mismatches=%d, map type ok: %d\n", err, bad,
           type == CL_COMMAND_SVM_MAP);
    clEnqueueSVMUnmap(q, out, 0, NULL, NULL);
    clReleaseEvent(mapped);
    clReleaseMemObject(over);

    void *frees[] = {a, b};
    cl_event done;
    err = clEnqueueSVMFree(q, 2, frees, on_free, ctx, 0, NULL, &done);
    clWaitForEvents(1, &done);
    clFinish(q);
    while (freed < 0) {
    }
    printf("enqueued free with callback: %d, callback freed %d\n", err, freed);
    clReleaseEvent(done);
    clSVMFree(ctx, out);
    clReleaseKernel(walk);
    clReleaseKernel(twice);
    clReleaseProgram(p);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    return 0;
}
