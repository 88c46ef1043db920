/* The fairness benchmark's guest: busy kernels of one length, back to back.
 *
 *   spin calibrate MS   prints the iteration count whose launch takes about MS ms
 *   spin N SECONDS [DEPTH]
 *                       launches N-iteration kernels for SECONDS, waiting for each
 *                       (DEPTH 1, the default) or keeping DEPTH launches queued, so
 *                       that the guest always has work for the device; prints the
 *                       number of launches completed
 *
 * Each launch is 8 work-groups of one item, so that it occupies every core of a CPU
 * device, as a kernel occupies a GPU. */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *src =
    "__kernel void spin(__global uint *out, uint n) {\n"
    "    uint x = get_global_id(0) + 1;\n"
    "    for (uint i = 0; i < n; i++) x = x * 1664525u + 1013904223u;\n"
    "    out[get_global_id(0)] = x;\n"
    "}\n";

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc != 3 && argc != 4) return 2;
    cl_platform_id platform;
    cl_device_id device;
    cl_int err;
    if (clGetPlatformIDs(1, &platform, NULL)) return 2;
    if (clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &device, NULL)) return 2;
    cl_context ctx = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
    cl_queue_properties props[] = {CL_QUEUE_PROPERTIES, CL_QUEUE_PROFILING_ENABLE, 0};
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, device, props, &err);
    cl_program p = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
    if (clBuildProgram(p, 1, &device, "", NULL, NULL)) return 2;
    cl_kernel k = clCreateKernel(p, "spin", &err);
    cl_mem out = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 8 * sizeof(cl_uint), NULL, &err);
    if (err) return 2;
    clSetKernelArg(k, 0, sizeof out, &out);
    size_t global = 8, local = 1;
    if (!strcmp(argv[1], "calibrate")) {
        double want = atof(argv[2]) * 1e6;
        for (cl_uint n = 1024;; n *= 2) {
            cl_event e;
            clSetKernelArg(k, 1, sizeof n, &n);
            if (clEnqueueNDRangeKernel(q, k, 1, NULL, &global, &local, 0, NULL, &e)) return 2;
            clWaitForEvents(1, &e);
            cl_ulong s = 0, t = 0;
            clGetEventProfilingInfo(e, CL_PROFILING_COMMAND_START, sizeof s, &s, NULL);
            clGetEventProfilingInfo(e, CL_PROFILING_COMMAND_END, sizeof t, &t, NULL);
            clReleaseEvent(e);
            if ((double)(t - s) >= want || n >= (1u << 31)) {
                /* Scale down to the wanted length from the last (longer) launch. */
                double scaled = n * want / (double)(t - s);
                printf("%u\n", scaled < 1 ? 1u : (cl_uint)scaled);
                return 0;
            }
        }
    }
    cl_uint n = (cl_uint)strtoul(argv[1], NULL, 10);
    double until = now() + atof(argv[2]);
    int depth = argc == 4 ? atoi(argv[3]) : 1;
    if (depth < 1 || depth > 16) return 2;
    clSetKernelArg(k, 1, sizeof n, &n);
    unsigned long launches = 0;
    cl_event ring[16] = {0};
    for (unsigned long i = 0; now() < until; i++) {
        cl_event *slot = &ring[i % depth];
        if (*slot) {
            /* The launch DEPTH back has to finish before another is queued. */
            if (clWaitForEvents(1, slot)) return 2;
            clReleaseEvent(*slot);
            launches++;
        }
        if (clEnqueueNDRangeKernel(q, k, 1, NULL, &global, &local, 0, NULL, slot)) return 2;
        clFlush(q);
    }
    if (clFinish(q)) return 2;
    for (int i = 0; i < depth; i++)
        if (ring[i]) {
            clReleaseEvent(ring[i]);
            launches++;
        }
    printf("%lu\n", launches);
    return 0;
}
