/* Several contexts: the per-thread context stack, memory and modules per context,
 * module globals, the primary context, and the errors the driver defines. */
#include "common.h"
#include <math.h>

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    CUcontext none = (CUcontext)1;
    EXPECT(cuCtxGetCurrent(&none), CUDA_ERROR_NOT_INITIALIZED);
    CUcontext a, b, popped, cur;
    CUmodule ma = setup(argv[1], &a);
    CUdevice dev;
    CHECK(cuCtxGetDevice(&dev));
    CHECK(cuCtxCreate(&b, 0, dev));
    CHECK(cuCtxGetCurrent(&cur));
    printf("new context is current: %s\n", cur == b ? "yes" : "no");
    /* CUDA 12.5's cuCtxCreate_v4 (what CUDA 13's cuda.h calls cuCtxCreate): with
     * no parameters, or empty ones, an ordinary context, pushed as _v2's is. */
    CUcontext c4, c5, c6 = NULL;
    CHECK(cuCtxCreate_v4(&c4, NULL, 0, dev));
    CUctxCreateParams empty = {NULL, 0, NULL};
    CHECK(cuCtxCreate_v4(&c5, &empty, 0, dev));
    CHECK(cuCtxGetCurrent(&cur));
    CUctxCreateParams uncounted = {NULL, 1, NULL};
    EXPECT(cuCtxCreate_v4(&c6, &uncounted, 0, dev), CUDA_ERROR_INVALID_VALUE);
    CHECK(cuCtxPopCurrent(&popped));
    CHECK(cuCtxPopCurrent(&popped));
    CHECK(cuCtxDestroy(c4));
    CHECK(cuCtxDestroy(c5));
    CUcontext back;
    CHECK(cuCtxGetCurrent(&back));
    printf("cuCtxCreate_v4: current %s, two contexts %s, then b again %s\n",
           cur == c5 ? "yes" : "no", c4 != c5 ? "yes" : "no", back == b ? "yes" : "no");
    char *ptx = read_ptx(argv[1]);
    CUmodule mb;
    CHECK(cuModuleLoadData(&mb, ptx));
    CUfunction scale_b;
    CHECK(cuModuleGetFunction(&scale_b, mb, "scale"));
    /* A failed lookup leaves a null handle (NVIDIA's driver does so; the API does
     * not say), in a variable of its own. */
    CUfunction missing = scale_b;
    EXPECT(cuModuleGetFunction(&missing, mb, "no_such_kernel"), CUDA_ERROR_NOT_FOUND);
    printf("a failed lookup leaves a null handle: %s\n", missing == NULL ? "yes" : "no");

    /* Module globals: read the table, change it in context b only. */
    CUdeviceptr table_b;
    size_t table_size = 0;
    CHECK(cuModuleGetGlobal(&table_b, &table_size, mb, "scale_table"));
    float t[4];
    CHECK(cuMemcpyDtoH(t, table_b, sizeof t));
    printf("scale_table %zu bytes: %.1f %.1f %.1f %.1f\n", table_size, t[0], t[1], t[2], t[3]);
    float t2[4] = {10, 20, 30, 40};
    CHECK(cuMemcpyHtoD(table_b, t2, sizeof t2));

    long n = 1000;
    double *x = malloc(n * sizeof(double));
    int *w = malloc(n * sizeof(int));
    for (long i = 0; i < n; i++) {
        x[i] = (double)i / 8.0;
        w[i] = (int)(i * 3);
    }
    CUdeviceptr dx, dw;
    CHECK(cuMemAlloc(&dx, n * sizeof(double)));
    CHECK(cuMemAlloc(&dw, n * sizeof(int)));
    CHECK(cuMemcpyHtoD(dx, x, n * sizeof(double)));
    CHECK(cuMemcpyHtoD(dw, w, n * sizeof(int)));
    void *args[] = {&dx, &dw, &n};
    CHECK(cuLaunchKernel(scale_b, (n + 127) / 128, 1, 1, 128, 1, 1, 0, NULL, args, NULL));
    double *y = malloc(n * sizeof(double));
    CHECK(cuMemcpyDtoH(y, dx, n * sizeof(double)));
    int bad = 0;
    for (long i = 0; i < n; i++) {
        /* The device may fuse the multiply and the add: one rounding apart. */
        double want = x[i] * t2[w[i] & 3] + sqrt((double)i);
        if (fabs(y[i] - want) > 1e-12 * fabs(want)) bad++;
    }
    printf("scale in context b: mismatches=%d y[999]=%.6f\n", bad, y[999]);

    /* Back to context a, whose module still has the original table. */
    CHECK(cuCtxPopCurrent(&popped));
    CHECK(cuCtxGetCurrent(&cur));
    printf("popped b, a is current: %s\n", popped == b && cur == a ? "yes" : "no");
    CUdeviceptr table_a;
    CHECK(cuModuleGetGlobal(&table_a, NULL, ma, "scale_table"));
    CHECK(cuMemcpyDtoH(t, table_a, sizeof t));
    printf("context a's table unchanged: %s\n", t[2] == 2.0f ? "yes" : "no");

    /* Errors the driver defines. */
    EXPECT(cuMemFree(table_a + 4), CUDA_ERROR_INVALID_VALUE);
    CUdeviceptr big = 1;
    EXPECT(cuMemAlloc(&big, (size_t)1 << 50), CUDA_ERROR_OUT_OF_MEMORY);
    int cleared = big == 0;
    big = 1;
    EXPECT(cuMemAlloc(&big, 0), CUDA_ERROR_INVALID_VALUE);
    printf("failed allocations leave 0: %s\n", cleared && big == 0 ? "yes" : "no");
    EXPECT(cuDeviceGet(&dev, 99), CUDA_ERROR_INVALID_DEVICE);
    const char *ename = NULL, *estr = NULL;
    CHECK(cuGetErrorName(CUDA_ERROR_INVALID_VALUE, &ename));
    CHECK(cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &estr));
    printf("error names: %s / %s\n", ename, estr);

    /* The primary context. */
    CUcontext primary;
    CHECK(cuDevicePrimaryCtxRetain(&primary, dev));
    CHECK(cuCtxPushCurrent(primary));
    CUdeviceptr p;
    CHECK(cuMemAlloc(&p, 64));
    CHECK(cuMemFree(p));
    CHECK(cuCtxPopCurrent(NULL));
    CHECK(cuDevicePrimaryCtxRelease(dev));

    CHECK(cuCtxDestroy(b));
    CHECK(cuCtxDestroy(a));
    EXPECT(cuCtxPopCurrent(&popped), CUDA_ERROR_INVALID_CONTEXT);
    printf("contexts done\n");
    free(ptx);
    free(x);
    free(w);
    free(y);
    return bad != 0;
}
