// CUDA graphs as programs use them: a graph built node by node (memset, kernel,
// copies, a host node, a child graph, an empty node; edges added and queried),
// cloned, instantiated, launched again and again with a kernel node's parameters
// changed in the instantiation; stream capture across three streams forked and
// joined by events, with a host function; a captured graph updating an
// instantiation (cudaGraphExecUpdate) and one of another shape refused; and the
// errors of capture: a synchronisation while capturing, a capture ended on another
// stream, a forked stream never joined, a capture on the legacy stream.
#include <cstdio>
#include <vector>

#include "common.cuh"

__global__ void axpy(float a, const float *x, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

__global__ void add_one(int *v, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) v[i] += 1;
}

__global__ void twice(int *v, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) v[i] *= 2;
}

static void CUDART_CB count(void *p) { *(int *)p += 1; }

static const int N = 1000;

static float sum(const std::vector<float> &v) {
    float s = 0;
    for (float f : v) s += f;
    return s;
}

static int manual() {
    std::vector<float> hx(N), hy(N, 0.0f), out(N);
    for (int i = 0; i < N; i++) hx[i] = (float)(i % 7);
    float *x, *y;
    CHECK(cudaMalloc(&x, N * sizeof(float)));
    CHECK(cudaMalloc(&y, N * sizeof(float)));
    int ran = 0;

    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    cudaGraphNode_t copy_in, zero, kern, copy_out, host, empty;

    cudaMemcpy3DParms cp = {};
    cp.srcPtr = make_cudaPitchedPtr(hx.data(), N * sizeof(float), N, 1);
    cp.dstPtr = make_cudaPitchedPtr(x, N * sizeof(float), N, 1);
    cp.extent = make_cudaExtent(N * sizeof(float), 1, 1);
    cp.kind = cudaMemcpyHostToDevice;
    CHECK(cudaGraphAddMemcpyNode(&copy_in, g, nullptr, 0, &cp));

    cudaMemsetParams ms = {};
    ms.dst = y;
    ms.value = 0;
    ms.elementSize = sizeof(float);
    ms.width = N;
    ms.height = 1;
    CHECK(cudaGraphAddMemsetNode(&zero, g, nullptr, 0, &ms));

    float a = 2.0f;
    int n = N;
    void *args[] = {&a, &x, &y, &n};
    cudaKernelNodeParams kp = {};
    kp.func = (void *)axpy;
    kp.gridDim = dim3((N + 127) / 128);
    kp.blockDim = dim3(128);
    kp.kernelParams = args;
    cudaGraphNode_t deps[] = {copy_in, zero};
    CHECK(cudaGraphAddKernelNode(&kern, g, deps, 2, &kp));
    a = 100.0f;  // the node keeps the value it was given

    cudaMemcpy3DParms cb = {};
    cb.srcPtr = make_cudaPitchedPtr(y, N * sizeof(float), N, 1);
    cb.dstPtr = make_cudaPitchedPtr(out.data(), N * sizeof(float), N, 1);
    cb.extent = make_cudaExtent(N * sizeof(float), 1, 1);
    cb.kind = cudaMemcpyDeviceToHost;
    CHECK(cudaGraphAddMemcpyNode(&copy_out, g, &kern, 1, &cb));

    cudaHostNodeParams hp = {};
    hp.fn = count;
    hp.userData = &ran;
    CHECK(cudaGraphAddHostNode(&host, g, nullptr, 0, &hp));
    CHECK(cudaGraphAddEmptyNode(&empty, g, nullptr, 0));
    // The host node runs after the copy back, through the empty node.
    CHECK(cudaGraphAddDependencies(g, &copy_out, &empty, nullptr, 1));
    CHECK(cudaGraphAddDependencies(g, &empty, &host, nullptr, 1));

    size_t nodes = 0, roots = 0, edges = 0;
    CHECK(cudaGraphGetNodes(g, nullptr, &nodes));
    CHECK(cudaGraphGetRootNodes(g, nullptr, &roots));
    CHECK(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &edges));
    printf("manual graph: %zu nodes, %zu roots, %zu edges\n", nodes, roots, edges);
    cudaGraphNodeType t;
    CHECK(cudaGraphNodeGetType(kern, &t));
    printf("kernel node type %d (kernel %d)\n", (int)t, (int)cudaGraphNodeTypeKernel);
    size_t nd = 0;
    CHECK(cudaGraphNodeGetDependencies(kern, nullptr, nullptr, &nd));
    printf("kernel node depends on %zu nodes\n", nd);

    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    for (int it = 0; it < 3; it++) CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    // Each launch zeroes y first: the result is one axpy.
    printf("after 3 launches: sum %.1f (expect %.1f), host node ran %d times\n", sum(out),
           2.0f * sum(hx), ran);

    // The kernel node's parameters changed in the instantiation only.
    float a3 = 3.0f;
    void *args3[] = {&a3, &x, &y, &n};
    cudaKernelNodeParams kp3 = kp;
    kp3.kernelParams = args3;
    CHECK(cudaGraphExecKernelNodeSetParams(exec, kern, &kp3));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    printf("with a = 3 in the instantiation: sum %.1f\n", sum(out));

    // A clone, instantiated on its own, runs with the graph's own parameters.
    cudaGraph_t c;
    CHECK(cudaGraphClone(&c, g));
    cudaGraphNode_t ck;
    CHECK(cudaGraphNodeFindInClone(&ck, kern, c));
    cudaKernelNodeParams got = {};
    CHECK(cudaGraphKernelNodeGetParams(ck, &got));
    printf("clone's kernel node: a = %.1f, grid %u, block %u\n", *(float *)got.kernelParams[0],
           got.gridDim.x, got.blockDim.x);
    cudaGraphExec_t cexec;
    CHECK(cudaGraphInstantiate(&cexec, c, 0));
    CHECK(cudaGraphLaunch(cexec, s));
    CHECK(cudaStreamSynchronize(s));
    printf("clone: sum %.1f, host node ran %d times\n", sum(out), ran);

    // A child graph: the clone inside a new graph, twice in a row.
    cudaGraph_t parent;
    CHECK(cudaGraphCreate(&parent, 0));
    cudaGraphNode_t c1, c2;
    CHECK(cudaGraphAddChildGraphNode(&c1, parent, nullptr, 0, c));
    CHECK(cudaGraphAddChildGraphNode(&c2, parent, &c1, 1, c));
    cudaGraphExec_t pexec;
    CHECK(cudaGraphInstantiate(&pexec, parent, 0));
    CHECK(cudaGraphLaunch(pexec, s));
    CHECK(cudaStreamSynchronize(s));
    printf("parent of two children: sum %.1f, host node ran %d times\n", sum(out), ran);

    // Refused: a dependency on a node of another graph, a cycle.
    printf("edge to another graph's node: %s\n",
           cudaGetErrorName(cudaGraphAddDependencies(g, &ck, &host, nullptr, 1)));
    printf("cycle: %s\n", cudaGetErrorName(cudaGraphAddDependencies(g, &host, &copy_in, nullptr, 1)));

    CHECK(cudaGraphExecDestroy(pexec));
    CHECK(cudaGraphExecDestroy(cexec));
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(parent));
    CHECK(cudaGraphDestroy(c));
    CHECK(cudaGraphDestroy(g));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(x));
    CHECK(cudaFree(y));
    return 0;
}

