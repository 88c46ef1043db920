/* Device-side printf: a kernel's lines reach standard output when the context is
 * synchronised, after what the program printed before the launch and before what it
 * prints after; printf returns the number of arguments it parsed, and the FIFO's size
 * cannot change once a kernel that prints has been launched. */
#include "common.h"

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s KERNELS.ptx\n", argv[0]);
        return 2;
    }
    CUcontext ctx;
    CUmodule mod = setup(argv[1], &ctx);
    CUfunction say;
    CHECK(cuModuleGetFunction(&say, mod, "say"));
    int n = 3;
    CUdeviceptr returned;
    CHECK(cuMemAlloc(&returned, n * sizeof(int)));

    printf("before\n");
    /* The driver writes the kernel's lines to descriptor 1 itself, past stdio. */
    fflush(stdout);
    /* One warp; the threads from n on print nothing. */
    void *args[] = {&n, &returned};
    CHECK(cuLaunchKernel(say, 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL));
    CHECK(cuCtxSynchronize());
    printf("after\n");

    int r[3] = {0};
    CHECK(cuMemcpyDtoH(r, returned, sizeof r));
    printf("printf returned %d %d %d\n", r[0], r[1], r[2]);
    CUresult late = cuCtxSetLimit(CU_LIMIT_PRINTF_FIFO_SIZE, 4096);
    const char *name = NULL;
    cuGetErrorName(late, &name);
    printf("setting the printf FIFO size after such a launch: %s\n", name ? name : "?");
    fflush(stdout);

    CHECK(cuMemFree(returned));
    CHECK(cuModuleUnload(mod));
    CHECK(cuCtxDestroy(ctx));
    return 0;
}
