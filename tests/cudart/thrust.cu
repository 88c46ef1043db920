// Thrust and CUB as programs use them: a radix sort (keys), a merge sort with a
// comparator of its own (CUB launches it with cudaLaunchKernelEx), a reduction and
// an inclusive scan, checked against the host.
#include <thrust/device_vector.h>
#include <thrust/host_vector.h>
#include <thrust/sort.h>
#include <thrust/reduce.h>
#include <thrust/scan.h>
#include <cstdio>
#include <algorithm>

struct descending {
    __host__ __device__ bool operator()(int a, int b) const { return a > b; }
};

int main() {
    const int n = 3000;
    thrust::host_vector<int> h(n);
    unsigned x = 12345;
    for (int i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        h[i] = (int)(x >> 8) % 100000 - 50000;
    }
    thrust::device_vector<int> d = h;
    thrust::sort(d.begin(), d.end());
    thrust::host_vector<int> sorted = d;
    std::vector<int> ref(h.begin(), h.end());
    std::sort(ref.begin(), ref.end());
    bool ok = std::equal(ref.begin(), ref.end(), sorted.begin());
    printf("radix sort of %d keys: %s\n", n, ok ? "ok" : "FAILED");
    d = h;
    thrust::sort(d.begin(), d.end(), descending());
    sorted = d;
    std::sort(ref.begin(), ref.end(), [](int a, int b) { return a > b; });
    bool ok2 = std::equal(ref.begin(), ref.end(), sorted.begin());
    printf("merge sort with a comparator: %s\n", ok2 ? "ok" : "FAILED");
    long long sum = thrust::reduce(d.begin(), d.end(), 0LL);
    long long want = 0;
    for (int v : ref) want += v;
    printf("reduce: %s\n", sum == want ? "ok" : "FAILED");
    thrust::inclusive_scan(d.begin(), d.end(), d.begin());
    int last = d[n - 1];
    printf("scan: %s\n", last == (int)want ? "ok" : "FAILED");
    return ok && ok2 && sum == want && last == (int)want ? 0 : 1;
}
