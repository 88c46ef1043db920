/* Tiled matrix multiplication: shared memory and barriers, a 2-D grid. */
#include "common.h"

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    CUcontext ctx;
    CUmodule mod = setup(argv[1], &ctx);
    CUfunction f;
    CHECK(cuModuleGetFunction(&f, mod, "matmul"));
    int n = 70; /* not a multiple of the tile: edges are exercised */
    size_t bytes = (size_t)n * n * sizeof(float);
    float *a = malloc(bytes), *b = malloc(bytes), *c = malloc(bytes);
    for (int i = 0; i < n * n; i++) {
        a[i] = (float)((i * 7) % 13) - 6.0f;
        b[i] = (float)((i * 5) % 11) * 0.25f;
    }
    CUdeviceptr da, db, dc;
    CHECK(cuMemAlloc(&da, bytes));
    CHECK(cuMemAlloc(&db, bytes));
    CHECK(cuMemAlloc(&dc, bytes));
    CHECK(cuMemcpyHtoD(da, a, bytes));
    CHECK(cuMemcpyHtoD(db, b, bytes));
    CHECK(cuMemsetD32(dc, 0, (size_t)n * n));
    void *args[] = {&da, &db, &dc, &n};
    int g = (n + 15) / 16;
    CHECK(cuLaunchKernel(f, g, g, 1, 16, 16, 1, 0, NULL, args, NULL));
    CHECK(cuMemcpyDtoH(c, dc, bytes));
    int bad = 0;
    double trace = 0;
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < n; j++) {
            float s = 0;
            for (int k = 0; k < n; k++) s += a[i * n + k] * b[k * n + j];
            if (s != c[i * n + j]) bad++;
        }
        trace += c[i * n + i];
    }
    printf("matmul n=%d mismatches=%d trace=%.2f\n", n, bad, trace);
    CHECK(cuCtxDestroy(ctx));
    return bad != 0;
}
