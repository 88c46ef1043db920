/* Context and function settings programs and libraries query and set: flags,
 * limits, cache configuration, stream priorities and flags, peer access, function
 * attributes and occupancy. */
#include "common.h"

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    CUcontext ctx;
    CUmodule mod = setup(argv[1], &ctx);
    unsigned flags = 99;
    CHECK(cuCtxGetFlags(&flags));
    size_t stack = 0, heap = 0;
    CHECK(cuCtxGetLimit(&stack, CU_LIMIT_STACK_SIZE));
    CHECK(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 4096));
    CHECK(cuCtxGetLimit(&stack, CU_LIMIT_STACK_SIZE));
    CHECK(cuCtxGetLimit(&heap, CU_LIMIT_MALLOC_HEAP_SIZE));
    EXPECT(cuCtxGetLimit(&heap, (CUlimit)77), CUDA_ERROR_INVALID_VALUE);
    printf("flags %u, stack %zu, heap %zu\n", flags, stack, heap);
    int least = 1, greatest = 1;
    CHECK(cuCtxGetStreamPriorityRange(&least, &greatest));
    CUstream s;
    CHECK(cuStreamCreateWithPriority(&s, CU_STREAM_NON_BLOCKING, greatest));
    int prio = 1;
    unsigned sflags = 9;
    CHECK(cuStreamGetPriority(s, &prio));
    CHECK(cuStreamGetFlags(s, &sflags));
    printf("priorities %d..%d, stream priority %d flags %u\n", least, greatest, prio, sflags);
    CUfunc_cache cc;
    CHECK(cuCtxSetCacheConfig(CU_FUNC_CACHE_PREFER_SHARED));
    CHECK(cuCtxGetCacheConfig(&cc));
    int peer = 7;
    CHECK(cuDeviceCanAccessPeer(&peer, 0, 0));
    printf("cache config %d, peer access %d\n", (int)cc, peer);
    CUfunction reduce;
    CHECK(cuModuleGetFunction(&reduce, mod, "reduce_sum"));
    int dyn = 0, blocks = 0;
    CHECK(cuFuncSetAttribute(reduce, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 2048));
    CHECK(cuFuncGetAttribute(&dyn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, reduce));
    CHECK(cuFuncSetCacheConfig(reduce, CU_FUNC_CACHE_PREFER_L1));
    CHECK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, reduce, 256, 1024));
    printf("dynamic shared %d, blocks per multiprocessor %d\n", dyn, blocks);
    /* A launch asking more dynamic shared memory than the function now allows. */
    CUdeviceptr in, out;
    int n = 256;
    CHECK(cuMemAlloc(&in, n * sizeof(float)));
    CHECK(cuMemAlloc(&out, sizeof(float)));
    void *args[] = {&in, &out, &n};
    CUresult big = cuLaunchKernel(reduce, 1, 1, 1, 256, 1, 1, 4096, s, args, NULL);
    CUresult fits = cuLaunchKernel(reduce, 1, 1, 1, 256, 1, 1, 1024, s, args, NULL);
    CHECK(cuStreamSynchronize(s));
    printf("launch with 4096 B: %d, with 1024 B: %d\n", (int)big, (int)fits);
    CHECK(cuStreamDestroy(s));
    CHECK(cuCtxDestroy(ctx));
    return 0;
}
