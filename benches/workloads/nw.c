/* Needleman-Wunsch alignment (after Rodinia's nw): one kernel per anti-diagonal of the
 * score matrix, all enqueued back to back. Moderate interposition. */
#include "workload.h"

static const char *SRC =
    "__kernel void diag(__global int *s, __global const int *ref, int n, int d, int penalty) {\n"
    "    int k = get_global_id(0);\n"
    "    int i = (d < n ? d : n - 1) - k + 1, j = d - (i - 1) + 1;\n"
    "    if (i < 1 || j < 1 || i > n || j > n) return;\n"
    "    int w = n + 1;\n"
    "    int m = s[(i - 1) * w + j - 1] + ref[(i - 1) * n + j - 1];\n"
    "    int up = s[(i - 1) * w + j] - penalty, left = s[i * w + j - 1] - penalty;\n"
    "    int best = m > up ? m : up;\n"
    "    s[i * w + j] = best > left ? best : left;\n"
    "}\n";

int main(int argc, char **argv) {
    int n = is_short(argc, argv) ? 128 : 1024, penalty = 10, w = n + 1;
    int *ref = malloc(sizeof(int) * n * n), *s = calloc((size_t)w * w, sizeof(int)), *r = calloc((size_t)w * w, sizeof(int));
    for (int i = 0; i < n * n; i++) ref[i] = ((i * 2654435761u) >> 7) % 21 - 10;
    for (int i = 0; i <= n; i++) s[i * w] = s[i] = r[i * w] = r[i] = -i * penalty;
    cl_platform_id platform;
    cl_device_id device;
    cl_context ctx;
    cl_command_queue q;
    setup(&platform, &device, &ctx, &q, 0);
    cl_program p = build(ctx, device, SRC);
    cl_kernel k = kernel(p, "diag");
    cl_mem ds = buffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof(int) * w * w, s);
    cl_mem dr = buffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof(int) * n * n, ref);
    CHECK(clSetKernelArg(k, 0, sizeof ds, &ds));
    CHECK(clSetKernelArg(k, 1, sizeof dr, &dr));
    CHECK(clSetKernelArg(k, 2, sizeof n, &n));
    CHECK(clSetKernelArg(k, 4, sizeof penalty, &penalty));
    for (int d = 0; d < 2 * n - 1; d++) {
        int len = d < n ? d + 1 : 2 * n - 1 - d;
        /* A fixed work-group size: one compiled kernel for every diagonal length. */
        size_t local = 64, g = ((size_t)len + local - 1) / local * local;
        CHECK(clSetKernelArg(k, 3, sizeof d, &d));
        CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &g, &local, 0, NULL, NULL));
    }
    CHECK(clEnqueueReadBuffer(q, ds, CL_TRUE, 0, sizeof(int) * w * w, s, 0, NULL, NULL));
    for (int i = 1; i <= n; i++)
        for (int j = 1; j <= n; j++) {
            int m = r[(i - 1) * w + j - 1] + ref[(i - 1) * n + j - 1];
            int up = r[(i - 1) * w + j] - penalty, left = r[i * w + j - 1] - penalty;
            int best = m > up ? m : up;
            r[i * w + j] = best > left ? best : left;
        }
    int ok = memcmp(s, r, sizeof(int) * w * w) == 0;
    char d[128];
    snprintf(d, sizeof d, "n=%d launches=%d score=%d", n, 2 * n - 1, s[w * w - 1]);
    return finish("nw", ok, d);
}
