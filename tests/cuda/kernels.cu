// Kernels of Hira's CUDA test programs, compiled to PTX with NVRTC by the tests.

extern "C" __global__ void vector_add(const float *a, const float *b, float *c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

#define TILE 16
extern "C" __global__ void matmul(const float *A, const float *B, float *C, int n) {
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE];
    int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.f;
    for (int t = 0; t < (n + TILE - 1) / TILE; t++) {
        int ac = t * TILE + threadIdx.x, br = t * TILE + threadIdx.y;
        As[threadIdx.y][threadIdx.x] = (row < n && ac < n) ? A[row * n + ac] : 0.f;
        Bs[threadIdx.y][threadIdx.x] = (col < n && br < n) ? B[br * n + col] : 0.f;
        __syncthreads();
        for (int k = 0; k < TILE; k++) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
        __syncthreads();
    }
    if (row < n && col < n) C[row * n + col] = acc;
}

extern "C" __global__ void histogram(const unsigned char *in, unsigned int *bins, int n) {
    __shared__ unsigned int local[256];
    for (int i = threadIdx.x; i < 256; i += blockDim.x) local[i] = 0;
    __syncthreads();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        atomicAdd(&local[in[i]], 1u);
    __syncthreads();
    for (int i = threadIdx.x; i < 256; i += blockDim.x) atomicAdd(&bins[i], local[i]);
}

__device__ float scale_table[4] = {0.5f, 1.0f, 2.0f, 4.0f};

extern "C" __global__ void scale(double *x, const int *which, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * scale_table[which[i] & 3] + sqrt((double)i);
}

extern "C" __global__ void reduce_sum(const float *in, float *out, int n) {
    extern __shared__ float partial[];
    int t = threadIdx.x;
    float s = 0.f;
    for (int i = blockIdx.x * blockDim.x + t; i < n; i += blockDim.x * gridDim.x) s += in[i];
    partial[t] = s;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
        if (t < stride) partial[t] += partial[t + stride];
        __syncthreads();
    }
    if (t == 0) atomicAdd(out, partial[0]);
}

extern "C" __global__ void write_at(int *p, long offset, int v) {
    p[offset] = v;
}

// A kernel that runs as long as asked: n steps of a recurrence nothing can shorten.
extern "C" __global__ void spin(unsigned n, unsigned *out) {
    unsigned x = 1;
    for (unsigned i = 0; i < n; i++) x = x * 1664525u + 1013904223u + (x >> 7);
    *out = x;
}

// Device-side printf: each of the first n threads prints a line with a conversion of
// each kind and stores what printf returned (the number of arguments it parsed).
extern "C" __global__ void say(int n, int *returned) {
    int i = threadIdx.x;
    if (i < n) {
        returned[i] = printf("thread %d: d=%d u=%u x=%x f=%f s=%s c=%c ld=%ld w=[%5.2f]\n", i,
                             -7 * i, 4000000000u - i, 0xbeef + i, i * 0.5f, "lit", 'A' + i,
                             -10000000000L * (i + 1), 3.14159 * (i + 1));
    }
}

// A list whose nodes live in separate allocations and point at each other with raw
// device addresses (migration's test: they must stay where they were). `visits` is
// written only by kernels.
struct node {
    struct node *next;
    unsigned long long value;
};
__device__ unsigned long long visits;

extern "C" __global__ void walk(struct node *head, unsigned long long add) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    for (struct node *n = head; n; n = n->next) {
        n->value += add;
        visits++;
    }
}

extern "C" __global__ void read_visits(unsigned long long *out) {
    *out = visits;
}

// Adds k to each element of a w x h matrix of floats whose rows are `pitch` bytes apart.
extern "C" __global__ void add_pitched(float *m, unsigned long pitch, int w, int h, float k) {
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y;
    if (x < w && y < h) {
        float *row = (float *)((char *)m + y * pitch);
        row[x] += k;
    }
}
