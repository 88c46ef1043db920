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

#endif
