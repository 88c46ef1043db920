/* A blocking write returns once its data is sent (the specification asks only that
 * the application's memory be reusable then), whether the data travels in the
 * request (small) or in the data window (large), so it does not wait behind
 * commands ahead of it in an in-order queue. Run through Hira only: natively (PoCL)
 * the gated writes below wait for the user event, which this single thread sets
 * only afterwards.
 *
 * Prints "ok" when: the write behind a user-event barrier returned; the memory it
 * came from, overwritten at once, did not change what reached the buffer; a blocking
 * write that asked for an event returned with the event complete; and a blocking
 * write on an out-of-order queue (which stays blocking) landed before it returned. */
#include "cl30.h"
#include <stdio.h>
#include <string.h>

int main(void) {
    cl_platform_id platform;
    cl_device_id device;
    cl_int err;
    cl_context ctx = first_context(&platform, &device);
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, device, NULL, &err);
    if (err) return 2;
    cl_mem buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 16, NULL, &err);
    if (err) return 2;
    cl_event gate = clCreateUserEvent(ctx, &err);
    if (err) return 2;
    if (clEnqueueBarrierWithWaitList(q, 1, &gate, NULL)) return 2;
    cl_uint data[4] = {1, 2, 3, 4};
    if (clEnqueueWriteBuffer(q, buf, CL_TRUE, 0, sizeof data, data, 0, NULL, NULL)) {
        printf("write failed\n");
        return 1;
    }
    /* Returned with the queue still shut: the memory is the application's again. */
    memset(data, 0xff, sizeof data);
    clSetUserEventStatus(gate, CL_COMPLETE);
    cl_uint back[4] = {0};
    if (clEnqueueReadBuffer(q, buf, CL_TRUE, 0, sizeof back, back, 0, NULL, NULL)) return 2;
    if (back[0] != 1 || back[1] != 2 || back[2] != 3 || back[3] != 4) {
        printf("wrong data %u %u %u %u\n", back[0], back[1], back[2], back[3]);
        return 1;
    }
    /* The same with 4 MiB, which travels in the data window: returns behind a shut
     * queue, the window keeps the data until the host has read it. Twice, so the
     * second finds the window partly held. */
    enum { BIG = 1 << 20 };
    cl_mem big = clCreateBuffer(ctx, CL_MEM_READ_WRITE, BIG * sizeof(cl_uint), NULL, &err);
    if (err) return 2;
    cl_uint *src = malloc(BIG * sizeof(cl_uint)), *dst = malloc(BIG * sizeof(cl_uint));
    cl_event gate2 = clCreateUserEvent(ctx, &err);
    if (err || !src || !dst) return 2;
    if (clEnqueueBarrierWithWaitList(q, 1, &gate2, NULL)) return 2;
    for (cl_uint round = 0; round < 2; round++) {
        for (cl_uint i = 0; i < BIG; i++) src[i] = i * 7u + round;
        if (clEnqueueWriteBuffer(q, big, CL_TRUE, 0, BIG * sizeof(cl_uint), src, 0, NULL, NULL)) {
            printf("big write failed\n");
            return 1;
        }
        memset(src, 0xab, BIG * sizeof(cl_uint));
    }
    clSetUserEventStatus(gate2, CL_COMPLETE);
    if (clEnqueueReadBuffer(q, big, CL_TRUE, 0, BIG * sizeof(cl_uint), dst, 0, NULL, NULL)) return 2;
    for (cl_uint i = 0; i < BIG; i++)
        if (dst[i] != i * 7u + 1) {
            printf("big data wrong at %u: %u\n", i, dst[i]);
            return 1;
        }
    /* Non-blocking writes from the window, many more than it holds at once. */
    for (cl_uint round = 0; round < 40; round++) {
        for (cl_uint i = 0; i < BIG; i += 4096) src[i] = round;
        if (clEnqueueWriteBuffer(q, big, CL_FALSE, 0, BIG * sizeof(cl_uint), src, 0, NULL, NULL)) return 2;
        if (clFinish(q)) return 2;
    }
    if (clEnqueueReadBuffer(q, big, CL_TRUE, 0, sizeof(cl_uint), dst, 0, NULL, NULL) || dst[0] != 39) {
        printf("non-blocking window writes: %u\n", dst[0]);
        return 1;
    }
    clReleaseEvent(gate2);
    clReleaseMemObject(big);
    free(src);
    free(dst);
    /* With an event asked for, the write completes before it returns, as natively. */
    cl_event done;
    cl_uint five = 5;
    if (clEnqueueWriteBuffer(q, buf, CL_TRUE, 0, sizeof five, &five, 0, NULL, &done)) return 2;
    cl_int status = -1;
    clGetEventInfo(done, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL);
    if (status != CL_COMPLETE) {
        printf("event status %d after a blocking write\n", status);
        return 1;
    }
    clReleaseEvent(done);
    /* On an out-of-order queue the write stays blocking: it has landed on return, and
     * a kernel-free read (in another, in-order queue) sees it. */
    cl_queue_properties ooo[] = {CL_QUEUE_PROPERTIES, CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE, 0};
    cl_command_queue o = clCreateCommandQueueWithProperties(ctx, device, ooo, &err);
    if (err == CL_SUCCESS) {
        cl_uint six = 6;
        if (clEnqueueWriteBuffer(o, buf, CL_TRUE, 4, sizeof six, &six, 0, NULL, NULL)) return 2;
        if (clEnqueueReadBuffer(q, buf, CL_TRUE, 0, sizeof back, back, 0, NULL, NULL)) return 2;
        if (back[0] != 5 || back[1] != 6) {
            printf("out-of-order write not landed: %u %u\n", back[0], back[1]);
            return 1;
        }
        clReleaseCommandQueue(o);
    }
    clReleaseEvent(gate);
    clReleaseMemObject(buf);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    printf("ok\n");
    return 0;
}
