/* Device work on command, for the scheduling tests: one command per line on stdin,
 * one answer per line on stdout, so a test can order what two guests do.
 *
 *   run MS     launches a busy kernel, growing its length until one launch took at
 *              least MS ms of device time by its own profiling timestamps
 *              -> "ok ITERATIONS NS"
 *   once N     one launch of N iterations, then clFinish; checks its result -> "ok"
 *   gate       enqueues a launch behind a user event of its own and flushes -> "ok"
 *   open       completes that user event and waits for the launch -> "ok"
 *   flood N K  enqueues K launches of N iterations without waiting, each of 8
 *              work-groups (so that each fills every core of a CPU device, as a kernel
 *              fills a GPU), flushes -> "ok"
 *   drain      waits for them -> "ok S1 ... SK", each one's CL_PROFILING_COMMAND_START
 *   time N     one launch of N iterations, waited for
 *              -> "ok QUEUED START END" (its profiling timestamps)
 *   prof       on a queue made without profiling: CL_QUEUE_PROPERTIES, the property
 *              array, and the profiling query of a launch's event
 *              -> "props P array N K V err E" */
#include "cl30.h"
#include <stdio.h>
#include <string.h>

static const char *src =
    "__kernel void spin(__global uint *out, uint n) {\n"
    "    uint x = get_global_id(0) + 1;\n"
    "    for (uint i = 0; i < n; i++) x = x * 1664525u + 1013904223u;\n"
    "    out[get_global_id(0)] = x;\n"
    "}\n";

static cl_uint expected(cl_uint n) {
    cl_uint x = 1;
    for (cl_uint i = 0; i < n; i++) x = x * 1664525u + 1013904223u;
    return x;
}

