/* Event status and profiling after the commands ended (clFinish, clWaitForEvents):
 * what the application reads must be what the host says natively, whether the guest
 * asks the host or answers from what the call that waited reported. Prints every
 * status and the profiling order (not the timestamps, which differ from run to run). */
#include "cl30.h"
#include <stdio.h>

static const char *SRC = "__kernel void inc(__global int *x) { x[get_global_id(0)] += 1; }";

static void show(const char *what, cl_event e) {
    cl_int st = 99;
    cl_int err = clGetEventInfo(e, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, NULL);
    cl_ulong t[5] = {0};
    cl_int perr[5];
    for (int i = 0; i < 5; i++)
        perr[i] = clGetEventProfilingInfo(e, CL_PROFILING_COMMAND_QUEUED + i, sizeof t[i], &t[i], NULL);
    size_t size = 0;
    cl_int serr = clGetEventProfilingInfo(e, CL_PROFILING_COMMAND_END, 0, NULL, &size);
    cl_uint small = 0;
    cl_int small_err = clGetEventProfilingInfo(e, CL_PROFILING_COMMAND_START, sizeof small, &small, NULL);
    cl_char tiny = 0;
    cl_int tiny_err = clGetEventInfo(e, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof tiny, &tiny, NULL);
    printf("%s: status %d (%d) profiling %d %d %d %d %d ordered %d size %zu (%d) small %d tiny %d\n",
           what, st, err, perr[0], perr[1], perr[2], perr[3], perr[4],
           perr[0] == 0 && t[0] <= t[1] && t[1] <= t[2] && t[2] <= t[3], size, serr, small_err,
           tiny_err);
}

int main(void) {
    cl_platform_id platform;
    cl_device_id device;
    cl_int err;
    cl_context ctx = first_context(&platform, &device);
    cl_queue_properties prof[] = {CL_QUEUE_PROPERTIES, CL_QUEUE_PROFILING_ENABLE, 0};
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, device, prof, &err);
    cl_command_queue plain = clCreateCommandQueueWithProperties(ctx, device, NULL, &err);
    cl_kernel k = build_kernel(ctx, device, SRC, "inc");
    int data[256] = {0};
    cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof data, data, &err);
    clSetKernelArg(k, 0, sizeof m, &m);
    size_t global = 256;
    for (int round = 0; round < 3; round++) {
        cl_event launch, write, marker, other;
        clEnqueueNDRangeKernel(q, k, 1, NULL, &global, NULL, 0, NULL, &launch);
        clEnqueueWriteBuffer(q, m, CL_FALSE, 0, sizeof data / 2, data, 0, NULL, &write);
        clEnqueueMarkerWithWaitList(q, 0, NULL, &marker);
        clEnqueueNDRangeKernel(plain, k, 1, NULL, &global, NULL, 1, &marker, &other);
        if (round == 1) {
            clWaitForEvents(1, &other);
            show("waited, no profiling", other);
            clFinish(q);
        } else {
            clFinish(q);
            clFinish(plain);
            show("no profiling", other);
        }
        show("kernel", launch);
        show("write", write);
        show("marker", marker);
        show("kernel again", launch);
        clReleaseEvent(launch);
        clReleaseEvent(write);
        clReleaseEvent(marker);
        clReleaseEvent(other);
    }
    clEnqueueReadBuffer(q, m, CL_TRUE, 0, sizeof data, data, 0, NULL, NULL);
    printf("data %d %d\n", data[0], data[255]);
    clReleaseMemObject(m);
    clReleaseKernel(k);
    clReleaseCommandQueue(q);
    clReleaseCommandQueue(plain);
    clReleaseContext(ctx);
    return 0;
}
