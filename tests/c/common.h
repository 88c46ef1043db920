/* Shared helpers for Hira's C test programs. */
#ifndef HIRA_TEST_COMMON_H
#define HIRA_TEST_COMMON_H

#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(expr)                                                              \
    do {                                                                         \
        cl_int check_err_ = (expr);                                              \
        if (check_err_ != CL_SUCCESS) {                                          \
            fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, #expr, \
                    check_err_);                                                 \
            exit(2);                                                             \
        }                                                                        \
    } while (0)

#define CHECK_ERR(err, what)                                                     \
    do {                                                                         \
        if ((err) != CL_SUCCESS) {                                               \
            fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, what,  \
                    (err));                                                      \
            exit(2);                                                             \
        }                                                                        \
    } while (0)

/* First platform, first device, a context and an in-order queue. */
static inline void setup(cl_platform_id *platform, cl_device_id *device, cl_context *ctx,
                  cl_command_queue *queue, cl_command_queue_properties props) {
    cl_uint n = 0;
    cl_int err;
    CHECK(clGetPlatformIDs(1, platform, &n));
    if (n == 0) {
        fprintf(stderr, "no OpenCL platform\n");
        exit(2);
    }
    CHECK(clGetDeviceIDs(*platform, CL_DEVICE_TYPE_ALL, 1, device, NULL));
    *ctx = clCreateContext(NULL, 1, device, NULL, NULL, &err);
    CHECK_ERR(err, "clCreateContext");
    *queue = clCreateCommandQueue(*ctx, *device, props, &err);
    CHECK_ERR(err, "clCreateCommandQueue");
}

static inline cl_program build(cl_context ctx, cl_device_id device, const char *src) {
    cl_int err;
    cl_program p = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
    CHECK_ERR(err, "clCreateProgramWithSource");
    err = clBuildProgram(p, 1, &device, NULL, NULL, NULL);
    if (err != CL_SUCCESS) {
        char log[16384];
        clGetProgramBuildInfo(p, device, CL_PROGRAM_BUILD_LOG, sizeof log, log, NULL);
        fprintf(stderr, "build failed (%d):\n%s\n", err, log);
        exit(2);
    }
    return p;
}

#endif
