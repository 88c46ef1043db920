/* A kernel that writes outside every allocation: the launch returns, the fault is
 * reported by the next synchronising call and sticks to the context. */
#include "common.h"

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    CUcontext ctx;
    CUmodule mod = setup(argv[1], &ctx);
    CUfunction f;
    CHECK(cuModuleGetFunction(&f, mod, "write_at"));
    CUdeviceptr d;
    CHECK(cuMemAlloc(&d, 64));
    long off = 0;
    int v = 7;
    void *ok[] = {&d, &off, &v};
    CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, ok, NULL));
    CHECK(cuCtxSynchronize());
    off = 1L << 40;
    void *bad[] = {&d, &off, &v};
    CUresult launch = cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, bad, NULL);
    CUresult sync = cuCtxSynchronize();
    CUresult after = cuMemAlloc(&d, 64);
    const char *name = NULL;
    cuGetErrorName(sync, &name);
    printf("launch %d, synchronize %s, later calls fail too: %s\n", (int)launch, name,
           after == sync ? "yes" : "no");
    return sync != CUDA_ERROR_ILLEGAL_ADDRESS;
}
