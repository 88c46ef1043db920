// Shared by the runtime test programs: a check that prints the failed call and its
// error's name and returns 1 from main, and two small kernels.
#include <cstdio>

#define CHECK(x)                                                                     \
    do {                                                                             \
        cudaError_t e_ = (x);                                                        \
        if (e_ != cudaSuccess) {                                                     \
            printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorName(e_)); \
            return 1;                                                                \
        }                                                                            \
    } while (0)

// v[i] = x + i, for the n elements of v.
__global__ void fill(int *v, int n, int x) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) v[i] = x + i;
}

// b[i] += a[i], for the n elements of each.
__global__ void add(const int *a, int *b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) b[i] += a[i];
}
