/* A launch the device refuses for a reason the caller cannot see beforehand, then
 * a synchronisation: prints what each returned. Natively the launch returns the
 * error; through Hira, where launches go without waiting, the synchronisation does
 * (CUDA reports asynchronous errors at a later call). Then a launch of a function
 * whose module was unloaded: refused at once both ways. */
#include "common.h"

static const char *name_of(CUresult r) {
    const char *n = NULL;
    cuGetErrorName(r, &n);
    return n ? n : "?";
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    CUcontext ctx;
    CUmodule mod = setup(argv[1], &ctx);
    CUfunction f;
    CHECK(cuModuleGetFunction(&f, mod, "vector_add"));
    int n = 64;
    CUdeviceptr a, b, c;
    CHECK(cuMemAlloc(&a, n * 4));
    CHECK(cuMemAlloc(&b, n * 4));
    CHECK(cuMemAlloc(&c, n * 4));
    void *args[] = {&a, &b, &c, &n};
    CUresult launch = cuLaunchKernel(f, 1, 1, 1, 64, 1, 1, 0, NULL, args, NULL);
    CUresult sync = cuCtxSynchronize();
    printf("launch %s, then synchronize %s\n", name_of(launch), name_of(sync));
    /* A memset outside every allocation is refused at once, on a stream too. */
    CUresult outside = cuMemsetD32Async(c + 1024 * 1024, 0, 4, NULL);
    CUresult inside = cuMemsetD32Async(c, 7, n, NULL);
    CHECK(cuCtxSynchronize());
    int back[64];
    CHECK(cuMemcpyDtoH(back, c, sizeof back));
    printf("memset outside: %s, inside: %s, c[63] = %d\n", name_of(outside), name_of(inside), back[63]);
    CHECK(cuModuleUnload(mod));
    launch = cuLaunchKernel(f, 1, 1, 1, 64, 1, 1, 0, NULL, args, NULL);
    printf("launch of an unloaded module's function: %s\n", name_of(launch));
    CHECK(cuCtxDestroy(ctx));
    return 0;
}
