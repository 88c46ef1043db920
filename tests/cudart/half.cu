// Half precision as cuda_fp16.h writes it: conversions, scalar and paired
// arithmetic, comparisons, and a dot product of half2 vectors accumulated in float.
// Each device result is checked against the same functions run on the host
// (cuda_fp16.h's host implementations).
#include <cuda_fp16.h>
#include <cstdio>

#define N 256

__global__ void halves(const float *in, unsigned short *out, float *dot) {
    int i = threadIdx.x;
    __half a = __float2half(in[i]), b = __float2half(in[(i + 7) % N]);
    __half2 p = __halves2half2(a, b), q = __halves2half2(b, a);
    __half r[12];
    r[0] = __hadd(a, b);
    r[1] = __hsub(a, b);
    r[2] = __hmul(a, b);
    r[3] = __hfma(a, b, __float2half(0.5f));
    r[4] = __hneg(a);
    r[5] = __habs(a);
    r[6] = __hmin(a, b);
    r[7] = __hmax(a, b);
    __half2 s = __hfma2(p, q, __hadd2(p, q));
    r[8] = __low2half(s);
    r[9] = __high2half(__hmul2(p, q));
    r[10] = __int2half_rn(i * 37 - 4000);
    r[11] = __hlt(a, b) ? a : b;
    for (int k = 0; k < 12; k++) out[i * 12 + k] = __half_as_ushort(r[k]);
    __shared__ float part[N];
    part[i] = __half2float(__low2half(__hmul2(p, p))) + __half2float(__high2half(__hmul2(p, p)));
    __syncthreads();
    if (i == 0) {
        float t = 0;
        for (int k = 0; k < N; k++) t += part[k];
        *dot = t;
    }
}

int main() {
    float in[N];
    for (int i = 0; i < N; i++) in[i] = (i % 17) * 0.37f - 2.5f + i * 0.001f;
    float *d_in, *d_dot;
    unsigned short *d_out, out[N * 12];
    cudaMalloc(&d_in, sizeof in);
    cudaMalloc(&d_out, sizeof out);
    cudaMalloc(&d_dot, sizeof(float));
    cudaMemcpy(d_in, in, sizeof in, cudaMemcpyHostToDevice);
    halves<<<1, N>>>(d_in, d_out, d_dot);
    cudaError_t e = cudaMemcpy(out, d_out, sizeof out, cudaMemcpyDeviceToHost);
    float dot = 0;
    cudaMemcpy(&dot, d_dot, sizeof dot, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) {
        printf("%s\n", cudaGetErrorString(e));
        return 1;
    }
    int bad = 0;
    float want_dot = 0;
    for (int i = 0; i < N; i++) {
        __half a = __float2half(in[i]), b = __float2half(in[(i + 7) % N]);
        float fa = __half2float(a), fb = __half2float(b);
        __half w[12];
        w[0] = __float2half(fa + fb);
        w[1] = __float2half(fa - fb);
        w[2] = __float2half(fa * fb);
        w[3] = __float2half(fa * fb + 0.5f);
        w[4] = __float2half(-fa);
        w[5] = __float2half(fa < 0 ? -fa : fa);
        w[6] = fa < fb ? a : b;
        w[7] = fa > fb ? a : b;
        float sum = __half2float(__float2half(fa + fb));
        w[8] = __float2half(fa * fb + sum);
        w[9] = __float2half(fb * fa);
        w[10] = __float2half((float)(i * 37 - 4000));
        w[11] = fa < fb ? a : b;
        for (int k = 0; k < 12; k++) {
            unsigned short g = out[i * 12 + k], x = __half_as_ushort(w[k]);
            if (g != x) {
                if (bad < 8) printf("MISMATCH thread %d result %d: %04x, expected %04x\n", i, k, g, x);
                bad++;
            }
        }
        want_dot += __half2float(__float2half(fa * fa)) + __half2float(__float2half(fb * fb));
    }
    printf("half results: %s\n", bad ? "FAILED" : "ok");
    printf("half2 dot product: %s\n", dot == want_dot ? "ok" : "FAILED");
    return bad || dot != want_dot;
}
