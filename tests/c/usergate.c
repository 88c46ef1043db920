/* Non-blocking transfers gated by a user event that the application completes only
 * after enqueueing them: a native run never waits, so neither may a remote one. The
 * data of a gated read must be in application memory once the read shows complete:
 * after clWaitForEvents, after clFinish, after polling its status, and inside its
 * event callback. */
#include "common.h"
#include <pthread.h>
#include <string.h>

enum { N = 1024 };
static int src[N], cb_dst[N];

/* What one read's callback checks: its destination, and what it found there (-1
 * until it runs). Each read has its own, as callbacks of different reads may run
 * in any order. */
struct seen {
    const int *dst;
    volatile int mismatches;
};

/* Runs when the gated read completes: its data must already be there. */
static void CL_CALLBACK on_read(cl_event e, cl_int status, void *data) {
    (void)e;
    struct seen *seen = data;
    int bad = 0;
    for (int i = 0; i < N; i++) bad += seen->dst[i] != src[i];
    seen->mismatches = status == CL_COMPLETE ? bad : -2;
}

/* Sets the gate from a second thread while the first waits on what it gates. */
static void *open_gate(void *arg) {
    cl_event gate = arg;
    cl_int st;
    /* Some calls first, so that the other thread is usually waiting by now. */
    for (int i = 0; i < 200; i++) clGetEventInfo(gate, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, NULL);
    clSetUserEventStatus(gate, CL_COMPLETE);
    return NULL;
}

int main(void) {
    static int dst[N];
    struct seen seen1 = {dst, -1}, seen2 = {cb_dst, -1};
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

    /* A read behind a second gate, waited for with clWaitForEvents. */
    cl_event gate2 = clCreateUserEvent(ctx, &err);
    CHECK_ERR(err, "clCreateUserEvent");
    memset(dst, 0, sizeof dst);
    cl_event read;
    CHECK(clEnqueueReadBuffer(q, buf, CL_FALSE, 0, sizeof dst, dst, 1, &gate2, &read));
    CHECK(clSetEventCallback(read, CL_COMPLETE, on_read, &seen1));
    CHECK(clGetEventInfo(read, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, NULL));
    printf("read waits for the gate: %d\n", st != CL_COMPLETE);
    CHECK(clSetUserEventStatus(gate2, CL_COMPLETE));
    CHECK(clWaitForEvents(1, &read));
    bad = 0;
    for (int i = 0; i < N; i++) bad += dst[i] != src[i];
    printf("gated read after clWaitForEvents: mismatches=%d\n", bad);

    /* The same read into the callback's buffer; the callback checks it. */
    cl_event gate3 = clCreateUserEvent(ctx, &err);
    CHECK_ERR(err, "clCreateUserEvent");
    cl_event read2;
    CHECK(clEnqueueReadBuffer(q, buf, CL_FALSE, 0, sizeof cb_dst, cb_dst, 1, &gate3, &read2));
    CHECK(clSetEventCallback(read2, CL_COMPLETE, on_read, &seen2));
    CHECK(clSetUserEventStatus(gate3, CL_COMPLETE));
    /* Polling the status, as programs that never wait do. */
    do {
        CHECK(clGetEventInfo(read2, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, NULL));
    } while (st != CL_COMPLETE);
    bad = 0;
    for (int i = 0; i < N; i++) bad += cb_dst[i] != src[i];
    printf("gated read after polling: mismatches=%d\n", bad);
    CHECK(clFinish(q));
    while (seen1.mismatches == -1 || seen2.mismatches == -1) {
    }
    printf("callbacks saw the reads' data: mismatches=%d, %d\n", seen1.mismatches,
           seen2.mismatches);

    /* A rectangle read and a non-blocking map behind a gate, then clFinish. */
    cl_event gate4 = clCreateUserEvent(ctx, &err);
    CHECK_ERR(err, "clCreateUserEvent");
    static int rect[16 * 8];
    memset(rect, 0, sizeof rect);
    size_t origin[3] = {4 * sizeof(int), 2, 0}, host_origin[3] = {0, 0, 0};
    size_t region[3] = {16 * sizeof(int), 8, 1};
    CHECK(clEnqueueReadBufferRect(q, buf, CL_FALSE, origin, host_origin, region,
                                  32 * sizeof(int), 0, 16 * sizeof(int), 0, rect, 1, &gate4,
                                  NULL));
    int *mapped = clEnqueueMapBuffer(q, buf, CL_FALSE, CL_MAP_READ, 0, sizeof src, 1, &gate4,
                                     NULL, &err);
    CHECK_ERR(err, "clEnqueueMapBuffer");
    CHECK(clSetUserEventStatus(gate4, CL_COMPLETE));
    CHECK(clFinish(q));
    bad = 0;
    for (int y = 0; y < 8; y++)
        for (int x = 0; x < 16; x++) bad += rect[y * 16 + x] != src[(2 + y) * 32 + 4 + x];
    printf("gated rect read after clFinish: mismatches=%d\n", bad);
    bad = 0;
    for (int i = 0; i < N; i++) bad += mapped[i] != src[i];
    printf("gated map after clFinish: mismatches=%d\n", bad);
    CHECK(clEnqueueUnmapMemObject(q, buf, mapped, 0, NULL, NULL));
    CHECK(clFinish(q));

    /* One thread waits on a read behind a gate that another thread opens. */
    cl_event gate5 = clCreateUserEvent(ctx, &err);
    CHECK_ERR(err, "clCreateUserEvent");
    cl_event read5;
    memset(dst, 0, sizeof dst);
    CHECK(clEnqueueReadBuffer(q, buf, CL_FALSE, 0, sizeof dst, dst, 1, &gate5, &read5));
    pthread_t opener;
    pthread_create(&opener, NULL, open_gate, gate5);
    CHECK(clWaitForEvents(1, &read5));
    pthread_join(opener, NULL);
    bad = 0;
    for (int i = 0; i < N; i++) bad += dst[i] != src[i];
    printf("read gated by another thread: mismatches=%d\n", bad);
    clReleaseEvent(read5);
    clReleaseEvent(gate5);

    clReleaseEvent(read);
    clReleaseEvent(read2);
    clReleaseEvent(gate2);
    clReleaseEvent(gate3);
    clReleaseEvent(gate4);
    clReleaseEvent(wrote);
    clReleaseEvent(gate);
    clReleaseMemObject(buf);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    return bad != 0 || seen1.mismatches != 0 || seen2.mismatches != 0;
}
