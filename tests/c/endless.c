/* Launches a kernel that never ends, says so on stdout, then waits for it forever:
 * the test kills this guest and expects its API server to be ended anyway. */
#include "cl30.h"
#include <stdio.h>

static const char *src =
    "__kernel void spin(__global volatile int *p) { while (p[0] == 0) { p[1]++; } }\n";

int main(void) {
    cl_platform_id platform;
    cl_device_id device;
    cl_int err;
    cl_context ctx = first_context(&platform, &device);
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, device, NULL, &err);
    cl_kernel k = build_kernel(ctx, device, src, "spin");
    int zero[2] = {0, 0};
    cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof zero, zero, &err);
    clSetKernelArg(k, 0, sizeof m, &m);
    size_t one = 1;
    if (clEnqueueNDRangeKernel(q, k, 1, NULL, &one, NULL, 0, NULL, NULL) != CL_SUCCESS) return 2;
    if (clFlush(q) != CL_SUCCESS) return 2;
    /* A synchronous call after the flush: the launch reached the API server. */
    cl_uint refs;
    clGetKernelInfo(k, CL_KERNEL_REFERENCE_COUNT, sizeof refs, &refs, NULL);
    printf("launched\n");
    fflush(stdout);
    clFinish(q);
    return 0;
}
