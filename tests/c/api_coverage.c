/* Broad OpenCL 1.2 coverage: images and samplers, sub-buffers, rect/fill/copy
 * transfers, program binaries, separate compile and link, kernel queries, and
 * build and destructor callbacks. Prints one deterministic line per check. */
#define CL_USE_DEPRECATED_OPENCL_1_1_APIS
#include "common.h"
#include <pthread.h>
#include <string.h>
#include <time.h>

static const char *IMG_SRC =
    "__constant sampler_t smp = CLK_NORMALIZED_COORDS_FALSE | CLK_ADDRESS_CLAMP_TO_EDGE | CLK_FILTER_NEAREST;\n"
    "__kernel void invert(__read_only image2d_t in, __write_only image2d_t out) {\n"
    "    int2 p = (int2)(get_global_id(0), get_global_id(1));\n"
    "    uint4 v = read_imageui(in, smp, p);\n"
    "    write_imageui(out, p, (uint4)(255) - v);\n"
    "}\n"
    "__kernel void sample(__read_only image2d_t in, sampler_t s, __global uint *out) {\n"
    "    int i = get_global_id(0);\n"
    "    out[i] = read_imageui(in, s, (int2)(i, 1)).x;\n"
    "}\n";

static const char *BUF_SRC =
    "__kernel void twice(__global int *x) { x[get_global_id(0)] *= 2; }\n"
    "__kernel void sum_task(__global const int *x, __global int *out, int n) {\n"
    "    int s = 0; for (int i = 0; i < n; i++) s += x[i]; out[0] = s;\n"
    "}\n";

static const char *HDR = "#define OFFSET 7\n";
static const char *LIB_SRC =
    "#include \"offset.h\"\n"
    "int add_offset(int v) { return v + OFFSET; }\n";
static const char *MAIN_SRC =
    "int add_offset(int v);\n"
    "__kernel void apply(__global int *x) { int i = get_global_id(0); x[i] = add_offset(x[i]); }\n";

static int build_callbacks = 0;
static void CL_CALLBACK on_build(cl_program p, void *user) {
    (void)p;
    build_callbacks += *(int *)user;
}
/* The destructor callback may run on another thread once the object is deleted
 * (natively inside clReleaseMemObject, through Hira when the host has deleted it):
 * main waits for it, with a deadline, before it prints the count. */
static int destructor_calls = 0;
static pthread_mutex_t destroy_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t destroyed = PTHREAD_COND_INITIALIZER;
static void CL_CALLBACK on_destroy(cl_mem m, void *user) {
    (void)m;
    pthread_mutex_lock(&destroy_lock);
    destructor_calls += *(int *)user;
    pthread_cond_broadcast(&destroyed);
    pthread_mutex_unlock(&destroy_lock);
}

static int wait_for_destructor(void) {
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 30;
    pthread_mutex_lock(&destroy_lock);
    while (destructor_calls == 0 &&
           pthread_cond_timedwait(&destroyed, &destroy_lock, &deadline) == 0) {
    }
    int n = destructor_calls;
    pthread_mutex_unlock(&destroy_lock);
    return n;
}

