/* A blocking write whose data travels in the request returns once the data is sent
 * (the specification asks only that the application's memory be reusable then), so
 * it does not wait behind commands ahead of it in an in-order queue. Run through
 * Hira only: natively (PoCL) the first write below waits for the user event, which
 * this single thread sets only afterwards.
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
