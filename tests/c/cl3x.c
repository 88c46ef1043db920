/* OpenCL 2.1/3.0 entry points: host and device timers, kernel cloning, programs from
 * IL, images with properties, sub-group info. Prints statuses, which must be the same
 * through Hira as natively whatever the host implementation supports. */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <stdio.h>
#include <string.h>

static const char *SRC = "__kernel void k(__global int *x, int v) { x[get_global_id(0)] = v; }\n";

int main(void) {
    cl_platform_id platform;
    cl_device_id device;
    cl_int err;
    if (clGetPlatformIDs(1, &platform, NULL) || clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &device, NULL)) return 2;
    cl_context ctx = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, device, NULL, &err);
    if (err) return 2;
    cl_ulong dev_t = 0, host_t = 0, host_only = 0;
    err = clGetDeviceAndHostTimer(device, &dev_t, &host_t);
    printf("clGetDeviceAndHostTimer: %d nonzero=%d\n", err, err == 0 && host_t != 0);
    err = clGetHostTimer(device, &host_only);
    printf("clGetHostTimer: %d later=%d\n", err, err == 0 && host_only >= host_t);

    cl_program p = clCreateProgramWithSource(ctx, 1, &SRC, NULL, &err);
    if (err || clBuildProgram(p, 1, &device, NULL, NULL, NULL)) return 2;
    cl_kernel k = clCreateKernel(p, "k", &err);
    cl_mem buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 16 * sizeof(int), NULL, &err);
    int v = 41;
    clSetKernelArg(k, 0, sizeof buf, &buf);
    clSetKernelArg(k, 1, sizeof v, &v);
    cl_kernel k2 = clCloneKernel(k, &err);
    printf("clCloneKernel: %d\n", err);
    if (k2) {
        size_t g = 16;
        err = clEnqueueNDRangeKernel(q, k2, 1, NULL, &g, NULL, 0, NULL, NULL);
        int out[16] = {0};
        clEnqueueReadBuffer(q, buf, CL_TRUE, 0, sizeof out, out, 0, NULL, NULL);
        printf("cloned kernel keeps its arguments: launch=%d out[15]=%d\n", err, out[15]);
        clReleaseKernel(k2);
    }
    size_t sg = 0, local = 16;
    err = clGetKernelSubGroupInfo(k, device, CL_KERNEL_MAX_SUB_GROUP_SIZE_FOR_NDRANGE, sizeof local, &local, sizeof sg, &sg, NULL);
    printf("clGetKernelSubGroupInfo: %d\n", err);

    const unsigned char not_spirv[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    cl_program il = clCreateProgramWithIL(ctx, not_spirv, sizeof not_spirv, &err);
    printf("clCreateProgramWithIL(garbage): %s\n", il == NULL && err != 0 ? "rejected" : "accepted");
    if (il) clReleaseProgram(il);

    cl_image_format fmt = {CL_RGBA, CL_UNSIGNED_INT8};
    cl_image_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.image_type = CL_MEM_OBJECT_IMAGE2D;
    desc.image_width = 4;
    desc.image_height = 2;
    unsigned char px[2][4][4];
    for (int i = 0; i < 32; i++) ((unsigned char *)px)[i] = (unsigned char)(i * 3);
    cl_mem img = clCreateImageWithProperties(ctx, NULL, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, &fmt, &desc, px, &err);
    printf("clCreateImageWithProperties: %d\n", err);
    if (img) {
        unsigned char back[2][4][4];
        size_t o[3] = {0, 0, 0}, r[3] = {4, 2, 1};
        err = clEnqueueReadImage(q, img, CL_TRUE, o, r, 0, 0, back, 0, NULL, NULL);
        printf("image round trip: %d same=%d\n", err, memcmp(px, back, sizeof px) == 0);
        clReleaseMemObject(img);
    }
    clReleaseMemObject(buf);
    clReleaseKernel(k);
    clReleaseProgram(p);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    return 0;
}
