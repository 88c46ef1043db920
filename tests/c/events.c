/* Events: profiling info, status queries, user events gating work, callbacks
 * delivered to the application, markers and barriers. */
#include "common.h"
#include <pthread.h>
#include <unistd.h>

static const char *SRC =
    "__kernel void scale(__global float *x, float f) { x[get_global_id(0)] *= f; }\n";

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static int callbacks = 0;
static cl_int last_status = 1;

static void CL_CALLBACK on_complete(cl_event e, cl_int status, void *user) {
    (void)e;
    pthread_mutex_lock(&lock);
    callbacks += *(int *)user;
    last_status = status;
    pthread_cond_broadcast(&cond);
    pthread_mutex_unlock(&lock);
}

int main(void) {
    enum { N = 1024 };
    static float x[N];
    for (int i = 0; i < N; i++) x[i] = (float)i;
    cl_platform_id platform;
    cl_device_id device;
    cl_context ctx;
    cl_command_queue q;
    cl_int err;
    setup(&platform, &device, &ctx, &q, CL_QUEUE_PROFILING_ENABLE);
    cl_program prog = build(ctx, device, SRC);
    cl_kernel k = clCreateKernel(prog, "scale", &err);
    CHECK_ERR(err, "clCreateKernel");
    cl_mem buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof x, x, &err);
    CHECK_ERR(err, "clCreateBuffer");
    float f = 2.0f;
    CHECK(clSetKernelArg(k, 0, sizeof buf, &buf));
    CHECK(clSetKernelArg(k, 1, sizeof f, &f));

    /* A user event gates the kernel. */
    cl_event gate = clCreateUserEvent(ctx, &err);
    CHECK_ERR(err, "clCreateUserEvent");
    cl_int st;
    CHECK(clGetEventInfo(gate, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, NULL));
    printf("user event status before: %s\n", st == CL_SUBMITTED ? "SUBMITTED" : "other");
    size_t global = N;
    cl_event kev;
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &global, NULL, 1, &gate, &kev));
    int weight = 1;
    CHECK(clSetEventCallback(kev, CL_COMPLETE, on_complete, &weight));
    CHECK(clFlush(q));
    CHECK(clGetEventInfo(kev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, NULL));
    printf("kernel before gate opens: %s\n", st == CL_COMPLETE ? "complete" : "pending");
    CHECK(clSetUserEventStatus(gate, CL_COMPLETE));
    CHECK(clWaitForEvents(1, &kev));

    cl_command_type type;
    CHECK(clGetEventInfo(kev, CL_EVENT_COMMAND_TYPE, sizeof type, &type, NULL));
    cl_command_queue evq;
    CHECK(clGetEventInfo(kev, CL_EVENT_COMMAND_QUEUE, sizeof evq, &evq, NULL));
    cl_context evctx;
    CHECK(clGetEventInfo(kev, CL_EVENT_CONTEXT, sizeof evctx, &evctx, NULL));
    printf("command type NDRANGE=%d queue same=%d context same=%d\n", type == CL_COMMAND_NDRANGE_KERNEL,
           evq == q, evctx == ctx);

    cl_ulong t[4];
    cl_profiling_info info[4] = {CL_PROFILING_COMMAND_QUEUED, CL_PROFILING_COMMAND_SUBMIT,
                                 CL_PROFILING_COMMAND_START, CL_PROFILING_COMMAND_END};
    for (int i = 0; i < 4; i++)
        CHECK(clGetEventProfilingInfo(kev, info[i], sizeof t[i], &t[i], NULL));
    printf("profiling monotonic=%d nonzero=%d\n", t[0] <= t[1] && t[1] <= t[2] && t[2] <= t[3],
           t[0] != 0);
    size_t psize = 0;
    CHECK(clGetEventProfilingInfo(kev, CL_PROFILING_COMMAND_END, 0, NULL, &psize));
    printf("profiling value size=%zu\n", psize);

    /* The callback runs on an implementation thread; wait for it. */
    pthread_mutex_lock(&lock);
    while (callbacks == 0) pthread_cond_wait(&cond, &lock);
    printf("callback count=%d status=%d\n", callbacks, last_status);
    pthread_mutex_unlock(&lock);

    /* Marker and barrier with wait lists. */
    cl_event marker, barrier;
    CHECK(clEnqueueMarkerWithWaitList(q, 1, &kev, &marker));
    CHECK(clEnqueueBarrierWithWaitList(q, 0, NULL, &barrier));
    CHECK(clWaitForEvents(1, &barrier));
    CHECK(clGetEventInfo(marker, CL_EVENT_COMMAND_TYPE, sizeof type, &type, NULL));
    printf("marker type ok=%d\n", type == CL_COMMAND_MARKER);
    cl_uint refs;
    CHECK(clRetainEvent(marker));
    CHECK(clGetEventInfo(marker, CL_EVENT_REFERENCE_COUNT, sizeof refs, &refs, NULL));
    printf("marker refcount after retain >= 2: %d\n", refs >= 2);
    CHECK(clReleaseEvent(marker));

    /* Invalid event in a wait list. */
    cl_event bogus = (cl_event)&weight;
    (void)bogus;
    err = clWaitForEvents(0, NULL);
    printf("wait on empty list: %s\n", err == CL_INVALID_VALUE ? "CL_INVALID_VALUE" : "other");

    CHECK(clEnqueueReadBuffer(q, buf, CL_TRUE, 0, sizeof x, x, 0, NULL, NULL));
    printf("x[10]=%.1f x[1023]=%.1f\n", x[10], x[1023]);
    clReleaseEvent(marker);
    clReleaseEvent(barrier);
    clReleaseEvent(kev);
    clReleaseEvent(gate);
    clReleaseMemObject(buf);
    clReleaseKernel(k);
    clReleaseProgram(prog);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    return 0;
}
