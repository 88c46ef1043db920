// Test data for variables.rs: `nvcc -cubin -arch=sm_75 -o variables-sm75.cubin variables.cu`
// and `nvcc -fatbin -gencode arch=compute_75,code=sm_75 -o variables-sm75.fatbin
// variables.cu` (nvcc 13.0): a cubin alone, and a fatbin holding only it.
__device__ int counter;
__constant__ float coeffs[4];
static __device__ int hidden;
extern "C" __global__ void k(int *o) { o[0] = counter + (int)coeffs[1] + hidden; }