// The streams, events and buffers of a capture forked from s1 into s2 and s3.
struct Fork {
    cudaStream_t s1, s2, s3;
    cudaEvent_t fork, j2, j3;
    int *v, *w, *hv, *hw, *hosts;
};

// Captures into *g: on s1, v zeroed; forked, w zeroed and incremented on s2, and on
// s3 v incremented then doubled (twice_first: doubled then incremented); joined,
// both copied back and a host function run. `report` prints the streams' capture
// status along the way.
static int capture_fork(const Fork &f, cudaStreamCaptureMode mode, bool twice_first, bool report,
                        cudaGraph_t *g) {
    cudaStreamCaptureStatus st;
    CHECK(cudaStreamBeginCapture(f.s1, mode));
    if (report) {
        CHECK(cudaStreamIsCapturing(f.s1, &st));
        printf("s1 capturing: %d\n", (int)st);
    }
    CHECK(cudaMemsetAsync(f.v, 0, N * sizeof(int), f.s1));
    CHECK(cudaEventRecord(f.fork, f.s1));
    CHECK(cudaStreamWaitEvent(f.s2, f.fork, 0));
    CHECK(cudaStreamWaitEvent(f.s3, f.fork, 0));
    if (report) {
        CHECK(cudaStreamIsCapturing(f.s2, &st));
        printf("s2 joined the capture: %d\n", (int)st);
    }
    CHECK(cudaMemsetAsync(f.w, 0, N * sizeof(int), f.s2));
    add_one<<<(N + 255) / 256, 256, 0, f.s2>>>(f.w, N);
    if (twice_first) twice<<<(N + 255) / 256, 256, 0, f.s3>>>(f.v, N);
    add_one<<<(N + 255) / 256, 256, 0, f.s3>>>(f.v, N);
    if (!twice_first) twice<<<(N + 255) / 256, 256, 0, f.s3>>>(f.v, N);
    CHECK(cudaEventRecord(f.j2, f.s2));
    CHECK(cudaEventRecord(f.j3, f.s3));
    CHECK(cudaStreamWaitEvent(f.s1, f.j2, 0));
    CHECK(cudaStreamWaitEvent(f.s1, f.j3, 0));
    CHECK(cudaMemcpyAsync(f.hv, f.v, N * sizeof(int), cudaMemcpyDeviceToHost, f.s1));
    CHECK(cudaMemcpyAsync(f.hw, f.w, N * sizeof(int), cudaMemcpyDeviceToHost, f.s1));
    CHECK(cudaLaunchHostFunc(f.s1, count, f.hosts));
    CHECK(cudaStreamEndCapture(f.s1, g));
    return 0;
}

