/* State that a migration must carry, on command, for the migration tests: one
 * command per line on stdin, one answer per line on stdout, so a test can move the
 * session between commands (or while one runs) and compare every answer with a
 * native run's.
 *
 * Made at start, before "ready": a context; an in-order queue with profiling; a
 * program (built with options, then released while its kernels live) with three
 * kernels whose arguments are set once; buffers made from host data, written by a
 * command, written only by kernels (host no-access), and a sub-buffer; a 2D image
 * made from host data; a sampler; a user event completed; a retained event of a
 * finished command; a memory-object destructor callback.
 *
 *   step       scale(a, 1.5) + add(a, b) -> c, read c through the sub-buffer too
 *              -> "step N SUM SUBSUM" (N counts steps; the sums depend on every step)
 *   loop K     K steps without answering in between -> "loop SUM"
 *   check      the kept event's status and command type, the user event's status,
 *              the image read back, a copy of the no-access buffer, the kernel's
 *              argument count, the program's build options
 *              -> "check ..."
 *   pend       makes a user event and gives it no status yet -> "pend ok"
 *   go         launches scale(a) behind that event, completes the event, waits
 *              -> "go SUM"
 *   unmap      unmaps a buffer mapped for writing at start (filled then) and reads
 *              it back; likewise a 256 KiB buffer and a 128 KiB image mapped at start
 *              (objects this large live in Hira's data window, where a map is the
 *              host's own) -> "unmap SUM WIDE IMAGE"
 *   devices    where the context's device is in the platform's device list now
 *              -> "devices INDEX of COUNT"
 *   split      partitions the device equally and releases those sub-devices, then
 *              partitions it by counts 1,1 and makes a context, a queue, a program
 *              and a buffer on the second sub-device -> "split N"
 *   sub        a kernel on that sub-device's queue, and what the sub-device says of
 *              itself -> "sub SUM parent P units U queue Q"
 *   record     records add(a, b) -> c and a fill of the sub-buffer's half of c in a
 *              command buffer (cl_khr_command_buffer) and finalizes it -> "record ok"
 *   replay     runs the command buffer and reads c -> "replay SUM"
 *   rearg      sets add's last argument again -> "rearg ok"
 *   end        releases everything and waits for the destructor callback -> "end ok"
 */
#include "cl30.h"
#include <CL/cl_ext.h>
#include <stdio.h>
#include <sched.h>
#include <string.h>

#define N 4096

static const char *src =
    "__kernel void scale(__global float *a, float f, __global float *hidden) {\n"
    "    size_t i = get_global_id(0);\n"
    "    a[i] = a[i] * f - (float)(i % 7);\n"
    "    hidden[i] += a[i] * 0.25f;\n"
    "}\n"
    "__kernel void add(__global const float *a, __global const float *b, __global float *c) {\n"
    "    size_t i = get_global_id(0);\n"
    "    c[i] = a[i] + b[i] * SCALE;\n"
    "}\n"
    "__kernel void sample(__read_only image2d_t img, sampler_t s, __global uint *out) {\n"
    "    int x = get_global_id(0), y = get_global_id(1);\n"
    "    uint4 p = read_imageui(img, s, (int2)(x, y));\n"
    "    out[y * 8 + x] = p.x + 2 * p.y + 3 * p.z + 5 * p.w;\n"
    "}\n";

static int destroyed = 0;

static void CL_CALLBACK on_destroy(cl_mem m, void *data) {
    (void)m;
    __atomic_store_n((int *)data, 1, __ATOMIC_RELEASE);
}

static double sum(const float *v, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += v[i] * (double)((i % 13) + 1);
    return s;
}

#define CHECK(x)                                                                   \
    do {                                                                           \
        cl_int e_ = (x);                                                           \
        if (e_ != CL_SUCCESS) {                                                    \
            printf("error %d at line %d\n", e_, __LINE__);                         \
            return 3;                                                              \
        }                                                                          \
    } while (0)

