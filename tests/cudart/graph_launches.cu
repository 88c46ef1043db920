// Launch overhead of CUDA graphs: a graph of 20 launches of a tiny kernel, made by
// stream capture, launched N/20 times (N = 40,000 by default), then one
// synchronisation; beside launches.cu, which makes the same N launches directly.
#include <cstdio>
#include <cstdlib>

__global__ void bump(unsigned *count) {
    if (threadIdx.x == 0) atomicAdd(count, 1u);
}

static const int PER_GRAPH = 20;

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 40000;
    unsigned *d;
    cudaStream_t s;
    if (cudaMalloc(&d, sizeof *d) != cudaSuccess || cudaMemset(d, 0, sizeof *d) != cudaSuccess ||
        cudaStreamCreate(&s) != cudaSuccess) {
        fprintf(stderr, "setup failed\n");
        return 1;
    }
    cudaGraph_t g;
    cudaGraphExec_t exec;
    cudaError_t e = cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    for (int i = 0; e == cudaSuccess && i < PER_GRAPH; i++) {
        bump<<<1, 32, 0, s>>>(d);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess) e = cudaStreamEndCapture(s, &g);
    if (e == cudaSuccess) e = cudaGraphInstantiate(&exec, g, 0);
    for (int i = 0; e == cudaSuccess && i < n / PER_GRAPH; i++) e = cudaGraphLaunch(exec, s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    unsigned h = 0;
    if (e == cudaSuccess) e = cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) {
        fprintf(stderr, "graph launches: %s\n", cudaGetErrorString(e));
        return 1;
    }
    int want = n / PER_GRAPH * PER_GRAPH;
    printf("%d launches in %d graph launches, %u counted\n", want, n / PER_GRAPH, h);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(g);
    cudaStreamDestroy(s);
    cudaFree(d);
    return h != (unsigned)want;
}