static int captured() {
    int *v, *w;
    CHECK(cudaMalloc(&v, N * sizeof(int)));
    CHECK(cudaMalloc(&w, N * sizeof(int)));
    std::vector<int> hv(N), hw(N);
    int hosts = 0;
    cudaStream_t s1, s2, s3;
    CHECK(cudaStreamCreate(&s1));
    CHECK(cudaStreamCreate(&s2));
    CHECK(cudaStreamCreate(&s3));
    cudaEvent_t fork, j2, j3;
    CHECK(cudaEventCreate(&fork));
    CHECK(cudaEventCreate(&j2));
    CHECK(cudaEventCreate(&j3));

    Fork f = {s1, s2, s3, fork, j2, j3, v, w, hv.data(), hw.data(), &hosts};
    cudaStreamCaptureStatus st;
    cudaGraph_t g;
    if (capture_fork(f, cudaStreamCaptureModeGlobal, false, true, &g)) return 1;
    CHECK(cudaStreamIsCapturing(s2, &st));
    printf("after the capture s2 capturing: %d; host function ran %d times\n", (int)st, hosts);
    size_t nodes = 0, roots = 0;
    CHECK(cudaGraphGetNodes(g, nullptr, &nodes));
    CHECK(cudaGraphGetRootNodes(g, nullptr, &roots));
    printf("captured graph: %zu nodes, %zu roots\n", nodes, roots);

    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    for (int it = 0; it < 4; it++) CHECK(cudaGraphLaunch(exec, s1));
    CHECK(cudaStreamSynchronize(s1));
    long long sv = 0, sw = 0;
    for (int i = 0; i < N; i++) sv += hv[i], sw += hw[i];
    printf("after 4 launches: v sums to %lld, w to %lld, host function ran %d times\n", sv, sw,
           hosts);

    // The same work captured again updates the instantiation; a different shape
    // does not.
    cudaGraph_t g2;
    if (capture_fork(f, cudaStreamCaptureModeThreadLocal, true, false, &g2)) return 1;
    cudaGraphExecUpdateResultInfo info;
    CHECK(cudaGraphExecUpdate(exec, g2, &info));
    printf("update with the same shape: result %d\n", (int)info.result);
    CHECK(cudaGraphLaunch(exec, s1));
    CHECK(cudaStreamSynchronize(s1));
    sv = 0;
    for (int i = 0; i < N; i++) sv += hv[i];
    printf("after the update: v sums to %lld\n", sv);

    CHECK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeRelaxed));
    add_one<<<(N + 255) / 256, 256, 0, s1>>>(v, N);
    cudaGraph_t g3;
    CHECK(cudaStreamEndCapture(s1, &g3));
    cudaError_t e = cudaGraphExecUpdate(exec, g3, &info);
    printf("update with another shape: %s, result %d\n", cudaGetErrorName(e), (int)info.result);
    cudaGetLastError();

    // A graph launched into a capture becomes part of the captured graph.
    cudaGraphExec_t small;
    CHECK(cudaGraphInstantiate(&small, g3, 0));
    CHECK(cudaStreamBeginCapture(s2, cudaStreamCaptureModeGlobal));
    CHECK(cudaGraphLaunch(small, s2));
    CHECK(cudaGraphLaunch(small, s2));
    cudaGraph_t g4;
    CHECK(cudaStreamEndCapture(s2, &g4));
    CHECK(cudaGraphGetNodes(g4, nullptr, &nodes));
    cudaGraphExec_t e4;
    CHECK(cudaGraphInstantiate(&e4, g4, 0));
    CHECK(cudaMemset(v, 0, N * sizeof(int)));
    CHECK(cudaGraphLaunch(e4, s2));
    CHECK(cudaMemcpy(hv.data(), v, N * sizeof(int), cudaMemcpyDeviceToHost));
    sv = 0;
    for (int i = 0; i < N; i++) sv += hv[i];
    printf("a capture of two graph launches: %zu nodes, v sums to %lld\n", nodes, sv);

    CHECK(cudaGraphExecDestroy(e4));
    CHECK(cudaGraphExecDestroy(small));
    CHECK(cudaGraphExecDestroy(exec));
    for (cudaGraph_t x : {g, g2, g3, g4}) CHECK(cudaGraphDestroy(x));
    for (cudaEvent_t x : {fork, j2, j3}) CHECK(cudaEventDestroy(x));
    for (cudaStream_t x : {s1, s2, s3}) CHECK(cudaStreamDestroy(x));
    CHECK(cudaFree(v));
    CHECK(cudaFree(w));
    return 0;
}

