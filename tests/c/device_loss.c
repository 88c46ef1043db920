/* Loses its device mid-run and recovers by recreating its context, as applications
 * do after a GPU reset: prints "ready", waits for a line on stdin (the test kills the
 * API server meanwhile), then reports what the old objects return and whether a new
 * context on the same device handle computes correctly. */
#include "cl30.h"
#include <stdio.h>

static const char *src =
    "__kernel void twice(__global int *a) { a[get_global_id(0)] *= 2; }\n";

static int compute(cl_context ctx, cl_device_id device) {
    cl_int err;
    int data[64];
    for (int i = 0; i < 64; i++) data[i] = i;
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, device, NULL, &err);
    if (err != CL_SUCCESS) return err;
    cl_kernel k = build_kernel(ctx, device, src, "twice");
    cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof data, data, &err);
    if (err != CL_SUCCESS) return err;
    clSetKernelArg(k, 0, sizeof m, &m);
    size_t n = 64;
    if ((err = clEnqueueNDRangeKernel(q, k, 1, NULL, &n, NULL, 0, NULL, NULL)) != CL_SUCCESS) return err;
    if ((err = clEnqueueReadBuffer(q, m, CL_TRUE, 0, sizeof data, data, 0, NULL, NULL)) != CL_SUCCESS) return err;
    int bad = 0;
    for (int i = 0; i < 64; i++) bad += data[i] != 2 * i;
    clReleaseMemObject(m);
    clReleaseKernel(k);
    clReleaseCommandQueue(q);
    return bad;
}

int main(void) {
    cl_platform_id platform;
    cl_device_id device;
    cl_int err;
    cl_context ctx = first_context(&platform, &device);
    printf("first context computes: mismatches=%d\n", compute(ctx, device));
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, device, NULL, &err);
    printf("ready\n");
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 2;

    cl_uint refs;
    err = clGetContextInfo(ctx, CL_CONTEXT_REFERENCE_COUNT, sizeof refs, &refs, NULL);
    printf("next call after the loss: %d\n", err);
    err = clFinish(q);
    printf("old queue: %d\n", err);
    /* The application finds its device again and makes a new context. */
    cl_uint n = 0;
    err = clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 0, NULL, &n);
    printf("devices found again: %d (%s)\n", err, n > 0 ? "some" : "none");
    cl_context fresh = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
    printf("new context on the old device handle: %d\n", err);
    if (err != CL_SUCCESS) return 1;
    printf("new context computes: mismatches=%d\n", compute(fresh, device));
    err = clFinish(q);
    printf("old queue after recovery: %d\n", err);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    clReleaseContext(fresh);
    return 0;
}
