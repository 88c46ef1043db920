// Warp-level programming as CUDA programs, cooperative groups and CUB write it:
// shuffles (all four modes, sub-warp widths), votes, __activemask in divergent code,
// __match_any/all_sync, __syncwarp, warp-aggregated atomics, the bit instructions
// behind __brev/__ffs and bit fields, fences and sleeps, %globaltimer, and inline
// assembly that opens a scope on one line. Every result is checked on the host
// against what the CUDA Programming Guide defines; the program prints each check.
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#include <cstdio>
#include <cstdlib>

namespace cg = cooperative_groups;

#define FULL 0xffffffffu
// Values per thread written by `lanes`.
#define PER 16

__global__ void lanes(unsigned *out) {
    unsigned t = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned lane = threadIdx.x % 32;
    unsigned v = lane * 3 + blockIdx.x * 100;
    unsigned *o = out + t * PER;
    o[0] = __shfl_sync(FULL, v, 5);
    o[1] = __shfl_up_sync(FULL, v, 2);
    o[2] = __shfl_down_sync(FULL, v, 3);
    o[3] = __shfl_xor_sync(FULL, v, 1);
    o[4] = __shfl_sync(FULL, v, 3, 8);
    o[5] = __shfl_down_sync(FULL, v, 1, 8);
    o[6] = __shfl_up_sync(FULL, v, 1, 16);
    o[7] = __ballot_sync(FULL, lane % 3 == 0);
    o[8] = __all_sync(FULL, lane < 32) + 2 * __any_sync(FULL, lane == 40) +
           4 * __all_sync(FULL, lane % 3 == 0) + 8 * __any_sync(FULL, lane == 7);
    o[9] = __match_any_sync(FULL, lane / 4);
    int pred = 0;
    o[10] = __match_all_sync(FULL, blockIdx.x, &pred);
    o[11] = pred;
    o[12] = 0;
    if (lane & 1) o[12] = __activemask();
    // A warp sum through shared memory, ordered by __syncwarp.
    __shared__ unsigned s[64];
    s[threadIdx.x] = v;
    __syncwarp();
    for (int off = 16; off > 0; off /= 2) {
        if (lane < off) s[threadIdx.x] += s[threadIdx.x + off];
        __syncwarp();
    }
    o[13] = s[threadIdx.x - lane];
    // The same sum by shuffles, and by a cooperative-groups tile of 16.
    unsigned sum = v;
    for (int off = 16; off > 0; off /= 2) sum += __shfl_down_sync(FULL, sum, off);
    o[14] = __shfl_sync(FULL, sum, 0);
    auto tile = cg::tiled_partition<16>(cg::this_thread_block());
    o[15] = cg::reduce(tile, v, cg::plus<unsigned>());
}

// Warp-aggregated increments: one atomic per warp's group of active lanes, each lane
// getting a distinct slot.
__global__ void aggregated(const int *in, int *slots, int *count, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && in[i] > 0) {
        unsigned mask = __activemask();
        int leader = __ffs(mask) - 1;
        int lane = threadIdx.x % 32;
        int base = 0;
        if (lane == leader) base = atomicAdd(count, __popc(mask));
        base = __shfl_sync(mask, base, leader);
        slots[i] = base + __popc(mask & ((1u << lane) - 1));
    } else if (i < n) {
        slots[i] = -1;
    }
}

__global__ void bits(const unsigned *in, unsigned *out, unsigned long long *timer) {
    unsigned x = in[threadIdx.x];
    unsigned *o = out + threadIdx.x * 8;
    o[0] = __brev(x);
    o[1] = __ffs(x);
    o[2] = __clz(x);
    asm("bfe.u32 %0, %1, 4, 8;" : "=r"(o[3]) : "r"(x));
    int se;
    asm("bfe.s32 %0, %1, 28, 4;" : "=r"(se) : "r"(x));
    o[4] = se;
    asm("bfi.b32 %0, %1, %2, 8, 12;" : "=r"(o[5]) : "r"(x), "r"(0xf0f0f0f0u));
    asm("bmsk.clamp.b32 %0, %1, %2;" : "=r"(o[6]) : "r"(x & 31), "r"((x >> 5) & 63));
    // A scope opened and closed on one line, as cuda_fp16.h and CUB write them.
    asm("{ .reg .u32 t; add.u32 t, %1, 5; mov.u32 %0, t; }" : "=r"(o[7]) : "r"(x));
    __threadfence();
    __threadfence_block();
    __nanosleep(100);
    unsigned long long t0, t1;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
    if (threadIdx.x == 0) {
        timer[0] = t0;
        timer[1] = t1;
    }
}

