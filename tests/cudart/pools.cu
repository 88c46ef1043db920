// Stream-ordered allocation and memory pools: cudaMallocAsync and cudaFreeAsync on
// streams with kernels between them, the device's default pool and one made by the
// program (its attributes, access, made the device's current pool), allocation from
// a given pool, and the errors: the default pool destroyed, a device that is not
// there.
#include "common.cuh"

static const int N = 4096;

int main() {
    int supported = 0;
    CHECK(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, 0));
    printf("memory pools supported: %d\n", supported);

    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaMemPool_t def;
    CHECK(cudaDeviceGetDefaultMemPool(&def, 0));
    unsigned long long threshold = ~0ull;
    CHECK(cudaMemPoolSetAttribute(def, cudaMemPoolAttrReleaseThreshold, &threshold));

    long long total = 0;
    static int h[N];
    for (int round = 0; round < 3; round++) {
        int *a, *b;
        CHECK(cudaMallocAsync(&a, N * sizeof(int), s));
        CHECK(cudaMallocAsync(&b, N * sizeof(int), s));
        fill<<<N / 256, 256, 0, s>>>(a, N, round);
        fill<<<N / 256, 256, 0, s>>>(b, N, 1000);
        add<<<N / 256, 256, 0, s>>>(a, b, N);
        CHECK(cudaMemcpyAsync(h, b, sizeof h, cudaMemcpyDeviceToHost, s));
        CHECK(cudaFreeAsync(a, s));
        CHECK(cudaFreeAsync(b, s));
        CHECK(cudaStreamSynchronize(s));
        for (int i = 0; i < N; i++) total += h[i];
    }
    printf("three rounds: total %lld (expect %lld)\n", total,
           3LL * N * 1000 + 3LL * N + 3LL * N * (N - 1));

    unsigned long long used = 1, high = 0;
    CHECK(cudaMemPoolGetAttribute(def, cudaMemPoolAttrUsedMemCurrent, &used));
    printf("default pool in use after the frees: %llu\n", used);

    cudaMemPoolProps props = {};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = 0;
    cudaMemPool_t mine;
    CHECK(cudaMemPoolCreate(&mine, &props));
    cudaMemAccessDesc access = {};
    access.location = props.location;
    access.flags = cudaMemAccessFlagsProtReadWrite;
    CHECK(cudaMemPoolSetAccess(mine, &access, 1));
    cudaMemAccessFlags flags;
    CHECK(cudaMemPoolGetAccess(&flags, mine, &props.location));
    printf("access to the new pool: %d\n", (int)flags);
    int *c, *d;
    CHECK(cudaMallocFromPoolAsync(&c, 1000 * sizeof(int), mine, s));
    CHECK(cudaDeviceSetMemPool(0, mine));
    cudaMemPool_t cur;
    CHECK(cudaDeviceGetMemPool(&cur, 0));
    printf("the new pool is current: %s\n", cur == mine ? "yes" : "no");
    CHECK(cudaMallocAsync(&d, 3000 * sizeof(int), s));
    CHECK(cudaMemPoolGetAttribute(mine, cudaMemPoolAttrUsedMemCurrent, &used));
    printf("new pool in use: %llu bytes\n", used);
    CHECK(cudaFreeAsync(c, s));
    CHECK(cudaMemPoolGetAttribute(mine, cudaMemPoolAttrUsedMemHigh, &high));
    CHECK(cudaMemPoolGetAttribute(mine, cudaMemPoolAttrUsedMemCurrent, &used));
    printf("after one free: in use %llu, high %llu\n", used, high);
    unsigned long long zero = 0;
    CHECK(cudaMemPoolSetAttribute(mine, cudaMemPoolAttrUsedMemHigh, &zero));
    CHECK(cudaMemPoolGetAttribute(mine, cudaMemPoolAttrUsedMemHigh, &high));
    printf("high reset: %llu\n", high);
    CHECK(cudaFreeAsync(d, s));
    CHECK(cudaMemPoolTrimTo(mine, 0));
    CHECK(cudaStreamSynchronize(s));

    printf("destroying the default pool: %s\n", cudaGetErrorName(cudaMemPoolDestroy(def)));
    cudaGetLastError();
    CHECK(cudaMemPoolDestroy(mine));
    CHECK(cudaDeviceGetMemPool(&cur, 0));
    printf("current pool after the new one went: %s\n", cur == def ? "the default" : "another");

    printf("a device that is not there: %s\n", cudaGetErrorName(cudaDeviceGetMemPool(&cur, 99)));
    cudaGetLastError();
    CHECK(cudaStreamDestroy(s));
    printf("done\n");
    return 0;
}
