// What runtime programs commonly use beyond a launch: __constant__ and __device__
// globals (cudaMemcpyToSymbol/FromSymbol), device printf, streams and events,
// pinned host memory, cudaMemset, device queries, occupancy, the profiler's start
// and stop, atomicInc and clock64, and an error.
#include <cstdio>

// As cuda_profiler_api.h declares them (the PyPI toolkit has no copy of that header).
extern "C" cudaError_t cudaProfilerStart(void);
extern "C" cudaError_t cudaProfilerStop(void);

__constant__ float scale[4];
__device__ int counter;

__global__ void scaled(const float *in, float *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = in[i] * scale[i % 4];
        atomicAdd(&counter, 1);
    }
}

__global__ void ticks(unsigned *wrap, long long *elapsed) {
    long long t0 = clock64();
    atomicInc(wrap, 2);
    long long t1 = clock64();
    if (threadIdx.x == 0) *elapsed = t1 - t0;
}

__global__ void hello(int tag) {
    if (threadIdx.x < 2) printf("block %d thread %d says %d\n", blockIdx.x, threadIdx.x, tag);
}

// Host work on a stream (cudaLaunchHostFunc, cudaStreamAddCallback).
static void CUDART_CB host_step(void *p) { *(int *)p += 1; }
static void CUDART_CB stream_done(cudaStream_t, cudaError_t st, void *p) {
    *(int *)p += st == cudaSuccess ? 10 : 1000;
}

#define CHECK(x)                                                                     \
    do {                                                                             \
        cudaError_t e = (x);                                                         \
        if (e != cudaSuccess) {                                                      \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x,               \
                    cudaGetErrorString(e));                                          \
            return 1;                                                                \
        }                                                                            \
    } while (0)

