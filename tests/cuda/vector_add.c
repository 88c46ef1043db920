/* Vector addition with the CUDA driver API: device queries, memory, a launch. */
#include "common.h"

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s KERNELS.ptx\n", argv[0]);
        return 2;
    }
    int version = 0, count = 0, major = 0, warp = 0;
    CHECK(cuDriverGetVersion(&version));
    CUcontext ctx;
    CUmodule mod = setup(argv[1], &ctx);
    CHECK(cuDeviceGetCount(&count));
    CHECK(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0));
    CHECK(cuDeviceGetAttribute(&warp, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 0));
    char name[256];
    size_t total = 0, free_mem = 0, total2 = 0;
    CHECK(cuDeviceGetName(name, sizeof name, 0));
    CHECK(cuDeviceTotalMem(&total, 0));
    CHECK(cuMemGetInfo(&free_mem, &total2));
    printf("devices %d, warp %d, memory reported consistently: %s\n", count, warp,
           total == total2 && free_mem <= total ? "yes" : "no");

    CUfunction f;
    CHECK(cuModuleGetFunction(&f, mod, "vector_add"));
    int n = 100003;
    size_t bytes = n * sizeof(float);
    float *a = malloc(bytes), *b = malloc(bytes), *c = malloc(bytes);
    for (int i = 0; i < n; i++) {
        a[i] = (float)(i % 1000) * 0.5f;
        b[i] = (float)(i % 77) - 30.0f;
    }
    CUdeviceptr da, db, dc;
    CHECK(cuMemAlloc(&da, bytes));
    CHECK(cuMemAlloc(&db, bytes));
    CHECK(cuMemAlloc(&dc, bytes));
    CHECK(cuMemcpyHtoD(da, a, bytes));
    CHECK(cuMemcpyHtoD(db, b, bytes));
    void *args[] = {&da, &db, &dc, &n};
    int block = 256, grid = (n + block - 1) / block;
    CHECK(cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, NULL, args, NULL));
    CHECK(cuCtxSynchronize());
    CHECK(cuMemcpyDtoH(c, dc, bytes));
    int bad = 0;
    double sum = 0;
    for (int i = 0; i < n; i++) {
        if (c[i] != a[i] + b[i]) bad++;
        sum += c[i];
    }
    printf("vector_add n=%d mismatches=%d sum=%.1f\n", n, bad, sum);
    CHECK(cuMemFree(da));
    CHECK(cuMemFree(db));
    CHECK(cuMemFree(dc));
    CHECK(cuModuleUnload(mod));
    CHECK(cuCtxDestroy(ctx));
    free(a);
    free(b);
    free(c);
    return bad != 0;
}