static int errors() {
    int *v;
    CHECK(cudaMalloc(&v, N * sizeof(int)));
    cudaStream_t s1, s2;
    CHECK(cudaStreamCreate(&s1));
    CHECK(cudaStreamCreate(&s2));
    cudaGraph_t g = nullptr;
    cudaStreamCaptureStatus st;

    CHECK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeRelaxed));
    add_one<<<4, 256, 0, s1>>>(v, N);
    printf("synchronize while capturing: %s\n", cudaGetErrorName(cudaStreamSynchronize(s1)));
    CHECK(cudaStreamIsCapturing(s1, &st));
    printf("status after it: %d\n", (int)st);
    printf("end of the invalidated capture: %s, graph %s\n",
           cudaGetErrorName(cudaStreamEndCapture(s1, &g)), g ? "made" : "none");
    cudaGetLastError();

    cudaEvent_t e;
    CHECK(cudaEventCreate(&e));
    CHECK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
    CHECK(cudaEventRecord(e, s1));
    CHECK(cudaStreamWaitEvent(s2, e, 0));
    add_one<<<4, 256, 0, s2>>>(v, N);
    printf("end on the forked stream: %s\n", cudaGetErrorName(cudaStreamEndCapture(s2, &g)));
    cudaGetLastError();
    printf("end with the fork not joined: %s\n", cudaGetErrorName(cudaStreamEndCapture(s1, &g)));
    cudaGetLastError();
    CHECK(cudaStreamIsCapturing(s2, &st));
    printf("forked stream after it: %d\n", (int)st);

    printf("capture on the legacy stream: %s\n",
           cudaGetErrorName(cudaStreamBeginCapture(0, cudaStreamCaptureModeGlobal)));
    cudaGetLastError();
    printf("end without a capture: %s\n", cudaGetErrorName(cudaStreamEndCapture(s1, &g)));
    cudaGetLastError();

    // The stream works as before.
    CHECK(cudaMemset(v, 0, N * sizeof(int)));
    add_one<<<(N + 255) / 256, 256, 0, s1>>>(v, N);
    CHECK(cudaStreamSynchronize(s1));
    std::vector<int> hv(N);
    CHECK(cudaMemcpy(hv.data(), v, N * sizeof(int), cudaMemcpyDeviceToHost));
    long long sv = 0;
    for (int i = 0; i < N; i++) sv += hv[i];
    printf("the stream afterwards: v sums to %lld\n", sv);
    CHECK(cudaEventDestroy(e));
    CHECK(cudaStreamDestroy(s1));
    CHECK(cudaStreamDestroy(s2));
    CHECK(cudaFree(v));
    return 0;
}

int main() {
    if (manual() || captured() || errors()) return 1;
    printf("done\n");
    return 0;
}
