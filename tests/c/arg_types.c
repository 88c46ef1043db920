/* Kernels whose argument types the shim learns from the host: short names (asked
 * all at once) and a struct whose type name is longer than the room the shim first
 * gives the answer (asked one query at a time). Values of the wrong size get the
 * native codes; the kernels compute. */
#include "common.h"

/* The struct's name is made at run time: longer than the room the shim first gives
 * the answer for any kernel (32 arguments' worth, 2 KiB). */
#define NAME_LEN 2500
static const char *SRC_FORMAT =
    "typedef struct { int a; float b; } %s;\n"
    "__kernel void scale(__global float *x, float f, uint n) {\n"
    "    size_t i = get_global_id(0);\n"
    "    if (i < n) x[i] *= f;\n"
    "}\n"
    "__kernel void shift(__global int *x, %s s) {\n"
    "    size_t i = get_global_id(0);\n"
    "    x[i] += s.a + (int)s.b;\n"
    "}\n";

typedef struct {
    cl_int a;
    cl_float b;
} pair_t;

int main(void) {
    cl_platform_id platform;
    cl_device_id device;
    cl_context ctx;
    cl_command_queue q;
    cl_int err;
    setup(&platform, &device, &ctx, &q, 0);
    static char name[NAME_LEN + 1], src[2 * NAME_LEN + 512];
    for (int i = 0; i < NAME_LEN; i++)
        name[i] = "a_long_struct_name_"[i % 19];
    snprintf(src, sizeof src, SRC_FORMAT, name, name);
    cl_program prog = build(ctx, device, src);
    cl_kernel scale = clCreateKernel(prog, "scale", &err);
    CHECK_ERR(err, "clCreateKernel scale");
    cl_kernel shift = clCreateKernel(prog, "shift", &err);
    CHECK_ERR(err, "clCreateKernel shift");
    float xs[64];
    int xi[64];
    for (int i = 0; i < 64; i++) {
        xs[i] = (float)i;
        xi[i] = i;
    }
    cl_mem bs = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof xs, xs, &err);
    CHECK_ERR(err, "clCreateBuffer");
    cl_mem bi = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof xi, xi, &err);
    CHECK_ERR(err, "clCreateBuffer");
    float f = 1.5f;
    cl_uint n = 64;
    short wrong = 2;
    printf("wrong-sized value: %d\n", clSetKernelArg(scale, 1, sizeof wrong, &wrong));
    CHECK(clSetKernelArg(scale, 0, sizeof bs, &bs));
    CHECK(clSetKernelArg(scale, 1, sizeof f, &f));
    CHECK(clSetKernelArg(scale, 2, sizeof n, &n));
    pair_t p = {3, 4.0f};
    printf("wrong-sized struct: %d\n", clSetKernelArg(shift, 1, 2, &p));
    CHECK(clSetKernelArg(shift, 0, sizeof bi, &bi));
    CHECK(clSetKernelArg(shift, 1, sizeof p, &p));
    size_t global = 64;
    CHECK(clEnqueueNDRangeKernel(q, scale, 1, NULL, &global, NULL, 0, NULL, NULL));
    CHECK(clEnqueueNDRangeKernel(q, shift, 1, NULL, &global, NULL, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, bs, CL_TRUE, 0, sizeof xs, xs, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, bi, CL_TRUE, 0, sizeof xi, xi, 0, NULL, NULL));
    double sum = 0;
    long isum = 0;
    for (int i = 0; i < 64; i++) {
        sum += xs[i];
        isum += xi[i];
    }
    printf("scaled sum %.1f, shifted sum %ld\n", sum, isum);
    clReleaseMemObject(bs);
    clReleaseMemObject(bi);
    clReleaseKernel(scale);
    clReleaseKernel(shift);
    clReleaseProgram(prog);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    return 0;
}