int main(void) {
    cl_platform_id platform;
    cl_device_id device;
    cl_int err;
    cl_context ctx = first_context(&platform, &device);
    cl_queue_properties props[] = {CL_QUEUE_PROPERTIES, CL_QUEUE_PROFILING_ENABLE, 0};
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, device, props, &err);
    CHECK(err);
    cl_program prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
    CHECK(err);
    CHECK(clBuildProgram(prog, 1, &device, "-DSCALE=0.5f", NULL, NULL));
    cl_kernel scale = clCreateKernel(prog, "scale", &err);
    CHECK(err);
    cl_kernel add = clCreateKernel(prog, "add", &err);
    CHECK(err);
    cl_kernel sample = clCreateKernel(prog, "sample", &err);
    CHECK(err);
    CHECK(clReleaseProgram(prog));

    static float host_a[N], host_b[N], out[N];
    for (int i = 0; i < N; i++) {
        host_a[i] = (float)(i % 101) * 0.5f;
        host_b[i] = (float)((i * 7) % 53);
    }
    cl_mem a = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof host_a, host_a, &err);
    CHECK(err);
    cl_mem b = clCreateBuffer(ctx, CL_MEM_READ_ONLY, sizeof host_b, NULL, &err);
    CHECK(err);
    CHECK(clEnqueueWriteBuffer(q, b, CL_TRUE, 0, sizeof host_b, host_b, 0, NULL, NULL));
    cl_mem c = clCreateBuffer(ctx, CL_MEM_WRITE_ONLY | CL_MEM_HOST_READ_ONLY, sizeof out, NULL, &err);
    CHECK(err);
    cl_mem hidden = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_HOST_NO_ACCESS, sizeof out, NULL, &err);
    CHECK(err);
    float zero = 0;
    CHECK(clEnqueueFillBuffer(q, hidden, &zero, sizeof zero, 0, sizeof out, 0, NULL, NULL));
    cl_buffer_region half = {sizeof out / 2, sizeof out / 2};
    cl_mem upper = clCreateSubBuffer(c, CL_MEM_WRITE_ONLY, CL_BUFFER_CREATE_TYPE_REGION, &half, &err);
    CHECK(err);
    CHECK(clSetMemObjectDestructorCallback(b, on_destroy, &destroyed));

    cl_image_format fmt = {CL_RGBA, CL_UNSIGNED_INT8};
    cl_image_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.image_type = CL_MEM_OBJECT_IMAGE2D;
    desc.image_width = 8;
    desc.image_height = 8;
    unsigned char pixels[8 * 8 * 4];
    for (int i = 0; i < (int)sizeof pixels; i++) pixels[i] = (unsigned char)(i * 37 + 11);
    cl_mem img = clCreateImage(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, &fmt, &desc, pixels, &err);
    CHECK(err);
    cl_sampler_properties sp[] = {CL_SAMPLER_NORMALIZED_COORDS, CL_FALSE, CL_SAMPLER_ADDRESSING_MODE,
                                  CL_ADDRESS_CLAMP_TO_EDGE, CL_SAMPLER_FILTER_MODE, CL_FILTER_NEAREST, 0};
    cl_sampler smp = clCreateSamplerWithProperties(ctx, sp, &err);
    CHECK(err);
    cl_mem texels = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 64 * sizeof(cl_uint), NULL, &err);
    CHECK(err);

    float f = 1.5f;
    CHECK(clSetKernelArg(scale, 0, sizeof a, &a));
    CHECK(clSetKernelArg(scale, 1, sizeof f, &f));
    CHECK(clSetKernelArg(scale, 2, sizeof hidden, &hidden));
    CHECK(clSetKernelArg(add, 0, sizeof a, &a));
    CHECK(clSetKernelArg(add, 1, sizeof b, &b));
    CHECK(clSetKernelArg(add, 2, sizeof c, &c));
    CHECK(clSetKernelArg(sample, 0, sizeof img, &img));
    CHECK(clSetKernelArg(sample, 1, sizeof smp, &smp));
    CHECK(clSetKernelArg(sample, 2, sizeof texels, &texels));

    cl_mem mapped = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 1024 * sizeof(float), NULL, &err);
    CHECK(err);
    float *view = clEnqueueMapBuffer(q, mapped, CL_TRUE, CL_MAP_WRITE_INVALIDATE_REGION, 0,
                                     1024 * sizeof(float), 0, NULL, NULL, &err);
    CHECK(err);
    for (int i = 0; i < 1024; i++) view[i] = (float)(i * 3 % 17);
    enum { WIDE = 65536, IW = 256, IH = 128 };
    cl_mem wide = clCreateBuffer(ctx, CL_MEM_READ_WRITE, WIDE * sizeof(float), NULL, &err);
    CHECK(err);
    CHECK(clEnqueueFillBuffer(q, wide, &(float){0.5f}, sizeof(float), 0, WIDE * sizeof(float), 0,
                              NULL, NULL));
    float *wide_view = clEnqueueMapBuffer(q, wide, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0,
                                          WIDE * sizeof(float), 0, NULL, NULL, &err);
    CHECK(err);
    for (int i = 0; i < WIDE; i += 7) wide_view[i] += (float)(i % 13);
    static unsigned char big_pixels[IW * IH * 4];
    for (int i = 0; i < IW * IH * 4; i++) big_pixels[i] = (unsigned char)(i * 7 % 251);
    cl_image_format rgba = {CL_RGBA, CL_UNSIGNED_INT8};
    cl_image_desc big_desc = {.image_type = CL_MEM_OBJECT_IMAGE2D, .image_width = IW, .image_height = IH};
    cl_mem big = clCreateImage(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, &rgba, &big_desc, big_pixels, &err);
    CHECK(err);
    size_t big_origin[3] = {16, 8, 0}, big_region[3] = {64, 32, 1}, big_pitch;
    unsigned char *big_view = clEnqueueMapImage(q, big, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, big_origin,
                                                 big_region, &big_pitch, NULL, 0, NULL, NULL, &err);
    CHECK(err);
    for (int y = 0; y < 32; y++) big_view[y * big_pitch + y] ^= 0x5a;
    cl_event pend = NULL;

    cl_event user = clCreateUserEvent(ctx, &err);
    CHECK(err);
    CHECK(clSetUserEventStatus(user, CL_COMPLETE));
    cl_event kept;
    size_t n = N;
    CHECK(clEnqueueNDRangeKernel(q, add, 1, NULL, &n, NULL, 1, &user, &kept));
    CHECK(clWaitForEvents(1, &kept));

    cl_device_id subs[2] = {0};
    cl_context sctx = NULL;
    cl_command_queue sq = NULL;
    cl_kernel sk = NULL;
    cl_mem sbuf = NULL;
    cl_command_buffer_khr cbuf = NULL;
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("ready\n");
    unsigned steps = 0;
    char line[128];
    while (fgets(line, sizeof line, stdin)) {
        char cmd[32];
        unsigned long k = 0;
        if (sscanf(line, "%31s %lu", cmd, &k) < 1) return 2;
        if (!strcmp(cmd, "step") || !strcmp(cmd, "loop")) {
            unsigned long times = strcmp(cmd, "loop") ? 1 : k;
            double total = 0, subtotal = 0;
            for (unsigned long t = 0; t < times; t++) {
                CHECK(clEnqueueNDRangeKernel(q, scale, 1, NULL, &n, NULL, 0, NULL, NULL));
                CHECK(clEnqueueNDRangeKernel(q, add, 1, NULL, &n, NULL, 1, &user, NULL));
                CHECK(clEnqueueReadBuffer(q, c, CL_TRUE, 0, sizeof out, out, 0, NULL, NULL));
                total += sum(out, N);
                CHECK(clEnqueueReadBuffer(q, upper, CL_TRUE, 0, sizeof out / 2, out, 0, NULL, NULL));
                subtotal += sum(out, N / 2);
                steps++;
            }
            if (times == 1)
                printf("step %u %.6e %.6e\n", steps, total, subtotal);
            else
                printf("loop %.6e %.6e\n", total, subtotal);
        } else if (!strcmp(cmd, "devices")) {
            cl_device_id all[8];
            cl_uint count = 0;
            CHECK(clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 8, all, &count));
            cl_uint at = count;
            for (cl_uint i = 0; i < count && i < 8; i++)
                if (all[i] == device) at = i;
            printf("devices %u of %u\n", at, count);
        } else if (!strcmp(cmd, "split")) {
            cl_device_partition_property eq[] = {CL_DEVICE_PARTITION_EQUALLY, 1, 0};
            cl_device_id first[8];
            cl_uint made = 0;
            CHECK(clCreateSubDevices(device, eq, 8, first, &made));
            for (cl_uint i = 0; i < made; i++) CHECK(clReleaseDevice(first[i]));
            cl_device_partition_property counts[] = {CL_DEVICE_PARTITION_BY_COUNTS, 1, 1, 0, 0};
            CHECK(clCreateSubDevices(device, counts, 2, subs, &made));
            sctx = clCreateContext(NULL, 1, &subs[1], NULL, NULL, &err);
            CHECK(err);
            sq = clCreateCommandQueueWithProperties(sctx, subs[1], NULL, &err);
            CHECK(err);
            static const char *ssrc =
                "__kernel void twice(__global float *v) { size_t i = get_global_id(0); v[i] = 2.0f * v[i] + 1.0f; }\n";
            cl_program sp = clCreateProgramWithSource(sctx, 1, &ssrc, NULL, &err);
            CHECK(err);
            CHECK(clBuildProgram(sp, 1, &subs[1], NULL, NULL, NULL));
            sk = clCreateKernel(sp, "twice", &err);
            CHECK(err);
            clReleaseProgram(sp);
            for (int i = 0; i < N; i++) out[i] = (float)(i % 13);
            sbuf = clCreateBuffer(sctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof out, out, &err);
            CHECK(err);
            CHECK(clSetKernelArg(sk, 0, sizeof sbuf, &sbuf));
            printf("split %u\n", made);
        } else if (!strcmp(cmd, "sub")) {
            CHECK(clEnqueueNDRangeKernel(sq, sk, 1, NULL, &n, NULL, 0, NULL, NULL));
            CHECK(clEnqueueReadBuffer(sq, sbuf, CL_TRUE, 0, sizeof out, out, 0, NULL, NULL));
            cl_device_id parent = NULL, qdev = NULL;
            cl_uint units = 0;
            CHECK(clGetDeviceInfo(subs[1], CL_DEVICE_PARENT_DEVICE, sizeof parent, &parent, NULL));
            CHECK(clGetDeviceInfo(subs[1], CL_DEVICE_MAX_COMPUTE_UNITS, sizeof units, &units, NULL));
            CHECK(clGetCommandQueueInfo(sq, CL_QUEUE_DEVICE, sizeof qdev, &qdev, NULL));
            printf("sub %.6e parent %d units %u queue %d\n", sum(out, N), parent == device, units,
                   qdev == subs[1]);
        } else if (!strcmp(cmd, "record")) {
            clCreateCommandBufferKHR_fn create = (clCreateCommandBufferKHR_fn)
                clGetExtensionFunctionAddressForPlatform(platform, "clCreateCommandBufferKHR");
            clCommandNDRangeKernelKHR_fn ndrange = (clCommandNDRangeKernelKHR_fn)
                clGetExtensionFunctionAddressForPlatform(platform, "clCommandNDRangeKernelKHR");
            clCommandFillBufferKHR_fn fill = (clCommandFillBufferKHR_fn)
                clGetExtensionFunctionAddressForPlatform(platform, "clCommandFillBufferKHR");
            clFinalizeCommandBufferKHR_fn finalize = (clFinalizeCommandBufferKHR_fn)
                clGetExtensionFunctionAddressForPlatform(platform, "clFinalizeCommandBufferKHR");
            if (!create || !ndrange || !fill || !finalize) return 3;
            cbuf = create(1, &q, NULL, &err);
            CHECK(err);
            cl_sync_point_khr added;
            CHECK(ndrange(cbuf, NULL, NULL, add, 1, NULL, &n, NULL, 0, NULL, &added, NULL));
            float quarter = 0.25f;
            CHECK(fill(cbuf, NULL, c, &quarter, sizeof quarter, sizeof out / 2, sizeof out / 2, 1, &added, NULL,
                       NULL));
            CHECK(finalize(cbuf));
            printf("record ok\n");
        } else if (!strcmp(cmd, "replay")) {
            clEnqueueCommandBufferKHR_fn enqueue = (clEnqueueCommandBufferKHR_fn)
                clGetExtensionFunctionAddressForPlatform(platform, "clEnqueueCommandBufferKHR");
            CHECK(enqueue(0, NULL, cbuf, 0, NULL, NULL));
            CHECK(clEnqueueReadBuffer(q, c, CL_TRUE, 0, sizeof out, out, 0, NULL, NULL));
            printf("replay %.6e\n", sum(out, N));
        } else if (!strcmp(cmd, "rearg")) {
            CHECK(clSetKernelArg(add, 2, sizeof c, &c));
            printf("rearg ok\n");
        } else if (!strcmp(cmd, "pend")) {
            pend = clCreateUserEvent(ctx, &err);
            CHECK(err);
            printf("pend ok\n");
        } else if (!strcmp(cmd, "go")) {
            CHECK(clEnqueueNDRangeKernel(q, scale, 1, NULL, &n, NULL, 1, &pend, NULL));
            CHECK(clFlush(q));
            CHECK(clSetUserEventStatus(pend, CL_COMPLETE));
            CHECK(clFinish(q));
            CHECK(clEnqueueReadBuffer(q, a, CL_TRUE, 0, sizeof out, out, 0, NULL, NULL));
            printf("go %.6e\n", sum(out, N));
        } else if (!strcmp(cmd, "unmap")) {
            CHECK(clEnqueueUnmapMemObject(q, mapped, view, 0, NULL, NULL));
            CHECK(clEnqueueReadBuffer(q, mapped, CL_TRUE, 0, 1024 * sizeof(float), out, 0, NULL, NULL));
            CHECK(clEnqueueUnmapMemObject(q, wide, wide_view, 0, NULL, NULL));
            CHECK(clEnqueueUnmapMemObject(q, big, big_view, 0, NULL, NULL));
            static float wide_out[WIDE];
            CHECK(clEnqueueReadBuffer(q, wide, CL_TRUE, 0, sizeof wide_out, wide_out, 0, NULL, NULL));
            size_t all[3] = {IW, IH, 1}, zero[3] = {0, 0, 0};
            CHECK(clEnqueueReadImage(q, big, CL_TRUE, zero, all, 0, 0, big_pixels, 0, NULL, NULL));
            unsigned long image_sum = 0;
            for (int i = 0; i < IW * IH * 4; i++)
                image_sum += (unsigned long)big_pixels[i] * (unsigned long)(i % 31 + 1);
            printf("unmap %.6e %.6e %lu\n", sum(out, 1024), sum(wide_out, WIDE), image_sum);
        } else if (!strcmp(cmd, "check")) {
            cl_int status, user_status;
            cl_command_type type;
            CHECK(clGetEventInfo(kept, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL));
            CHECK(clGetEventInfo(kept, CL_EVENT_COMMAND_TYPE, sizeof type, &type, NULL));
            CHECK(clGetEventInfo(user, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof user_status, &user_status, NULL));
            CHECK(clWaitForEvents(1, &kept));
            size_t two[2] = {8, 8};
            CHECK(clEnqueueNDRangeKernel(q, sample, 2, NULL, two, NULL, 1, &kept, NULL));
            cl_uint tex[64];
            CHECK(clEnqueueReadBuffer(q, texels, CL_TRUE, 0, sizeof tex, tex, 0, NULL, NULL));
            unsigned long texsum = 0;
            for (int i = 0; i < 64; i++) texsum += tex[i] * (unsigned long)(i + 1);
            CHECK(clEnqueueCopyBuffer(q, hidden, c, 0, 0, sizeof out, 0, NULL, NULL));
            CHECK(clEnqueueReadBuffer(q, c, CL_TRUE, 0, sizeof out, out, 0, NULL, NULL));
            cl_uint nargs;
            CHECK(clGetKernelInfo(add, CL_KERNEL_NUM_ARGS, sizeof nargs, &nargs, NULL));
            cl_program p;
            CHECK(clGetKernelInfo(add, CL_KERNEL_PROGRAM, sizeof p, &p, NULL));
            char options[64] = {0};
            CHECK(clGetProgramBuildInfo(p, device, CL_PROGRAM_BUILD_OPTIONS, sizeof options - 1, options, NULL));
            printf("check status %d type %#x user %d tex %lu hidden %.6e args %u options %s\n",
                   status, type, user_status, texsum, sum(out, N), nargs, options);
        } else if (!strcmp(cmd, "end")) {
            if (cbuf) {
                /* It holds the buffers it recorded: released first. */
                clReleaseCommandBufferKHR_fn release_cbuf = (clReleaseCommandBufferKHR_fn)
                    clGetExtensionFunctionAddressForPlatform(platform, "clReleaseCommandBufferKHR");
                CHECK(release_cbuf(cbuf));
            }
            clReleaseEvent(kept);
            clReleaseEvent(user);
            clReleaseKernel(scale);
            clReleaseKernel(add);
            clReleaseKernel(sample);
            clReleaseMemObject(upper);
            clReleaseMemObject(a);
            clReleaseMemObject(b);
            clReleaseMemObject(c);
            clReleaseMemObject(hidden);
            clReleaseMemObject(img);
            clReleaseMemObject(texels);
            clReleaseSampler(smp);
            CHECK(clFinish(q));
            clReleaseCommandQueue(q);
            clReleaseContext(ctx);
            /* The callback comes when the host destroys the buffer, maybe later. */
            while (!__atomic_load_n(&destroyed, __ATOMIC_ACQUIRE)) sched_yield();
            printf("end ok\n");
            return 0;
        } else {
            return 2;
        }
    }
    return 0;
}
