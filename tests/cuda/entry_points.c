/* Entry points: what cuGetProcAddress hands out works like the linked function, and
 * an entry point Hira does not remote exists and fails with CUDA_ERROR_NOT_SUPPORTED
 * (run through Hira only: the CPU test executor lacks it altogether). */
#include "common.h"

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    CUcontext ctx;
    setup(argv[1], &ctx);
    void *pfn = NULL;
    CUdriverProcAddressQueryResult found;
    CHECK(cuGetProcAddress("cuMemAlloc", &pfn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &found));
    CUdeviceptr p = 0;
    CHECK(((alloc_fn)pfn)(&p, 256));
    printf("cuMemAlloc through cuGetProcAddress: %s\n", p != 0 && found == CU_GET_PROC_ADDRESS_SUCCESS ? "yes" : "no");
    CHECK(cuMemFree(p));
    CUresult r = cuGetProcAddress("cuNoSuchFunction", &pfn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &found);
    printf("unknown symbol: %d, status %d\n", (int)r, (int)found);
    CUdeviceptr managed = 0;
    r = cuMemAllocManaged(&managed, 256, CU_MEM_ATTACH_GLOBAL);
    const char *name = NULL;
    cuGetErrorName(r, &name);
    printf("cuMemAllocManaged: %s\n", name);
    /* Device properties asked again and again (as libraries do). */
    int warp = 0, sum = 0;
    for (int i = 0; i < 1000; i++) {
        CHECK(cuDeviceGetAttribute(&warp, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 0));
        sum += warp;
    }
    printf("warp size asked 1000 times: %d\n", sum / 1000);
    /* Features Hira does not remote read as absent, whatever the host's device has. */
    int pools = -1, managed_memory = -1;
    CHECK(cuDeviceGetAttribute(&pools, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 0));
    CHECK(cuDeviceGetAttribute(&managed_memory, CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, 0));
    printf("memory pools: %d, managed memory: %d\n", pools, managed_memory);
    CHECK(cuCtxDestroy(ctx));
    return r != CUDA_ERROR_NOT_SUPPORTED;
}
