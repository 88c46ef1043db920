// Graph memory: allocation and free nodes made node by node and by capturing
// cudaMallocAsync and cudaFreeAsync, an address reused after its free in the same
// graph, an allocation left live by a launch and freed by cudaFree, a relaunch that
// would allocate it again refused (and allowed with auto-free on launch), the
// device's graph-memory attributes, node parameters read back, and what the driver
// refuses of graphs holding memory nodes (clone, node deletion, a second
// instantiation, a free of memory no allocation node made).
#include "common.cuh"

static const int N = 1024;

static unsigned long long footprint(cudaGraphMemAttributeType a) {
    unsigned long long v = ~0ull;
    if (cudaDeviceGetGraphMemAttribute(0, a, &v) != cudaSuccess) return ~0ull;
    return v;
}

static cudaMemAllocNodeParams alloc_params(size_t bytes) {
    cudaMemAllocNodeParams p = {};
    p.poolProps.allocType = cudaMemAllocationTypePinned;
    p.poolProps.location.type = cudaMemLocationTypeDevice;
    p.poolProps.location.id = 0;
    p.bytesize = bytes;
    return p;
}

static long long sum(const int *h) {
    long long s = 0;
    for (int i = 0; i < N; i++) s += h[i];
    return s;
}

int main() {
    static int h[N];
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    printf("before any graph: used %llu\n", footprint(cudaGraphMemAttrUsedMemCurrent));

    // Node by node: a = alloc; fill a; b = alloc; fill b; b += a; copy b back;
    // free a; c = alloc after free a (takes a's address); free b; free c.
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    cudaGraphNode_t na, nb, fa, fb, ka, kb, kadd, copy, nc, fc;
    cudaMemAllocNodeParams pa = alloc_params(N * sizeof(int));
    CHECK(cudaGraphAddMemAllocNode(&na, g, NULL, 0, &pa));
    int *a = (int *)pa.dptr;
    cudaMemAllocNodeParams pb = alloc_params(N * sizeof(int));
    CHECK(cudaGraphAddMemAllocNode(&nb, g, NULL, 0, &pb));
    int *b = (int *)pb.dptr;
    printf("two allocations, different addresses: %s\n", a != b ? "yes" : "no");

    int n = N, x0 = 7, x1 = 1000;
    void *fill_a[] = {&a, &n, &x0}, *fill_b[] = {&b, &n, &x1}, *add_ab[] = {&a, &b, &n};
    cudaKernelNodeParams kp = {};
    kp.func = (void *)fill;
    kp.gridDim = dim3(N / 256);
    kp.blockDim = dim3(256);
    kp.kernelParams = fill_a;
    CHECK(cudaGraphAddKernelNode(&ka, g, &na, 1, &kp));
    kp.kernelParams = fill_b;
    CHECK(cudaGraphAddKernelNode(&kb, g, &nb, 1, &kp));
    cudaGraphNode_t both[] = {ka, kb};
    kp.func = (void *)add;
    kp.kernelParams = add_ab;
    CHECK(cudaGraphAddKernelNode(&kadd, g, both, 2, &kp));
    CHECK(cudaGraphAddMemcpyNode1D(&copy, g, &kadd, 1, h, b, sizeof h, cudaMemcpyDeviceToHost));
    CHECK(cudaGraphAddMemFreeNode(&fa, g, &copy, 1, a));
    cudaMemAllocNodeParams pc = alloc_params(N * sizeof(int) / 2);
    CHECK(cudaGraphAddMemAllocNode(&nc, g, &fa, 1, &pc));
    printf("an allocation after the free of a larger one takes its address: %s\n",
           (int *)pc.dptr == a ? "yes" : "no");
    CHECK(cudaGraphAddMemFreeNode(&fb, g, &copy, 1, b));
    CHECK(cudaGraphAddMemFreeNode(&fc, g, &nc, 1, (void *)pc.dptr));
    printf("a second free of b in its graph: %s\n",
           cudaGetErrorName(cudaGraphAddMemFreeNode(&fc, g, &copy, 1, b)));
    cudaGetLastError();

    cudaMemAllocNodeParams back = {};
    CHECK(cudaGraphMemAllocNodeGetParams(na, &back));
    void *freed = NULL;
    CHECK(cudaGraphMemFreeNodeGetParams(fb, &freed));
    cudaGraphNodeType type;
    CHECK(cudaGraphNodeGetType(fb, &type));
    printf("alloc node: %zu bytes at a: %s; free node frees b: %s; type %d\n", back.bytesize,
           (int *)back.dptr == a ? "yes" : "no", freed == b ? "yes" : "no", (int)type);
    CHECK(cudaGraphMemAllocNodeGetParams(nc, &back));
    printf("the node at a's address: %zu bytes\n", back.bytesize);
    // NVIDIA's driver maps graph memory at the first launch, Hira's graphs when the
    // node is made: what is held before a launch is not compared.

    cudaGraph_t cl;
    printf("clone: %s\n", cudaGetErrorName(cudaGraphClone(&cl, g)));
    printf("delete a node: %s\n", cudaGetErrorName(cudaGraphDestroyNode(fc)));
    cudaGetLastError();

    cudaGraphExec_t e, e2;
    CHECK(cudaGraphInstantiate(&e, g, 0));
    printf("second instantiation: %s\n", cudaGetErrorName(cudaGraphInstantiate(&e2, g, 0)));
    cudaGetLastError();
    for (int i = 0; i < 3; i++) CHECK(cudaGraphLaunch(e, s));
    CHECK(cudaStreamSynchronize(s));
    printf("three launches: b sums to %lld (expect %lld)\n", sum(h),
           2LL * N * (N - 1) / 2 + 1007LL * N);
    CHECK(cudaGraphExecDestroy(e));
    CHECK(cudaGraphDestroy(g));

    // Captured: cudaMallocAsync leaves its allocation live after the launch.
    cudaGraph_t cg;
    int *live = NULL;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK(cudaMallocAsync(&live, N * sizeof(int), s));
    fill<<<N / 256, 256, 0, s>>>(live, N, 3);
    CHECK(cudaStreamEndCapture(s, &cg));
    size_t count = 0;
    CHECK(cudaGraphGetNodes(cg, NULL, &count));
    cudaGraphExec_t ce;
    CHECK(cudaGraphInstantiate(&ce, cg, 0));
    CHECK(cudaGraphLaunch(ce, s));
    CHECK(cudaMemcpyAsync(h, live, sizeof h, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    printf("captured: %zu nodes; after the launch the allocation sums to %lld (expect %lld)\n",
           count, sum(h), 3LL * N + (long long)N * (N - 1) / 2);
    printf("relaunch with the allocation live: %s\n",
           cudaGetErrorName(cudaGraphLaunch(ce, s)));
    cudaGetLastError();
    CHECK(cudaFree(live));
    printf("a second cudaFree: %s\n", cudaGetErrorName(cudaFree(live)));
    cudaGetLastError();
    CHECK(cudaGraphLaunch(ce, s));
    CHECK(cudaFreeAsync(live, s));
    CHECK(cudaStreamSynchronize(s));
    printf("relaunched after the free, freed on the stream\n");
    CHECK(cudaGraphExecDestroy(ce));

    // Auto-free on launch: each launch frees what the last left live.
    CHECK(cudaGraphInstantiate(&ce, cg, cudaGraphInstantiateFlagAutoFreeOnLaunch));
    for (int i = 0; i < 3; i++) CHECK(cudaGraphLaunch(ce, s));
    CHECK(cudaStreamSynchronize(s));
    printf("three launches with auto-free: ok\n");
    CHECK(cudaFree(live));
    CHECK(cudaGraphExecDestroy(ce));
    CHECK(cudaGraphDestroy(cg));

    // A captured free of the captured allocation; a free of other memory.
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK(cudaMallocAsync(&live, N * sizeof(int), s));
    fill<<<N / 256, 256, 0, s>>>(live, N, 5);
    CHECK(cudaMemcpyAsync(h, live, sizeof h, cudaMemcpyDeviceToHost, s));
    CHECK(cudaFreeAsync(live, s));
    CHECK(cudaStreamEndCapture(s, &cg));
    CHECK(cudaGraphInstantiate(&ce, cg, 0));
    for (int i = 0; i < 2; i++) CHECK(cudaGraphLaunch(ce, s));
    CHECK(cudaStreamSynchronize(s));
    printf("captured alloc, kernel, copy, free, launched twice: sum %lld (expect %lld)\n",
           sum(h), 5LL * N + (long long)N * (N - 1) / 2);
    CHECK(cudaGraphExecDestroy(ce));
    CHECK(cudaGraphDestroy(cg));

    int *plain;
    CHECK(cudaMalloc(&plain, 64));
    CHECK(cudaGraphCreate(&g, 0));
    printf("free node for memory no allocation node made: %s\n",
           cudaGetErrorName(cudaGraphAddMemFreeNode(&fa, g, NULL, 0, plain)));
    cudaGetLastError();
    CHECK(cudaGraphDestroy(g));
    CHECK(cudaFree(plain));

    unsigned long long high = footprint(cudaGraphMemAttrUsedMemHigh);
    unsigned long long zero = 0, one = 1;
    CHECK(cudaDeviceGraphMemTrim(0));
    CHECK(cudaDeviceSetGraphMemAttribute(0, cudaGraphMemAttrUsedMemHigh, &zero));
    printf("high mark at least two allocations: %s; trimmed: used %llu, reserved %llu, high %llu\n",
           high >= 2 * N * sizeof(int) ? "yes" : "no", footprint(cudaGraphMemAttrUsedMemCurrent),
           footprint(cudaGraphMemAttrReservedMemCurrent), footprint(cudaGraphMemAttrUsedMemHigh));
    printf("a high mark set to 1: %s\n",
           cudaGetErrorName(cudaDeviceSetGraphMemAttribute(0, cudaGraphMemAttrUsedMemHigh, &one)));
    cudaGetLastError();
    printf("done\n");
    return 0;
}
