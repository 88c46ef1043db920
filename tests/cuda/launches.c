/* Many short launches and one synchronisation, as launch-bound programs do: what
 * remoting costs per launch. `launches KERNELS.ptx [COUNT]`. */
#include "common.h"

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    long count = argc > 2 ? atol(argv[2]) : 5000;
    CUcontext ctx;
    CUmodule mod = setup(argv[1], &ctx);
    CUfunction f;
    CHECK(cuModuleGetFunction(&f, mod, "write_at"));
    CUdeviceptr d;
    CHECK(cuMemAlloc(&d, 64 * sizeof(int)));
    for (long i = 0; i < count; i++) {
        long off = i % 64;
        int v = (int)i;
        void *args[] = {&d, &off, &v};
        CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL));
    }
    CHECK(cuCtxSynchronize());
    int out[64];
    CHECK(cuMemcpyDtoH(out, d, sizeof out));
    long sum = 0;
    for (int i = 0; i < 64; i++) sum += out[i];
    printf("launches %ld, last values sum %ld\n", count, sum);
    CHECK(cuCtxDestroy(ctx));
    return 0;
}
