/* Kernel arguments that natively are undefined behaviour (PoCL reads them as object
 * pointers): arbitrary bytes, a released buffer and a sampler where the kernel takes a
 * buffer. Through Hira each must fail with the API's error and leave the session
 * working: a correct launch afterwards still computes the right result. */
#include "cl30.h"
#include <stdint.h>
#include <stdio.h>

static const char *src =
    "__kernel void k(__global int *out, sampler_t s) { out[get_global_id(0)] = 7; }\n";

int main(void) {
    cl_platform_id platform;
    cl_device_id device;
    cl_int err;
    cl_context ctx = first_context(&platform, &device);
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, device, NULL, &err);
    cl_kernel k = build_kernel(ctx, device, src, "k");
    cl_mem out = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 16 * sizeof(int), NULL, &err);
    cl_mem gone = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 64, NULL, &err);
    clReleaseMemObject(gone);
    cl_sampler_properties sp[] = {CL_SAMPLER_NORMALIZED_COORDS, CL_FALSE, 0};
    cl_sampler smp = clCreateSamplerWithProperties(ctx, sp, &err);
    uint64_t garbage = 0x4141414141414141ull;
    printf("arbitrary bytes: %d\n", clSetKernelArg(k, 0, sizeof garbage, &garbage));
    printf("released buffer: %d\n", clSetKernelArg(k, 0, sizeof gone, &gone));
    printf("sampler as buffer: %d\n", clSetKernelArg(k, 0, sizeof smp, &smp));
    printf("buffer as sampler: %d\n", clSetKernelArg(k, 1, sizeof out, &out));
    printf("good buffer: %d\n", clSetKernelArg(k, 0, sizeof out, &out));
    printf("good sampler: %d\n", clSetKernelArg(k, 1, sizeof smp, &smp));
    size_t global = 16;
    printf("launch: %d\n", clEnqueueNDRangeKernel(q, k, 1, NULL, &global, NULL, 0, NULL, NULL));
    int host[16] = {0};
    printf("read: %d\n", clEnqueueReadBuffer(q, out, CL_TRUE, 0, sizeof host, host, 0, NULL, NULL));
    int ok = 1;
    for (int i = 0; i < 16; i++) ok &= host[i] == 7;
    printf("result_ok=%d\n", ok);
    return 0;
}