int main() {
    int count = 0;
    CHECK(cudaGetDeviceCount(&count));
    int rt = 0, drv = 0;
    CHECK(cudaRuntimeGetVersion(&rt));
    CHECK(cudaDriverGetVersion(&drv));
    printf("devices %d, runtime new enough: %s\n", count, drv >= rt ? "yes" : "no");
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("warp %d, max threads per block %d\n", prop.warpSize, prop.maxThreadsPerBlock);

    const int n = 4096;
    float h_scale[4] = {1.0f, 2.0f, 0.5f, -1.0f};
    CHECK(cudaMemcpyToSymbol(scale, h_scale, sizeof h_scale));
    int zero = 0;
    CHECK(cudaMemcpyToSymbol(counter, &zero, sizeof zero));

    float *h_in, *h_out;
    CHECK(cudaMallocHost(&h_in, n * sizeof(float)));
    CHECK(cudaMallocHost(&h_out, n * sizeof(float)));
    for (int i = 0; i < n; i++) h_in[i] = (float)i;
    float *d_in, *d_out;
    CHECK(cudaMalloc(&d_in, n * sizeof(float)));
    CHECK(cudaMalloc(&d_out, n * sizeof(float)));
    CHECK(cudaMemset(d_out, 0, n * sizeof(float)));

    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    CHECK(cudaEventRecord(start, s));
    CHECK(cudaMemcpyAsync(d_in, h_in, n * sizeof(float), cudaMemcpyHostToDevice, s));
    scaled<<<n / 128, 128, 0, s>>>(d_in, d_out, n);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpyAsync(h_out, d_out, n * sizeof(float), cudaMemcpyDeviceToHost, s));
    CHECK(cudaEventRecord(stop, s));
    CHECK(cudaStreamSynchronize(s));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    int bad = 0;
    for (int i = 0; i < n; i++)
        if (h_out[i] != h_in[i] * h_scale[i % 4]) bad++;
    int seen = 0;
    CHECK(cudaMemcpyFromSymbol(&seen, counter, sizeof seen));
    printf("scaled %d elements: %d mismatches, counter %d, elapsed %s\n", n, bad, seen,
           ms >= 0 ? "measured" : "negative");

    // cudaLaunchKernelEx (cuLaunchKernelEx): hints, a completion event, and a
    // cluster, which a device without clusters refuses.
    {
        cudaEvent_t done;
        CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
        cudaLaunchAttribute at[3];
        at[0].id = cudaLaunchAttributePriority;
        at[0].val.priority = 0;
        at[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[1].val.programmaticStreamSerializationAllowed = 1;
        at[2].id = cudaLaunchAttributeLaunchCompletionEvent;
        at[2].val.launchCompletionEvent.event = done;
        at[2].val.launchCompletionEvent.flags = 0;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(n / 128);
        cfg.blockDim = dim3(128);
        cfg.stream = s;
        cfg.attrs = at;
        cfg.numAttrs = 3;
        CHECK(cudaMemset(d_out, 0, n * sizeof(float)));
        CHECK(cudaLaunchKernelEx(&cfg, scaled, (const float *)d_in, d_out, n));
        CHECK(cudaEventSynchronize(done));
        CHECK(cudaMemcpy(h_out, d_out, n * sizeof(float), cudaMemcpyDeviceToHost));
        int wrong = 0;
        for (int i = 0; i < n; i++)
            if (h_out[i] != h_in[i] * h_scale[i % 4]) wrong++;
        printf("cudaLaunchKernelEx with attributes: %d mismatches\n", wrong);
        bad += wrong;
        cudaLaunchAttribute cluster;
        cluster.id = cudaLaunchAttributeClusterDimension;
        cluster.val.clusterDim.x = 2;
        cluster.val.clusterDim.y = 1;
        cluster.val.clusterDim.z = 1;
        cfg.attrs = &cluster;
        cfg.numAttrs = 1;
        cudaError_t ce = cudaLaunchKernelEx(&cfg, scaled, (const float *)d_in, d_out, n);
        printf("cluster of 2: %s\n", cudaGetErrorName(ce));
        cudaGetLastError();
        CHECK(cudaStreamSynchronize(s));
        CHECK(cudaEventDestroy(done));
    }

    // What CuPy and CUB ask before they work: pointer attributes, stream capture.
    {
        cudaPointerAttributes pa;
        CHECK(cudaPointerGetAttributes(&pa, d_out + 5));
        printf("device pointer: type %s, device %d, same address %s\n",
               pa.type == cudaMemoryTypeDevice ? "device" : "other", pa.device,
               pa.devicePointer == (void *)(d_out + 5) ? "yes" : "no");
        int local = 0;
        CHECK(cudaPointerGetAttributes(&pa, &local));
        printf("stack pointer: type %s\n",
               pa.type == cudaMemoryTypeUnregistered ? "unregistered" : "other");
        cudaStreamCaptureStatus cs = cudaStreamCaptureStatusActive;
        CHECK(cudaStreamIsCapturing(s, &cs));
        cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
        CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
        cudaStreamCaptureMode back = cudaStreamCaptureModeGlobal;
        CHECK(cudaThreadExchangeStreamCaptureMode(&back));
        printf("capturing: %s, capture mode was %d then %d\n",
               cs == cudaStreamCaptureStatusNone ? "no" : "yes", (int)mode, (int)back);
    }

    {
        int steps = 0;
        scaled<<<n / 128, 128, 0, s>>>(d_in, d_out, n);
        CHECK(cudaLaunchHostFunc(s, host_step, &steps));
        CHECK(cudaStreamAddCallback(s, stream_done, &steps, 0));
        CHECK(cudaStreamSynchronize(s));
        printf("host work on the stream: %d\n", steps);
    }

    int blocks = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, scaled, 128, 0));
    printf("occupancy positive: %s\n", blocks > 0 ? "yes" : "no");
    cudaFuncAttributes attrs;
    CHECK(cudaFuncGetAttributes(&attrs, scaled));
    int min_grid = 0, block = 0;
    CHECK(cudaOccupancyMaxPotentialBlockSize(&min_grid, &block, scaled));
    printf("attributes: max threads positive: %s, suggested block positive: %s\n",
           attrs.maxThreadsPerBlock > 0 ? "yes" : "no", block > 0 ? "yes" : "no");

    CHECK(cudaProfilerStart());
    unsigned *d_wrap;
    long long *d_elapsed;
    CHECK(cudaMalloc(&d_wrap, sizeof *d_wrap));
    CHECK(cudaMalloc(&d_elapsed, sizeof *d_elapsed));
    CHECK(cudaMemset(d_wrap, 0, sizeof *d_wrap));
    ticks<<<1, 4>>>(d_wrap, d_elapsed);
    // Pitched memory, 2D memsets and 2D copies through the runtime.
    {
        static float h2[8][20], r2[8][20];
        for (int y = 0; y < 8; y++)
            for (int x = 0; x < 20; x++) h2[y][x] = (float)(y * 100 + x);
        float *d2 = nullptr;
        size_t pitch = 0;
        CHECK(cudaMallocPitch((void **)&d2, &pitch, 16 * sizeof(float), 8));
        CHECK(cudaMemset2D(d2, pitch, 0, 16 * sizeof(float), 8));
        CHECK(cudaMemcpy2D(d2, pitch, h2, sizeof h2[0], 16 * sizeof(float), 8,
                           cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy2D(r2, sizeof r2[0], d2, pitch, 16 * sizeof(float), 8,
                           cudaMemcpyDeviceToHost));
        int same = 0;
        for (int y = 0; y < 8; y++)
            for (int x = 0; x < 16; x++) same += r2[y][x] == h2[y][x];
        printf("pitched 2D copies: pitch %zu, %d of 128 values back\n", pitch, same);
        CHECK(cudaFree(d2));
        // A volume through cudaMalloc3D and cudaMemcpy3D, there and back.
        static float vol[3][4][20], got[3][4][20];
        for (int i = 0; i < 3 * 4 * 20; i++) (&vol[0][0][0])[i] = (float)i;
        cudaExtent ext = make_cudaExtent(16 * sizeof(float), 4, 3);
        cudaPitchedPtr dv;
        CHECK(cudaMalloc3D(&dv, ext));
        cudaMemcpy3DParms p3 = {};
        p3.srcPtr = make_cudaPitchedPtr(vol, 20 * sizeof(float), 20, 4);
        p3.dstPtr = dv;
        p3.extent = ext;
        p3.kind = cudaMemcpyHostToDevice;
        CHECK(cudaMemcpy3D(&p3));
        cudaMemcpy3DParms q3 = {};
        q3.srcPtr = dv;
        q3.dstPtr = make_cudaPitchedPtr(got, 20 * sizeof(float), 20, 4);
        q3.extent = ext;
        q3.kind = cudaMemcpyDeviceToHost;
        CHECK(cudaMemcpy3D(&q3));
        int same3 = 0;
        for (int z = 0; z < 3; z++)
            for (int y = 0; y < 4; y++)
                for (int x = 0; x < 16; x++) same3 += got[z][y][x] == vol[z][y][x];
        printf("3D copies: %d of 192 values back\n", same3);
        CHECK(cudaFree(dv.ptr));
    }
    unsigned wrap = 0;
    long long elapsed = -1;
    CHECK(cudaMemcpy(&wrap, d_wrap, sizeof wrap, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(&elapsed, d_elapsed, sizeof elapsed, cudaMemcpyDeviceToHost));
    CHECK(cudaProfilerStop());
    printf("atomicInc wraps to %u, clock64 advances: %s\n", wrap, elapsed >= 0 ? "yes" : "no");
    CHECK(cudaFree(d_wrap));
    CHECK(cudaFree(d_elapsed));

    hello<<<2, 4>>>(7);
    CHECK(cudaDeviceSynchronize());

    void *p = nullptr;
    cudaError_t e = cudaMalloc(&p, (size_t)1 << 62);
    printf("huge cudaMalloc: %s\n", cudaGetErrorName(e));
    cudaGetLastError();

    hello<<<1, 1>>>(8);
    CHECK(cudaStreamSynchronize(0));
    CHECK(cudaEventDestroy(start));
    CHECK(cudaEventDestroy(stop));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFreeHost(h_in));
    CHECK(cudaFreeHost(h_out));
    CHECK(cudaFree(d_in));
    CHECK(cudaFree(d_out));
    CHECK(cudaDeviceReset());
    printf("done\n");
    return bad != 0;
}