int main(void) {
    cl_platform_id platform;
    cl_device_id device;
    cl_int err;
    cl_context ctx = first_context(&platform, &device);
    cl_queue_properties timed[] = {CL_QUEUE_PROPERTIES, CL_QUEUE_PROFILING_ENABLE, 0};
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, device, timed, &err);
    if (err != CL_SUCCESS) return 2;
    cl_kernel k = build_kernel(ctx, device, src, "spin");
    cl_mem out = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 8 * sizeof(cl_uint), NULL, &err);
    if (err != CL_SUCCESS) return 2;
    clSetKernelArg(k, 0, sizeof out, &out);
    size_t one = 1, eight = 8;
    cl_event gate = NULL;
    enum { MAX_FLOOD = 256 };
    cl_event flood[MAX_FLOOD];
    unsigned long long flooded = 0;
    char line[256];
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("ready\n");
    while (fgets(line, sizeof line, stdin)) {
        char cmd[32];
        unsigned long long a = 0, b = 0;
        if (sscanf(line, "%31s %llu %llu", cmd, &a, &b) < 1) return 2;
        if (!strcmp(cmd, "run")) {
            cl_uint n = 1 << 16;
            cl_ulong took = 0;
            for (;;) {
                cl_event e;
                clSetKernelArg(k, 1, sizeof n, &n);
                if (clEnqueueNDRangeKernel(q, k, 1, NULL, &one, NULL, 0, NULL, &e)) return 2;
                if (clWaitForEvents(1, &e)) return 2;
                cl_ulong start = 0, end = 0;
                clGetEventProfilingInfo(e, CL_PROFILING_COMMAND_START, sizeof start, &start, NULL);
                clGetEventProfilingInfo(e, CL_PROFILING_COMMAND_END, sizeof end, &end, NULL);
                clReleaseEvent(e);
                took = end - start;
                if (took >= a * 1000000ull || n >= (1u << 31)) break;
                n *= 2;
            }
            printf("ok %u %llu\n", n, (unsigned long long)took);
        } else if (!strcmp(cmd, "once")) {
            cl_uint n = (cl_uint)a, got = 0;
            clSetKernelArg(k, 1, sizeof n, &n);
            if (clEnqueueNDRangeKernel(q, k, 1, NULL, &one, NULL, 0, NULL, NULL)) return 2;
            if (clEnqueueReadBuffer(q, out, CL_TRUE, 0, sizeof got, &got, 0, NULL, NULL)) return 2;
            printf(got == expected(n) ? "ok\n" : "wrong\n");
        } else if (!strcmp(cmd, "gate")) {
            gate = clCreateUserEvent(ctx, &err);
            cl_uint n = 1000;
            clSetKernelArg(k, 1, sizeof n, &n);
            if (clEnqueueNDRangeKernel(q, k, 1, NULL, &one, NULL, 1, &gate, NULL)) return 2;
            clFlush(q);
            printf("ok\n");
        } else if (!strcmp(cmd, "open")) {
            clSetUserEventStatus(gate, CL_COMPLETE);
            clReleaseEvent(gate);
            printf(clFinish(q) == CL_SUCCESS ? "ok\n" : "err\n");
        } else if (!strcmp(cmd, "flood")) {
            cl_uint n = (cl_uint)a;
            if (b > MAX_FLOOD || flooded) return 2;
            clSetKernelArg(k, 1, sizeof n, &n);
            for (flooded = 0; flooded < b; flooded++)
                if (clEnqueueNDRangeKernel(q, k, 1, NULL, &eight, &one, 0, NULL, &flood[flooded]))
                    return 2;
            clFlush(q);
            printf("ok\n");
        } else if (!strcmp(cmd, "drain")) {
            if (clFinish(q)) return 2;
            printf("ok");
            for (unsigned long long i = 0; i < flooded; i++) {
                cl_ulong start = 0;
                clGetEventProfilingInfo(flood[i], CL_PROFILING_COMMAND_START, sizeof start, &start, NULL);
                printf(" %llu", (unsigned long long)start);
                clReleaseEvent(flood[i]);
            }
            printf("\n");
            flooded = 0;
        } else if (!strcmp(cmd, "time")) {
            cl_uint n = (cl_uint)a;
            cl_event e;
            clSetKernelArg(k, 1, sizeof n, &n);
            if (clEnqueueNDRangeKernel(q, k, 1, NULL, &one, NULL, 0, NULL, &e)) return 2;
            if (clWaitForEvents(1, &e)) return 2;
            cl_ulong t[3] = {0};
            clGetEventProfilingInfo(e, CL_PROFILING_COMMAND_QUEUED, sizeof t[0], &t[0], NULL);
            clGetEventProfilingInfo(e, CL_PROFILING_COMMAND_START, sizeof t[1], &t[1], NULL);
            clGetEventProfilingInfo(e, CL_PROFILING_COMMAND_END, sizeof t[2], &t[2], NULL);
            clReleaseEvent(e);
            printf("ok %llu %llu %llu\n", (unsigned long long)t[0], (unsigned long long)t[1],
                   (unsigned long long)t[2]);
        } else if (!strcmp(cmd, "prof")) {
            cl_command_queue plain = clCreateCommandQueueWithProperties(ctx, device, NULL, &err);
            cl_command_queue_properties props = 99;
            clGetCommandQueueInfo(plain, CL_QUEUE_PROPERTIES, sizeof props, &props, NULL);
            size_t array_size = 0;
            clGetCommandQueueInfo(q, CL_QUEUE_PROPERTIES_ARRAY, 0, NULL, &array_size);
            cl_queue_properties arr[8] = {0};
            clGetCommandQueueInfo(q, CL_QUEUE_PROPERTIES_ARRAY, sizeof arr, arr, NULL);
            cl_event e;
            cl_uint n = 10;
            clSetKernelArg(k, 1, sizeof n, &n);
            clEnqueueNDRangeKernel(plain, k, 1, NULL, &one, NULL, 0, NULL, &e);
            clWaitForEvents(1, &e);
            cl_ulong t;
            cl_int perr = clGetEventProfilingInfo(e, CL_PROFILING_COMMAND_END, sizeof t, &t, NULL);
            size_t plain_array = 99;
            clGetCommandQueueInfo(plain, CL_QUEUE_PROPERTIES_ARRAY, 0, NULL, &plain_array);
            printf("props %llu array %zu %llu %llu plain-array %zu err %d\n",
                   (unsigned long long)props, array_size / sizeof(cl_queue_properties),
                   (unsigned long long)arr[0], (unsigned long long)arr[1], plain_array, perr);
            clReleaseEvent(e);
            clReleaseCommandQueue(plain);
        } else {
            return 2;
        }
    }
    return 0;
}
