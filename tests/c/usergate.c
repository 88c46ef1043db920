/* Non-blocking transfers gated by a user event that the application completes only
 * after enqueueing them: a native run never waits, so neither may a remote one. */
#include "common.h"

int main(void) {
    enum { N = 1024 };
    static int src[N], dst[N];
    for (int i = 0; i < N; i++) src[i] = i * 3;
    cl_platform_id platform;
    cl_device_id device;
    cl_context ctx;
    cl_command_queue q;
    cl_int err;
    setup(&platform, &device, &ctx, &q, 0);
    cl_mem buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE, sizeof src, NULL, &err);
    CHECK_ERR(err, "clCreateBuffer");
    cl_event gate = clCreateUserEvent(ctx, &err);
    CHECK_ERR(err, "clCreateUserEvent");
    cl_event wrote;
    CHECK(clEnqueueWriteBuffer(q, buf, CL_FALSE, 0, sizeof src, src, 1, &gate, &wrote));
    cl_int st;
    CHECK(clGetEventInfo(wrote, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, NULL));
    printf("write waits for the gate: %d\n", st != CL_COMPLETE);
    /* The application may reuse its memory once the write completes, not before. */
    CHECK(clSetUserEventStatus(gate, CL_COMPLETE));
    CHECK(clWaitForEvents(1, &wrote));
    CHECK(clEnqueueReadBuffer(q, buf, CL_TRUE, 0, sizeof dst, dst, 0, NULL, NULL));
    int bad = 0;
    for (int i = 0; i < N; i++) bad += dst[i] != src[i];
    printf("gated write landed: mismatches=%d\n", bad);
    clReleaseEvent(wrote);
    clReleaseEvent(gate);
    clReleaseMemObject(buf);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    return bad != 0;
}
