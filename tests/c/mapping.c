/* Map/unmap with CL_MEM_USE_HOST_PTR and ALLOC_HOST_PTR buffers. */
#include "common.h"

static const char *SRC =
    "__kernel void inc(__global int *x) { x[get_global_id(0)] += 1; }\n";

int main(void) {
    enum { N = 4096 };
    static int host[N];
    for (int i = 0; i < N; i++) host[i] = i;
    cl_platform_id platform;
    cl_device_id device;
    cl_context ctx;
    cl_command_queue q;
    cl_int err;
    setup(&platform, &device, &ctx, &q, 0);
    cl_program prog = build(ctx, device, SRC);
    cl_kernel k = clCreateKernel(prog, "inc", &err);
    CHECK_ERR(err, "clCreateKernel");

    cl_mem use = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_USE_HOST_PTR, sizeof host, host, &err);
    CHECK_ERR(err, "USE_HOST_PTR buffer");
    void *hp = NULL;
    CHECK(clGetMemObjectInfo(use, CL_MEM_HOST_PTR, sizeof hp, &hp, NULL));
    cl_mem_flags flags;
    CHECK(clGetMemObjectInfo(use, CL_MEM_FLAGS, sizeof flags, &flags, NULL));
    size_t size;
    CHECK(clGetMemObjectInfo(use, CL_MEM_SIZE, sizeof size, &size, NULL));
    printf("host ptr matches=%d flags has USE_HOST_PTR=%d size=%zu\n", hp == (void *)host,
           (flags & CL_MEM_USE_HOST_PTR) != 0, size);

    CHECK(clSetKernelArg(k, 0, sizeof use, &use));
    size_t global = N;
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &global, NULL, 0, NULL, NULL));
    int *m = (int *)clEnqueueMapBuffer(q, use, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0, sizeof host, 0,
                                       NULL, NULL, &err);
    CHECK_ERR(err, "map USE_HOST_PTR");
    printf("mapped at host_ptr=%d m[5]=%d m[4095]=%d\n", (void *)m == (void *)host, m[5], m[4095]);
    for (int i = 0; i < N; i++) m[i] *= 10;
    CHECK(clEnqueueUnmapMemObject(q, use, m, 0, NULL, NULL));
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &global, NULL, 0, NULL, NULL));
    /* Map an interior range for reading only. */
    cl_event mev;
    int *part = (int *)clEnqueueMapBuffer(q, use, CL_FALSE, CL_MAP_READ, 100 * sizeof(int),
                                          10 * sizeof(int), 0, NULL, &mev, &err);
    CHECK_ERR(err, "map range");
    CHECK(clWaitForEvents(1, &mev));
    printf("range map offset ok=%d part[0]=%d part[9]=%d\n", (void *)part == (void *)(host + 100),
           part[0], part[9]);
    CHECK(clEnqueueUnmapMemObject(q, use, part, 0, NULL, NULL));
    clReleaseEvent(mev);

    cl_mem alloc = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_ALLOC_HOST_PTR, 256 * sizeof(int), NULL, &err);
    CHECK_ERR(err, "ALLOC_HOST_PTR buffer");
    int *w = (int *)clEnqueueMapBuffer(q, alloc, CL_TRUE, CL_MAP_WRITE_INVALIDATE_REGION, 0,
                                       256 * sizeof(int), 0, NULL, NULL, &err);
    CHECK_ERR(err, "map for write");
    for (int i = 0; i < 256; i++) w[i] = 3 * i;
    CHECK(clEnqueueUnmapMemObject(q, alloc, w, 0, NULL, NULL));
    CHECK(clSetKernelArg(k, 0, sizeof alloc, &alloc));
    global = 256;
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &global, NULL, 0, NULL, NULL));
    int out[256];
    CHECK(clEnqueueReadBuffer(q, alloc, CL_TRUE, 0, sizeof out, out, 0, NULL, NULL));
    printf("alloc buffer out[0]=%d out[255]=%d\n", out[0], out[255]);
    err = clEnqueueUnmapMemObject(q, alloc, out, 0, NULL, NULL);
    printf("unmap of unmapped pointer rejected=%d\n", err == CL_INVALID_VALUE);
    clReleaseMemObject(alloc);

    /* A buffer the host may only write: mapping it for writing shows its contents,
     * reading it is refused, and what was written lands. */
    cl_mem wo = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_HOST_WRITE_ONLY, 64 * sizeof(int), NULL, &err);
    CHECK_ERR(err, "HOST_WRITE_ONLY buffer");
    int seven = 7;
    CHECK(clEnqueueFillBuffer(q, wo, &seven, sizeof seven, 0, 64 * sizeof(int), 0, NULL, NULL));
    int *wm = (int *)clEnqueueMapBuffer(q, wo, CL_TRUE, CL_MAP_WRITE, 0, 64 * sizeof(int), 0,
                                        NULL, NULL, &err);
    CHECK_ERR(err, "map write-only buffer for writing");
    printf("write-only map shows contents: %d %d\n", wm[0], wm[63]);
    wm[5] = 50;
    CHECK(clEnqueueUnmapMemObject(q, wo, wm, 0, NULL, NULL));
    clEnqueueMapBuffer(q, wo, CL_TRUE, CL_MAP_READ, 0, 4, 0, NULL, NULL, &err);
    printf("write-only map for reading refused: %d\n", err == CL_INVALID_OPERATION);
    CHECK(clSetKernelArg(k, 0, sizeof wo, &wo));
    global = 64;
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &global, NULL, 0, NULL, NULL));
    cl_mem plain = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 64 * sizeof(int), NULL, &err);
    CHECK(clEnqueueCopyBuffer(q, wo, plain, 0, 0, 64 * sizeof(int), 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, plain, CL_TRUE, 0, 64 * sizeof(int), out, 0, NULL, NULL));
    printf("write-only buffer after map and kernel: %d %d %d\n", out[0], out[5], out[63]);
    clReleaseMemObject(plain);
    clReleaseMemObject(wo);
    clReleaseMemObject(use);
    clReleaseKernel(k);
    clReleaseProgram(prog);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    return 0;
}
