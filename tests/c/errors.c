/* Invalid-argument calls whose return codes must be identical natively and through
 * Hira: every line is "case: status". Run with "sync" as the first argument to end
 * with a clFinish, which must also match. Each case is independent of the others'
 * outcome, so one wrong code does not hide the next. */
#include "cl30.h"
#include <stdio.h>
#include <string.h>

static const char *src =
    "__kernel void k(__global float *out, int n, __local float *scratch,\n"
    "                __constant float *c, float4 v) {\n"
    "    size_t i = get_global_id(0);\n"
    "    scratch[get_local_id(0)] = c[0] + v.x;\n"
    "    barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    if (i < (size_t)n) out[i] = scratch[get_local_id(0)];\n"
    "}\n"
    "__kernel void s(__global int *out, sampler_t smp) { out[0] = 1; }\n";

#define REPORT(name, expr) printf("%s: %d\n", name, (int)(expr))

int main(int argc, char **argv) {
    cl_platform_id platform;
    cl_device_id device;
    cl_int err;
    cl_context ctx = first_context(&platform, &device);
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, device, NULL, &err);
    if (err != CL_SUCCESS) return 2;
    cl_program prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
    if (err != CL_SUCCESS) return 2;
    /* Options, but not -cl-kernel-arg-info: the host may withhold argument
     * information from the application (Hira's API server builds with it). */
    REPORT("build", clBuildProgram(prog, 1, &device, "-DUNUSED=1", NULL, NULL));
    cl_kernel k = clCreateKernel(prog, "k", &err);
    REPORT("create kernel", err);
    cl_kernel ks = clCreateKernel(prog, "s", &err);
    REPORT("create kernel s", err);
    char arg_name[64];
    REPORT("arg info: name", clGetKernelArgInfo(k, 0, CL_KERNEL_ARG_NAME, sizeof arg_name, arg_name, NULL));
    cl_kernel_arg_address_qualifier aq = 0;
    REPORT("arg info: address qualifier",
           clGetKernelArgInfo(k, 0, CL_KERNEL_ARG_ADDRESS_QUALIFIER, sizeof aq, &aq, NULL));
    REPORT("arg info: index out of range",
           clGetKernelArgInfo(k, 9, CL_KERNEL_ARG_ADDRESS_QUALIFIER, sizeof aq, &aq, NULL));
    {
        /* Enqueued with no argument set: the error comes back from the call. */
        cl_kernel fresh = clCreateKernel(prog, "k", &err);
        size_t gws = 16;
        REPORT("enqueue with no arguments set", clEnqueueNDRangeKernel(q, fresh, 1, NULL, &gws, NULL, 0, NULL, NULL));
        clReleaseKernel(fresh);
    }
    float data[64] = {0};
    cl_mem buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 256, NULL, &err);
    REPORT("create buffer", err);
    cl_mem cbuf = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, 256, data, &err);
    REPORT("create constant buffer", err);

    /* An info value of no size: the context was made without properties. */
    size_t props_size = 99;
    REPORT("context properties: size query", clGetContextInfo(ctx, CL_CONTEXT_PROPERTIES, 0, NULL, &props_size));
    printf("context properties: size %zu\n", props_size);

    /* Buffer creation. */
    cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 64, data, &err);
    REPORT("create buffer: host_ptr without USE or COPY", err);
    if (m) clReleaseMemObject(m);
    m = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, 64, NULL, &err);
    REPORT("create buffer: COPY without host_ptr", err);
    if (m) clReleaseMemObject(m);
    m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 0, NULL, &err);
    REPORT("create buffer: size 0", err);
    if (m) clReleaseMemObject(m);
    m = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_READ_ONLY, 64, NULL, &err);
    REPORT("create buffer: READ_WRITE and READ_ONLY", err);
    if (m) clReleaseMemObject(m);

    /* Kernel arguments. */
    int n = 64;
    REPORT("set arg: wrong size for int", clSetKernelArg(k, 1, 2, &n));
    REPORT("set arg: NULL value for int", clSetKernelArg(k, 1, sizeof(int), NULL));
    REPORT("set arg: index past the end", clSetKernelArg(k, 9, sizeof(int), &n));
    REPORT("set arg: local with a value", clSetKernelArg(k, 2, 64, data));
    REPORT("set arg: local of size 0", clSetKernelArg(k, 2, 0, NULL));
    REPORT("set arg: buffer with wrong size", clSetKernelArg(k, 0, 4, &buf));
    float v4[4] = {1, 2, 3, 4};
    REPORT("set arg: float4 as 8 bytes", clSetKernelArg(k, 4, 8, v4));

    /* Launches before every argument is set. */
    size_t global = 64, local = 16, big_local = 1u << 20, odd_global = 65;
    REPORT("launch: unset arguments", clEnqueueNDRangeKernel(q, k, 1, NULL, &global, &local, 0, NULL, NULL));
    REPORT("set arg 0", clSetKernelArg(k, 0, sizeof(cl_mem), &buf));
    REPORT("set arg 1", clSetKernelArg(k, 1, sizeof(int), &n));
    REPORT("set arg 2", clSetKernelArg(k, 2, 16 * sizeof(float), NULL));
    REPORT("set arg 3", clSetKernelArg(k, 3, sizeof(cl_mem), &cbuf));
    REPORT("launch: one argument still unset", clEnqueueNDRangeKernel(q, k, 1, NULL, &global, &local, 0, NULL, NULL));
    REPORT("set arg 4", clSetKernelArg(k, 4, sizeof v4, v4));
    REPORT("launch: work_dim 0", clEnqueueNDRangeKernel(q, k, 0, NULL, &global, &local, 0, NULL, NULL));
    REPORT("launch: work_dim 4", clEnqueueNDRangeKernel(q, k, 4, NULL, &global, &local, 0, NULL, NULL));
    REPORT("launch: local does not divide global", clEnqueueNDRangeKernel(q, k, 1, NULL, &odd_global, &local, 0, NULL, NULL));
    REPORT("launch: local too large", clEnqueueNDRangeKernel(q, k, 1, NULL, &global, &big_local, 0, NULL, NULL));
    REPORT("launch: NULL global size", clEnqueueNDRangeKernel(q, k, 1, NULL, NULL, &local, 0, NULL, NULL));
    REPORT("launch: ok", clEnqueueNDRangeKernel(q, k, 1, NULL, &global, &local, 0, NULL, NULL));
    size_t one = 1;
    REPORT("launch: sampler kernel with unset sampler", clEnqueueNDRangeKernel(q, ks, 1, NULL, &one, NULL, 0, NULL, NULL));

    /* Transfers. */
    REPORT("write: non-blocking past the end", clEnqueueWriteBuffer(q, buf, CL_FALSE, 200, 100, data, 0, NULL, NULL));
    REPORT("write: blocking past the end", clEnqueueWriteBuffer(q, buf, CL_TRUE, 200, 100, data, 0, NULL, NULL));
    REPORT("write: NULL pointer", clEnqueueWriteBuffer(q, buf, CL_FALSE, 0, 16, NULL, 0, NULL, NULL));
    REPORT("read: past the end", clEnqueueReadBuffer(q, buf, CL_TRUE, 250, 16, data, 0, NULL, NULL));
    REPORT("copy: overlapping", clEnqueueCopyBuffer(q, buf, buf, 0, 16, 64, 0, NULL, NULL));
    REPORT("copy: past the end", clEnqueueCopyBuffer(q, buf, cbuf, 0, 200, 100, 0, NULL, NULL));
    REPORT("copy: disjoint in one buffer", clEnqueueCopyBuffer(q, buf, buf, 0, 128, 64, 0, NULL, NULL));
    int pattern = 7;
    REPORT("fill: pattern size 3", clEnqueueFillBuffer(q, buf, &pattern, 3, 0, 12, 0, NULL, NULL));
    REPORT("fill: offset not a multiple", clEnqueueFillBuffer(q, buf, &pattern, 4, 2, 8, 0, NULL, NULL));
    REPORT("fill: past the end", clEnqueueFillBuffer(q, buf, &pattern, 4, 252, 8, 0, NULL, NULL));
    REPORT("fill: ok", clEnqueueFillBuffer(q, buf, &pattern, 4, 0, 64, 0, NULL, NULL));

    /* Host access flags. */
    cl_mem ro = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_HOST_READ_ONLY, 64, NULL, &err);
    REPORT("create buffer: host read only", err);
    cl_mem wo = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_HOST_WRITE_ONLY, 64, NULL, &err);
    REPORT("create buffer: host write only", err);
    REPORT("write: host-read-only buffer", clEnqueueWriteBuffer(q, ro, CL_FALSE, 0, 16, data, 0, NULL, NULL));
    REPORT("read: host-write-only buffer", clEnqueueReadBuffer(q, wo, CL_TRUE, 0, 16, data, 0, NULL, NULL));
    REPORT("write: host-write-only buffer", clEnqueueWriteBuffer(q, wo, CL_TRUE, 0, 16, data, 0, NULL, NULL));
    if (ro) clReleaseMemObject(ro);
    if (wo) clReleaseMemObject(wo);

    /* Property lists whose values are zero. */
    cl_queue_properties qp[] = {CL_QUEUE_PROPERTIES, 0, 0};
    cl_command_queue q2 = clCreateCommandQueueWithProperties(ctx, device, qp, &err);
    REPORT("queue: properties with value 0", err);
    if (q2) clReleaseCommandQueue(q2);
    cl_queue_properties qbad[] = {0x7777, 1, 0};
    q2 = clCreateCommandQueueWithProperties(ctx, device, qbad, &err);
    REPORT("queue: unknown property", err);
    if (q2) clReleaseCommandQueue(q2);
    cl_sampler_properties sp[] = {CL_SAMPLER_NORMALIZED_COORDS, CL_FALSE, 0};
    cl_sampler smp = clCreateSamplerWithProperties(ctx, sp, &err);
    REPORT("sampler: normalized coords false", err);
    if (smp) {
        REPORT("set arg: sampler", clSetKernelArg(ks, 1, sizeof smp, &smp));
        clReleaseSampler(smp);
    }
    cl_sampler_properties sp2[] = {CL_SAMPLER_NORMALIZED_COORDS, CL_TRUE, CL_SAMPLER_ADDRESSING_MODE,
                                   CL_ADDRESS_CLAMP, CL_SAMPLER_FILTER_MODE, CL_FILTER_NEAREST, 0};
    smp = clCreateSamplerWithProperties(ctx, sp2, &err);
    REPORT("sampler: three properties", err);
    if (smp) clReleaseSampler(smp);

    if (argc > 1 && strcmp(argv[1], "sync") == 0) REPORT("finish", clFinish(q));
    clReleaseKernel(k);
    clReleaseKernel(ks);
    clReleaseProgram(prog);
    clReleaseMemObject(buf);
    clReleaseMemObject(cbuf);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    return 0;
}
