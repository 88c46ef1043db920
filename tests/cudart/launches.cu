// Launch overhead as runtime programs see it: N launches of a tiny kernel with the
// <<<>>> syntax (40,000 by default), then one synchronisation.
#include <cstdio>
#include <cstdlib>

__global__ void bump(unsigned *count) {
    if (threadIdx.x == 0) atomicAdd(count, 1u);
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 40000;
    unsigned *d;
    if (cudaMalloc(&d, sizeof *d) != cudaSuccess || cudaMemset(d, 0, sizeof *d) != cudaSuccess) {
        fprintf(stderr, "setup failed\n");
        return 1;
    }
    for (int i = 0; i < n; i++) bump<<<1, 32>>>(d);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    unsigned h = 0;
    if (e == cudaSuccess) e = cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) {
        fprintf(stderr, "launches: %s\n", cudaGetErrorString(e));
        return 1;
    }
    printf("%d launches, %u counted\n", n, h);
    cudaFree(d);
    return h != (unsigned)n;
}