int main(void) {
    cl_platform_id platform;
    cl_device_id device;
    cl_context ctx;
    cl_command_queue q;
    cl_int err;
    setup(&platform, &device, &ctx, &q, 0);

    /* Context and queue queries that return objects. */
    cl_uint ndev;
    CHECK(clGetContextInfo(ctx, CL_CONTEXT_NUM_DEVICES, sizeof ndev, &ndev, NULL));
    cl_device_id cdev;
    CHECK(clGetContextInfo(ctx, CL_CONTEXT_DEVICES, sizeof cdev, &cdev, NULL));
    cl_context qctx;
    CHECK(clGetCommandQueueInfo(q, CL_QUEUE_CONTEXT, sizeof qctx, &qctx, NULL));
    cl_platform_id dplat;
    CHECK(clGetDeviceInfo(device, CL_DEVICE_PLATFORM, sizeof dplat, &dplat, NULL));
    printf("context devices=%u same device=%d queue context same=%d device platform same=%d\n", ndev,
           cdev == device, qctx == ctx, dplat == platform);
    cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)platform, 0};
    cl_context ctx2 = clCreateContextFromType(props, CL_DEVICE_TYPE_ALL, NULL, NULL, &err);
    CHECK_ERR(err, "clCreateContextFromType");
    cl_context_properties back[3] = {0};
    CHECK(clGetContextInfo(ctx2, CL_CONTEXT_PROPERTIES, sizeof back, back, NULL));
    printf("context properties round trip=%d\n", back[0] == CL_CONTEXT_PLATFORM && back[1] == (cl_context_properties)platform);
    clReleaseContext(ctx2);

    /* Buffers: sub-buffer, fill, copy, rect transfers. */
    int host[64];
    for (int i = 0; i < 64; i++) host[i] = i;
    cl_mem buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof host, host, &err);
    CHECK_ERR(err, "buffer");
    int destroy_weight = 1;
    CHECK(clSetMemObjectDestructorCallback(buf, on_destroy, &destroy_weight));
    cl_uint align;
    CHECK(clGetDeviceInfo(device, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof align, &align, NULL));
    size_t sub_off = align / 8 <= 128 ? align / 8 : 0;
    cl_buffer_region region = {sub_off, 64};
    cl_mem sub = clCreateSubBuffer(buf, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &region, &err);
    CHECK_ERR(err, "sub-buffer");
    cl_mem parent;
    size_t off;
    CHECK(clGetMemObjectInfo(sub, CL_MEM_ASSOCIATED_MEMOBJECT, sizeof parent, &parent, NULL));
    CHECK(clGetMemObjectInfo(sub, CL_MEM_OFFSET, sizeof off, &off, NULL));
    printf("sub-buffer parent same=%d offset ok=%d\n", parent == buf, off == sub_off);
    int pattern = -1;
    CHECK(clEnqueueFillBuffer(q, sub, &pattern, sizeof pattern, 0, 64, 0, NULL, NULL));
    cl_mem copy = clCreateBuffer(ctx, CL_MEM_READ_WRITE, sizeof host, NULL, &err);
    CHECK_ERR(err, "copy buffer");
    CHECK(clEnqueueCopyBuffer(q, buf, copy, 0, 0, sizeof host, 0, NULL, NULL));
    int back_host[64];
    CHECK(clEnqueueReadBuffer(q, copy, CL_TRUE, 0, sizeof back_host, back_host, 0, NULL, NULL));
    int filled = 0;
    for (int i = 0; i < 64; i++) filled += back_host[i] == -1;
    printf("fill through sub-buffer then copy: %d of 64 ints are -1, back[63]=%d\n", filled, back_host[63]);
    /* Rect: an 8x8 int matrix; read the 3x2 block at (col 2, row 4) into a 5-wide host array. */
    int grid[64];
    for (int i = 0; i < 64; i++) grid[i] = 100 + i;
    CHECK(clEnqueueWriteBuffer(q, copy, CL_TRUE, 0, sizeof grid, grid, 0, NULL, NULL));
    int dst[5 * 4];
    for (int i = 0; i < 20; i++) dst[i] = -7;
    size_t bo[3] = {2 * sizeof(int), 4, 0}, ho[3] = {1 * sizeof(int), 1, 0}, rg[3] = {3 * sizeof(int), 2, 1};
    CHECK(clEnqueueReadBufferRect(q, copy, CL_TRUE, bo, ho, rg, 8 * sizeof(int), 0, 5 * sizeof(int), 0, dst, 0, NULL, NULL));
    printf("read rect:");
    for (int i = 0; i < 20; i++) printf(" %d", dst[i]);
    printf("\n");
    int src[4] = {1, 2, 3, 4};
    size_t wbo[3] = {0, 6, 0}, who[3] = {0, 0, 0}, wrg[3] = {2 * sizeof(int), 2, 1};
    CHECK(clEnqueueWriteBufferRect(q, copy, CL_TRUE, wbo, who, wrg, 8 * sizeof(int), 0, 2 * sizeof(int), 0, src, 0, NULL, NULL));
    size_t co[3] = {0, 0, 0}, cd[3] = {4 * sizeof(int), 0, 0}, cr[3] = {2 * sizeof(int), 1, 1};
    CHECK(clEnqueueCopyBufferRect(q, copy, copy, co, cd, cr, 8 * sizeof(int), 0, 8 * sizeof(int), 0, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, copy, CL_TRUE, 0, sizeof grid, grid, 0, NULL, NULL));
    printf("after rect writes: grid[4]=%d grid[5]=%d grid[56]=%d grid[57]=%d grid[63]=%d\n", grid[4], grid[5], grid[56], grid[57], grid[63]);

    /* Programs: binaries, built-in callbacks, kernels-in-program, task launch. */
    cl_program bp = clCreateProgramWithSource(ctx, 1, &BUF_SRC, NULL, &err);
    CHECK_ERR(err, "program");
    int build_weight = 1;
    CHECK(clBuildProgram(bp, 1, &device, NULL, on_build, &build_weight));
    size_t bin_size;
    CHECK(clGetProgramInfo(bp, CL_PROGRAM_BINARY_SIZES, sizeof bin_size, &bin_size, NULL));
    unsigned char *bin = malloc(bin_size);
    CHECK(clGetProgramInfo(bp, CL_PROGRAM_BINARIES, sizeof bin, &bin, NULL));
    cl_int bin_status;
    const unsigned char *cbin = bin;
    cl_program fromb = clCreateProgramWithBinary(ctx, 1, &device, &bin_size, &cbin, &bin_status, &err);
    CHECK_ERR(err, "program from binary");
    CHECK(clBuildProgram(fromb, 1, &device, NULL, NULL, NULL));
    printf("binary size>0=%d status=%d\n", bin_size > 0, bin_status);
    cl_kernel ks[4];
    cl_uint nk;
    CHECK(clCreateKernelsInProgram(fromb, 4, ks, &nk));
    char names[2][32];
    for (cl_uint i = 0; i < nk && i < 2; i++)
        CHECK(clGetKernelInfo(ks[i], CL_KERNEL_FUNCTION_NAME, sizeof names[i], names[i], NULL));
    int has_twice = 0, has_sum = 0;
    for (cl_uint i = 0; i < nk; i++) {
        has_twice |= strcmp(names[i], "twice") == 0;
        has_sum |= strcmp(names[i], "sum_task") == 0;
    }
    printf("kernels in program=%u twice=%d sum_task=%d\n", nk, has_twice, has_sum);
    cl_kernel sum_k = clCreateKernel(fromb, "sum_task", &err);
    CHECK_ERR(err, "sum_task");
    cl_uint nargs;
    CHECK(clGetKernelInfo(sum_k, CL_KERNEL_NUM_ARGS, sizeof nargs, &nargs, NULL));
    cl_program kprog;
    CHECK(clGetKernelInfo(sum_k, CL_KERNEL_PROGRAM, sizeof kprog, &kprog, NULL));
    cl_mem out = clCreateBuffer(ctx, CL_MEM_READ_WRITE, sizeof(int), NULL, &err);
    CHECK_ERR(err, "out");
    int n = 64;
    CHECK(clSetKernelArg(sum_k, 0, sizeof copy, &copy));
    CHECK(clSetKernelArg(sum_k, 1, sizeof out, &out));
    CHECK(clSetKernelArg(sum_k, 2, sizeof n, &n));
    CHECK(clEnqueueTask(q, sum_k, 0, NULL, NULL));
    int total;
    CHECK(clEnqueueReadBuffer(q, out, CL_TRUE, 0, sizeof total, &total, 0, NULL, NULL));
    printf("task sum=%d args=%u program same=%d build callbacks=%d\n", total, nargs, kprog == fromb, build_callbacks);
    cl_mem objs[2] = {copy, out};
    CHECK(clEnqueueMigrateMemObjects(q, 2, objs, 0, 0, NULL, NULL));

    /* Separate compilation and linking with an embedded header. */
    cl_program hdr = clCreateProgramWithSource(ctx, 1, &HDR, NULL, &err);
    CHECK_ERR(err, "header");
    cl_program lib = clCreateProgramWithSource(ctx, 1, &LIB_SRC, NULL, &err);
    CHECK_ERR(err, "lib");
    const char *hdr_name = "offset.h";
    CHECK(clCompileProgram(lib, 1, &device, NULL, 1, &hdr, &hdr_name, NULL, NULL));
    cl_program mainp = clCreateProgramWithSource(ctx, 1, &MAIN_SRC, NULL, &err);
    CHECK_ERR(err, "main");
    CHECK(clCompileProgram(mainp, 1, &device, NULL, 0, NULL, NULL, NULL, NULL));
    cl_program parts[2] = {lib, mainp};
    cl_program linked = clLinkProgram(ctx, 1, &device, NULL, 2, parts, NULL, NULL, &err);
    CHECK_ERR(err, "link");
    cl_kernel apply = clCreateKernel(linked, "apply", &err);
    CHECK_ERR(err, "apply");
    CHECK(clSetKernelArg(apply, 0, sizeof copy, &copy));
    size_t g64 = 64;
    CHECK(clEnqueueNDRangeKernel(q, apply, 1, NULL, &g64, NULL, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, copy, CL_TRUE, 0, sizeof grid, grid, 0, NULL, NULL));
    printf("linked kernel: grid[4]=%d grid[10]=%d\n", grid[4], grid[10]);

    /* Kernel argument info needs -cl-kernel-arg-info. */
    cl_program ap = clCreateProgramWithSource(ctx, 1, &BUF_SRC, NULL, &err);
    CHECK_ERR(err, "arg-info program");
    CHECK(clBuildProgram(ap, 1, &device, "-cl-kernel-arg-info", NULL, NULL));
    cl_kernel ak = clCreateKernel(ap, "sum_task", &err);
    CHECK_ERR(err, "arg-info kernel");
    char argname[32], argtype[32];
    cl_kernel_arg_address_qualifier aq;
    CHECK(clGetKernelArgInfo(ak, 1, CL_KERNEL_ARG_NAME, sizeof argname, argname, NULL));
    CHECK(clGetKernelArgInfo(ak, 2, CL_KERNEL_ARG_TYPE_NAME, sizeof argtype, argtype, NULL));
    CHECK(clGetKernelArgInfo(ak, 0, CL_KERNEL_ARG_ADDRESS_QUALIFIER, sizeof aq, &aq, NULL));
    printf("arg info: name=%s type=%s global=%d\n", argname, argtype, aq == CL_KERNEL_ARG_ADDRESS_GLOBAL);
    err = clGetKernelArgInfo(ak, 9, CL_KERNEL_ARG_NAME, sizeof argname, argname, NULL);
    printf("arg info out of range: %s\n", err == CL_INVALID_ARG_INDEX ? "CL_INVALID_ARG_INDEX" : "unexpected");

    /* Images. */
    cl_bool has_images;
    CHECK(clGetDeviceInfo(device, CL_DEVICE_IMAGE_SUPPORT, sizeof has_images, &has_images, NULL));
    if (has_images) {
        cl_uint nf;
        CHECK(clGetSupportedImageFormats(ctx, CL_MEM_READ_WRITE, CL_MEM_OBJECT_IMAGE2D, 0, NULL, &nf));
        cl_image_format *fmts = malloc(nf * sizeof *fmts);
        CHECK(clGetSupportedImageFormats(ctx, CL_MEM_READ_WRITE, CL_MEM_OBJECT_IMAGE2D, nf, fmts, NULL));
        int rgba_u8 = 0;
        for (cl_uint i = 0; i < nf; i++)
            rgba_u8 |= fmts[i].image_channel_order == CL_RGBA && fmts[i].image_channel_data_type == CL_UNSIGNED_INT8;
        printf("image formats>0=%d RGBA/UINT8=%d\n", nf > 0, rgba_u8);
        free(fmts);
        enum { W = 8, H = 4 };
        unsigned char pix[H][W][4];
        for (int y = 0; y < H; y++)
            for (int x = 0; x < W; x++)
                for (int c = 0; c < 4; c++) pix[y][x][c] = (unsigned char)(y * 40 + x * 4 + c);
        cl_image_format fmt = {CL_RGBA, CL_UNSIGNED_INT8};
        cl_image_desc desc;
        memset(&desc, 0, sizeof desc);
        desc.image_type = CL_MEM_OBJECT_IMAGE2D;
        desc.image_width = W;
        desc.image_height = H;
        cl_mem img = clCreateImage(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, &fmt, &desc, pix, &err);
        CHECK_ERR(err, "image");
        cl_mem img2 = clCreateImage2D(ctx, CL_MEM_READ_WRITE, &fmt, W, H, 0, NULL, &err);
        CHECK_ERR(err, "image2d");
        size_t esz, w;
        CHECK(clGetImageInfo(img, CL_IMAGE_ELEMENT_SIZE, sizeof esz, &esz, NULL));
        CHECK(clGetImageInfo(img, CL_IMAGE_WIDTH, sizeof w, &w, NULL));
        printf("image element size=%zu width=%zu\n", esz, w);
        cl_program ip = build(ctx, device, IMG_SRC);
        cl_kernel inv = clCreateKernel(ip, "invert", &err);
        CHECK_ERR(err, "invert");
        CHECK(clSetKernelArg(inv, 0, sizeof img, &img));
        CHECK(clSetKernelArg(inv, 1, sizeof img2, &img2));
        size_t g2[2] = {W, H};
        CHECK(clEnqueueNDRangeKernel(q, inv, 2, NULL, g2, NULL, 0, NULL, NULL));
        /* Read a 3x2 region into a host array with a 5-pixel row pitch. */
        unsigned char got[2][5][4];
        memset(got, 0xEE, sizeof got);
        size_t org[3] = {1, 1, 0}, reg[3] = {3, 2, 1};
        CHECK(clEnqueueReadImage(q, img2, CL_TRUE, org, reg, 5 * 4, 0, got, 0, NULL, NULL));
        printf("read image: %d %d %d untouched=%d\n", got[0][0][0], got[0][2][3], got[1][1][1], got[0][4][0] == 0xEE);
        unsigned char patch[2][2][4] = {{{1, 2, 3, 4}, {5, 6, 7, 8}}, {{9, 10, 11, 12}, {13, 14, 15, 16}}};
        size_t po[3] = {6, 2, 0}, pr[3] = {2, 2, 1};
        CHECK(clEnqueueWriteImage(q, img2, CL_TRUE, po, pr, 0, 0, patch, 0, NULL, NULL));
        cl_uint4 color = {{200, 201, 202, 203}};
        size_t fo[3] = {0, 0, 0}, fr[3] = {1, 1, 1};
        CHECK(clEnqueueFillImage(q, img2, &color, fo, fr, 0, NULL, NULL));
        cl_mem img3 = clCreateImage(ctx, CL_MEM_READ_WRITE, &fmt, &desc, NULL, &err);
        CHECK_ERR(err, "image3");
        size_t zero[3] = {0, 0, 0}, all[3] = {W, H, 1};
        CHECK(clEnqueueCopyImage(q, img2, img3, zero, zero, all, 0, NULL, NULL));
        cl_mem flat = clCreateBuffer(ctx, CL_MEM_READ_WRITE, W * H * 4, NULL, &err);
        CHECK_ERR(err, "flat");
        CHECK(clEnqueueCopyImageToBuffer(q, img3, flat, zero, all, 0, 0, NULL, NULL));
        unsigned char flat_host[H][W][4];
        CHECK(clEnqueueReadBuffer(q, flat, CL_TRUE, 0, sizeof flat_host, flat_host, 0, NULL, NULL));
        printf("copied image: fill=%d,%d patch=%d,%d inverted=%d\n", flat_host[0][0][0], flat_host[0][0][3],
               flat_host[2][6][0], flat_host[3][7][3], flat_host[1][1][0]);
        CHECK(clEnqueueCopyBufferToImage(q, flat, img, 0, zero, all, 0, NULL, NULL));
        size_t rp, sp;
        unsigned char *mp = clEnqueueMapImage(q, img3, CL_TRUE, CL_MAP_READ, org, reg, &rp, &sp, 0, NULL, NULL, &err);
        CHECK_ERR(err, "map image");
        printf("mapped image: row pitch>=12=%d first=%d\n", rp >= 12, mp[0]);
        CHECK(clEnqueueUnmapMemObject(q, img3, mp, 0, NULL, NULL));
        cl_sampler smp = clCreateSampler(ctx, CL_FALSE, CL_ADDRESS_CLAMP_TO_EDGE, CL_FILTER_NEAREST, &err);
        CHECK_ERR(err, "sampler");
        cl_addressing_mode am;
        CHECK(clGetSamplerInfo(smp, CL_SAMPLER_ADDRESSING_MODE, sizeof am, &am, NULL));
        cl_kernel sk = clCreateKernel(ip, "sample", &err);
        CHECK_ERR(err, "sample");
        cl_mem souts = clCreateBuffer(ctx, CL_MEM_WRITE_ONLY, W * sizeof(cl_uint), NULL, &err);
        CHECK_ERR(err, "sample out");
        CHECK(clSetKernelArg(sk, 0, sizeof img3, &img3));
        CHECK(clSetKernelArg(sk, 1, sizeof smp, &smp));
        CHECK(clSetKernelArg(sk, 2, sizeof souts, &souts));
        size_t gw = W;
        CHECK(clEnqueueNDRangeKernel(q, sk, 1, NULL, &gw, NULL, 0, NULL, NULL));
        cl_uint sv[W];
        CHECK(clEnqueueReadBuffer(q, souts, CL_TRUE, 0, sizeof sv, sv, 0, NULL, NULL));
        printf("sampler clamp=%d sampled=%u,%u\n", am == CL_ADDRESS_CLAMP_TO_EDGE, sv[0], sv[7]);
        clReleaseMemObject(souts);
        clReleaseKernel(sk);
        clReleaseSampler(smp);
        clReleaseMemObject(flat);
        clReleaseMemObject(img3);
        clReleaseKernel(inv);
        clReleaseProgram(ip);
        clReleaseMemObject(img2);
        clReleaseMemObject(img);
    } else {
        printf("no image support\n");
    }

    /* Deprecated 1.1 entry points still used by older programs (PoCL aborts in
     * clEnqueueWaitForEvents, so it is not exercised here). */
    cl_event mk;
    CHECK(clEnqueueMarker(q, &mk));
    CHECK(clWaitForEvents(1, &mk));
    CHECK(clEnqueueBarrier(q));
    CHECK(clFinish(q));
    clReleaseEvent(mk);

    /* Errors the API defines. */
    err = clSetKernelArg(sum_k, 7, sizeof n, &n);
    printf("bad arg index: %s\n", err == CL_INVALID_ARG_INDEX ? "CL_INVALID_ARG_INDEX" : "unexpected");
    err = clEnqueueWriteBuffer(q, out, CL_TRUE, 64, sizeof n, &n, 0, NULL, NULL);
    printf("blocking write past the end: %s\n", err == CL_INVALID_VALUE ? "CL_INVALID_VALUE" : "unexpected");
    size_t bad_org[3] = {0, 9, 0}, bad_reg[3] = {sizeof(int), 1, 1};
    err = clEnqueueWriteBufferRect(q, copy, CL_TRUE, bad_org, who, bad_reg, 8 * sizeof(int), 0, 0, 0, src, 0, NULL, NULL);
    printf("blocking rect write past the end: %s\n", err == CL_INVALID_VALUE ? "CL_INVALID_VALUE" : "unexpected");
    err = clReleaseMemObject(NULL);
    printf("release NULL mem: %s\n", err == CL_INVALID_MEM_OBJECT ? "CL_INVALID_MEM_OBJECT" : "unexpected");
    err = clGetDeviceInfo(device, 0xFFFF, 0, NULL, NULL);
    printf("bad device param: %s\n", err == CL_INVALID_VALUE ? "CL_INVALID_VALUE" : "unexpected");

    clReleaseKernel(ak);
    clReleaseProgram(ap);
    clReleaseKernel(apply);
    clReleaseProgram(linked);
    clReleaseProgram(mainp);
    clReleaseProgram(lib);
    clReleaseProgram(hdr);
    clReleaseMemObject(out);
    clReleaseKernel(sum_k);
    for (cl_uint i = 0; i < nk; i++) clReleaseKernel(ks[i]);
    clReleaseProgram(fromb);
    clReleaseProgram(bp);
    free(bin);
    clReleaseMemObject(copy);
    clReleaseMemObject(sub);
    clReleaseMemObject(buf);
    clFinish(q);
    printf("destructor callbacks=%d\n", wait_for_destructor());
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    return 0;
}