// Block-wide votes: a barrier that also reduces a predicate (bar.red).
__global__ void block_votes(const unsigned *in, int *out) {
    unsigned x = in[threadIdx.x];
    int c = __syncthreads_count(x & 1);
    int o = __syncthreads_or(x == 0xdeadbeefu);
    int a = __syncthreads_and(x != 12345u);
    int n = __syncthreads_and(x & 1);
    if (threadIdx.x == 5) {
        out[0] = c;
        out[1] = o;
        out[2] = a;
        out[3] = n;
    }
}

#define CHECK(x)                                                                     \
    do {                                                                             \
        cudaError_t e = (x);                                                         \
        if (e != cudaSuccess) {                                                      \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x,               \
                    cudaGetErrorString(e));                                          \
            return 1;                                                                \
        }                                                                            \
    } while (0)

static int failures = 0;

static void expect(const char *what, unsigned got, unsigned want, unsigned t) {
    if (got != want) {
        if (failures < 10)
            printf("MISMATCH %s thread %u: %u, expected %u\n", what, t, got, want);
        failures++;
    }
}

static unsigned brev(unsigned x) {
    unsigned r = 0;
    for (int i = 0; i < 32; i++) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}

int main() {
    const int blocks = 3, threads = 64, total = blocks * threads;
    unsigned *d_out;
    CHECK(cudaMalloc(&d_out, total * PER * sizeof(unsigned)));
    lanes<<<blocks, threads>>>(d_out);
    CHECK(cudaGetLastError());
    unsigned *out = (unsigned *)malloc(total * PER * sizeof(unsigned));
    CHECK(cudaMemcpy(out, d_out, total * PER * sizeof(unsigned), cudaMemcpyDeviceToHost));
    for (unsigned t = 0; t < (unsigned)total; t++) {
        unsigned b = t / threads, lane = t % 32;
        auto v = [&](unsigned l) { return l * 3 + b * 100; };
        unsigned *o = out + t * PER;
        expect("shfl idx", o[0], v(5), t);
        expect("shfl up", o[1], lane >= 2 ? v(lane - 2) : v(lane), t);
        expect("shfl down", o[2], lane + 3 < 32 ? v(lane + 3) : v(lane), t);
        expect("shfl xor", o[3], v(lane ^ 1), t);
        expect("shfl idx width 8", o[4], v((lane & ~7u) + 3), t);
        expect("shfl down width 8", o[5], (lane % 8) + 1 < 8 ? v(lane + 1) : v(lane), t);
        expect("shfl up width 16", o[6], (lane % 16) >= 1 ? v(lane - 1) : v(lane), t);
        expect("ballot", o[7], 0x49249249u, t);
        expect("all/any", o[8], 1 + 8, t);
        expect("match any", o[9], 0xfu << (lane & ~3u), t);
        expect("match all", o[10], FULL, t);
        expect("match all pred", o[11], 1, t);
        expect("activemask", o[12], (lane & 1) ? 0xaaaaaaaau : 0, t);
        unsigned sum = 0;
        for (unsigned l = 0; l < 32; l++) sum += v(l);
        expect("syncwarp sum", o[13], sum, t);
        expect("shuffle sum", o[14], sum, t);
        unsigned half = 0;
        for (unsigned l = lane & 16; l < (lane & 16) + 16; l++) half += v(l);
        expect("tile reduce", o[15], half, t);
    }
    printf("shuffles, votes, matches, activemask, syncwarp, tile reduce: %s\n",
           failures ? "FAILED" : "ok");

    const int n = 1000;
    int *in = (int *)malloc(n * sizeof(int)), positive = 0;
    for (int i = 0; i < n; i++) {
        in[i] = (i * 7919) % 13 < 6 ? 1 : -1;
        positive += in[i] > 0;
    }
    int *d_in, *d_slots, *d_count;
    CHECK(cudaMalloc(&d_in, n * sizeof(int)));
    CHECK(cudaMalloc(&d_slots, n * sizeof(int)));
    CHECK(cudaMalloc(&d_count, sizeof(int)));
    CHECK(cudaMemcpy(d_in, in, n * sizeof(int), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(d_count, 0, sizeof(int)));
    aggregated<<<(n + 127) / 128, 128>>>(d_in, d_slots, d_count, n);
    CHECK(cudaGetLastError());
    int count = 0, *slots = (int *)malloc(n * sizeof(int));
    CHECK(cudaMemcpy(&count, d_count, sizeof(int), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(slots, d_slots, n * sizeof(int), cudaMemcpyDeviceToHost));
    char *seen = (char *)calloc(n, 1);
    int before = failures;
    expect("aggregated count", count, positive, 0);
    for (int i = 0; i < n; i++) {
        if (in[i] > 0) {
            if (slots[i] < 0 || slots[i] >= positive || seen[slots[i]]) {
                expect("aggregated slot distinct", slots[i], ~0u, i);
            } else {
                seen[slots[i]] = 1;
            }
        } else {
            expect("aggregated skipped", slots[i], ~0u, i);
        }
    }
    printf("warp-aggregated atomics: %d of %d, %s\n", count, n,
           failures > before ? "FAILED" : "ok");

    const unsigned values[32] = {0u,          1u,          2u,          0x80000000u,
                                 0xffffffffu, 0x12345678u, 0xdeadbeefu, 0x00f00000u,
                                 7u,          0x40000001u, 0x7fffffffu, 0x0000ff00u,
                                 3u,          5u,          0xaaaaaaaau, 0x55555555u,
                                 100u,        1000u,       65535u,      65536u,
                                 0xf0000000u, 0x0f000000u, 0xc0ffee00u, 0x1u << 20,
                                 31u,         33u,         1u << 30,    0x87654321u,
                                 0x10u,       0x800u,      0xfffu,      0xabcdef01u};
    unsigned *d_vals, *d_bits;
    unsigned long long *d_timer, timer[2];
    CHECK(cudaMalloc(&d_vals, sizeof values));
    CHECK(cudaMalloc(&d_bits, 32 * 8 * sizeof(unsigned)));
    CHECK(cudaMalloc(&d_timer, sizeof timer));
    CHECK(cudaMemcpy(d_vals, values, sizeof values, cudaMemcpyHostToDevice));
    bits<<<1, 32>>>(d_vals, d_bits, d_timer);
    CHECK(cudaDeviceSynchronize());
    unsigned b[32 * 8];
    CHECK(cudaMemcpy(b, d_bits, sizeof b, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(timer, d_timer, sizeof timer, cudaMemcpyDeviceToHost));
    before = failures;
    for (unsigned t = 0; t < 32; t++) {
        unsigned x = values[t], *o = b + t * 8;
        expect("brev", o[0], brev(x), t);
        expect("ffs", o[1], x ? __builtin_ctz(x) + 1 : 0, t);
        expect("clz", o[2], x ? __builtin_clz(x) : 32, t);
        expect("bfe.u32", o[3], (x >> 4) & 0xff, t);
        expect("bfe.s32", o[4], (unsigned)((int)x >> 28), t);
        expect("bfi", o[5], (0xf0f0f0f0u & ~(0xfffu << 8)) | ((x & 0xfff) << 8), t);
        unsigned a = x & 31, w = (x >> 5) & 63;
        if (w > 32) w = 32;
        unsigned ones = w >= 32 ? ~0u : (1u << w) - 1;
        expect("bmsk.clamp", o[6], ones << a, t);
        expect("one-line scope", o[7], x + 5, t);
    }
    printf("bit instructions: %s\n", failures > before ? "FAILED" : "ok");
    int *d_votes, votes[4];
    CHECK(cudaMalloc(&d_votes, sizeof votes));
    block_votes<<<1, 32>>>(d_vals, d_votes);
    CHECK(cudaMemcpy(votes, d_votes, sizeof votes, cudaMemcpyDeviceToHost));
    int odd = 0;
    for (int t = 0; t < 32; t++) odd += values[t] & 1;
    before = failures;
    expect("__syncthreads_count", votes[0], odd, 0);
    expect("__syncthreads_or", votes[1], 1, 0);
    expect("__syncthreads_and", votes[2], 1, 0);
    expect("__syncthreads_and (false)", votes[3], 0, 0);
    printf("block votes: %s\n", failures > before ? "FAILED" : "ok");
    printf("globaltimer advances: %s\n", timer[0] > 0 && timer[1] >= timer[0] ? "yes" : "no");
    printf("%s\n", failures ? "WARP CHECKS FAILED" : "all warp checks passed");
    return failures ? 1 : 0;
}
