/* Two streams with asynchronous copies, events and their elapsed time, atomics in
 * shared and global memory, dynamic shared memory, pinned host memory. */
#include "common.h"

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    CUcontext ctx;
    CUmodule mod = setup(argv[1], &ctx);
    CUfunction hist, reduce;
    CHECK(cuModuleGetFunction(&hist, mod, "histogram"));
    CHECK(cuModuleGetFunction(&reduce, mod, "reduce_sum"));
    CUstream s1, s2;
    CHECK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
    CHECK(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    CUevent start, stop;
    CHECK(cuEventCreate(&start, CU_EVENT_DEFAULT));
    CHECK(cuEventCreate(&stop, CU_EVENT_DEFAULT));

    int n = 50000;
    unsigned char *in;
    CHECK(cuMemAllocHost((void **)&in, n));
    for (int i = 0; i < n; i++) in[i] = (unsigned char)((i * 31 + i / 7) & 0xFF);
    CUdeviceptr din, dbins;
    CHECK(cuMemAlloc(&din, n));
    CHECK(cuMemAlloc(&dbins, 256 * sizeof(unsigned)));
    CHECK(cuMemsetD8(dbins, 0, 256 * sizeof(unsigned)));
    CHECK(cuEventRecord(start, s1));
    CHECK(cuMemcpyHtoDAsync(din, in, n, s1));
    void *hargs[] = {&din, &dbins, &n};
    CHECK(cuLaunchKernel(hist, 8, 1, 1, 128, 1, 1, 0, s1, hargs, NULL));
    unsigned bins[256];
    CHECK(cuMemcpyDtoHAsync(bins, dbins, sizeof bins, s1));
    CHECK(cuEventRecord(stop, s1));

    int m = 40000;
    float *x = malloc(m * sizeof(float));
    double want = 0;
    for (int i = 0; i < m; i++) {
        x[i] = (float)(i % 10);
        want += x[i];
    }
    CUdeviceptr dx, dsum;
    CHECK(cuMemAlloc(&dx, m * sizeof(float)));
    CHECK(cuMemAlloc(&dsum, sizeof(float)));
    CHECK(cuMemsetD32Async(dsum, 0, 1, s2));
    CHECK(cuMemcpyHtoDAsync(dx, x, m * sizeof(float), s2));
    void *rargs[] = {&dx, &dsum, &m};
    CHECK(cuLaunchKernel(reduce, 16, 1, 1, 256, 1, 1, 256 * sizeof(float), s2, rargs, NULL));
    float sum = 0;
    CHECK(cuMemcpyDtoHAsync(&sum, dsum, sizeof sum, s2));

    CHECK(cuStreamSynchronize(s1));
    CHECK(cuStreamSynchronize(s2));
    CHECK(cuEventSynchronize(stop));
    CHECK(cuEventQuery(stop));
    CHECK(cuStreamQuery(s1));
    float ms = -1;
    CHECK(cuEventElapsedTime(&ms, start, stop));

    unsigned want_bins[256] = {0};
    for (int i = 0; i < n; i++) want_bins[in[i]]++;
    int bad = 0;
    long total = 0;
    for (int i = 0; i < 256; i++) {
        if (bins[i] != want_bins[i]) bad++;
        total += bins[i];
    }
    printf("histogram n=%d bins_wrong=%d counted=%ld\n", n, bad, total);
    printf("reduce m=%d sum=%.1f expected=%.1f\n", m, sum, want);
    printf("elapsed time measured: %s\n", ms >= 0 ? "yes" : "no");

    CUevent untimed;
    CHECK(cuEventCreate(&untimed, CU_EVENT_DISABLE_TIMING));
    CHECK(cuEventRecord(untimed, s2));
    EXPECT(cuEventElapsedTime(&ms, start, untimed), CUDA_ERROR_INVALID_HANDLE);
    CHECK(cuEventDestroy(untimed));
    CHECK(cuEventDestroy(start));
    CHECK(cuEventDestroy(stop));
    CHECK(cuStreamDestroy(s1));
    CHECK(cuStreamDestroy(s2));
    CHECK(cuMemFreeHost(in));
    CHECK(cuCtxDestroy(ctx));
    free(x);
    return bad != 0 || sum != (float)want;
}
