/* Kernel printf: the kernel's lines reach the program's standard output, in order
 * with the program's own, at the latest when clFinish or clWaitForEvents sees the
 * kernel complete, and wherever descriptor 1 points at that moment. */
#include "common.h"
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

static const char *SRC =
    "__kernel void say(int base) {\n"
    "    printf(\"kernel says %d\\n\", base + (int)get_global_id(0));\n"
    "}\n"
    "__kernel void formats(float f) {\n"
    "    printf(\"f=%.2f s=%s c=%c x=%x v=%v4hld\\n\", f, \"str\", 'z', 255, (int4)(1, 2, 3, 4));\n"
    "}\n";

static void run(cl_command_queue q, cl_kernel k, size_t n, cl_event *ev) {
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &n, &n, 0, NULL, ev));
}

int main(void) {
    cl_platform_id platform;
    cl_device_id device;
    cl_context ctx;
    cl_command_queue q;
    cl_int err;
    setup(&platform, &device, &ctx, &q, 0);
    cl_program p = build(ctx, device, SRC);
    cl_kernel say = clCreateKernel(p, "say", &err);
    CHECK_ERR(err, "clCreateKernel");
    cl_kernel formats = clCreateKernel(p, "formats", &err);
    CHECK_ERR(err, "clCreateKernel");

    printf("before\n");
    fflush(stdout);
    int base = 40;
    CHECK(clSetKernelArg(say, 0, sizeof base, &base));
    run(q, say, 1, NULL);
    CHECK(clFinish(q));
    base = 41;
    CHECK(clSetKernelArg(say, 0, sizeof base, &base));
    cl_event ev;
    run(q, say, 1, &ev);
    CHECK(clWaitForEvents(1, &ev));
    clReleaseEvent(ev);
    printf("after\n");
    fflush(stdout);

    /* Four work-items of one work-group. */
    base = 100;
    CHECK(clSetKernelArg(say, 0, sizeof base, &base));
    run(q, say, 4, NULL);
    CHECK(clFinish(q));
    printf("after four\n");
    fflush(stdout);

    /* Descriptor 1 pointed at a file while the kernel runs, as the CTS does. */
    char path[] = "/tmp/hira-printf-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) {
        perror("mkstemp");
        return 2;
    }
    int saved = dup(1);
    dup2(fd, 1);
    float f = 2.5f;
    CHECK(clSetKernelArg(formats, 0, sizeof f, &f));
    run(q, formats, 1, NULL);
    CHECK(clFinish(q));
    dup2(saved, 1);
    close(saved);
    char buf[256] = {0};
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    close(fd);
    unlink(path);
    printf("the file got %zd bytes: %s", n, buf);
    printf("end\n");
    clReleaseKernel(say);
    clReleaseKernel(formats);
    clReleaseProgram(p);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    return 0;
}
