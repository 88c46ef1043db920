/* Transfers of every kind and of sizes that are not multiples of anything: host to
 * device, device to device, device to host, synchronous and on a stream, at offsets
 * inside allocations, and memset. `transfer KERNELS.ptx [BYTES]`. */
#include "common.h"
#include <stdint.h>

static unsigned char pattern(size_t i) { return (unsigned char)((i * 131 + (i >> 9)) & 0xFF); }

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    size_t n = argc > 2 ? strtoull(argv[2], NULL, 10) : (5u << 20) + 123;
    CUcontext ctx;
    setup(argv[1], &ctx);
    unsigned char *src = malloc(n), *dst = malloc(n);
    for (size_t i = 0; i < n; i++) src[i] = pattern(i);
    CUdeviceptr a, b;
    CHECK(cuMemAlloc(&a, n + 64));
    CHECK(cuMemAlloc(&b, n + 64));
    CUstream s;
    CHECK(cuStreamCreate(&s, 0));
    CHECK(cuMemcpyHtoD(a + 7, src, n));
    CHECK(cuMemcpyDtoD(b + 3, a + 7, n));
    memset(dst, 0, n);
    CHECK(cuMemcpyDtoH(dst, b + 3, n));
    int sync_ok = memcmp(src, dst, n) == 0;
    CHECK(cuMemsetD8(a, 0x5A, n + 64));
    CHECK(cuMemcpyHtoDAsync(a + 1, src, n, s));
    memset(dst, 0, n);
    CHECK(cuMemcpyDtoHAsync(dst, a + 1, n, s));
    CHECK(cuStreamSynchronize(s));
    int async_ok = memcmp(src, dst, n) == 0;
    unsigned char edge[2];
    CHECK(cuMemcpyDtoH(&edge[0], a, 1));
    CHECK(cuMemcpyDtoH(&edge[1], a + 1 + n, 1));
    printf("transfer %zu bytes: synchronous %s, on a stream %s, around it %02x %02x\n", n,
           sync_ok ? "same" : "DIFFERENT", async_ok ? "same" : "DIFFERENT", edge[0], edge[1]);
    EXPECT(cuMemcpyHtoD(a + n + 60, src, 64), CUDA_ERROR_INVALID_VALUE);
    /* Unified addressing: cuMemcpy finds each side's memory by its address. */
    memset(dst, 0, n);
    CHECK(cuMemcpy(a + 5, (CUdeviceptr)(uintptr_t)src, n));
    CHECK(cuMemcpy(b, a + 5, n));
    CHECK(cuMemcpyAsync((CUdeviceptr)(uintptr_t)dst, b, n, s));
    CHECK(cuStreamSynchronize(s));
    int unified_ok = memcmp(src, dst, n) == 0;
    unsigned char h1[16] = "hira unified cp", h2[16] = {0};
    CHECK(cuMemcpy((CUdeviceptr)(uintptr_t)h2, (CUdeviceptr)(uintptr_t)h1, sizeof h1));
    printf("unified copies %s, host to host %s\n", unified_ok ? "same" : "DIFFERENT",
           memcmp(h1, h2, sizeof h1) ? "DIFFERENT" : "same");
    CHECK(cuStreamDestroy(s));
    CHECK(cuCtxDestroy(ctx));
    free(src);
    free(dst);
    return !(sync_ok && async_ok && unified_ok);
}
