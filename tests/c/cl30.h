/* Shared by the C test programs written against OpenCL 3.0 headers. */
#ifndef HIRA_TEST_CL30_H
#define HIRA_TEST_CL30_H

#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <stdlib.h>

/* The first platform's first device and a context on it; exits with 2 without one. */
static inline cl_context first_context(cl_platform_id *platform, cl_device_id *device) {
    cl_int err;
    if (clGetPlatformIDs(1, platform, NULL) != CL_SUCCESS) exit(2);
    if (clGetDeviceIDs(*platform, CL_DEVICE_TYPE_ALL, 1, device, NULL) != CL_SUCCESS) exit(2);
    cl_context ctx = clCreateContext(NULL, 1, device, NULL, NULL, &err);
    if (err != CL_SUCCESS) exit(2);
    return ctx;
}

/* Kernel `name` of `src`, built for `device`; exits with 2 if it does not build. */
static inline cl_kernel build_kernel(cl_context ctx, cl_device_id device, const char *src,
                                     const char *name) {
    cl_int err;
    cl_program prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
    if (err != CL_SUCCESS || clBuildProgram(prog, 1, &device, NULL, NULL, NULL) != CL_SUCCESS) exit(2);
    cl_kernel k = clCreateKernel(prog, name, &err);
    if (err != CL_SUCCESS) exit(2);
    return k;
}

#endif
