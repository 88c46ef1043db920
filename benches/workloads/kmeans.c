/* k-means (after Rodinia's kmeans): per iteration one membership kernel over all
 * points, the new centres computed on the host and sent back. Interposition-rare. */
#include "workload.h"

#define F 4
#define K 5

static const char *SRC =
    "#define F 4\n#define K 5\n"
    "__kernel void assign(__global const float *pts, __global const float *ctr, __global int *member, int n) {\n"
    "    int i = get_global_id(0); if (i >= n) return;\n"
    "    int best = 0; float bd = 0;\n"
    "    for (int c = 0; c < K; c++) { float d = 0;\n"
    "        for (int f = 0; f < F; f++) { float x = pts[i * F + f] - ctr[c * F + f]; d += x * x; }\n"
    "        if (c == 0 || d < bd) { bd = d; best = c; } }\n"
    "    member[i] = best;\n"
    "}\n";

static void centres(const float *pts, const int *member, int n, float *ctr) {
    double sum[K * F] = {0};
    int count[K] = {0};
    for (int i = 0; i < n; i++) {
        count[member[i]]++;
        for (int f = 0; f < F; f++) sum[member[i] * F + f] += pts[i * F + f];
    }
    /* Centres are rounded to integers so every distance stays exact. */
    for (int c = 0; c < K; c++)
        for (int f = 0; f < F; f++)
            if (count[c]) ctr[c * F + f] = (float)floor(sum[c * F + f] / count[c] + 0.5);
}

int main(int argc, char **argv) {
    int sh = is_short(argc, argv), n = sh ? 20000 : 1000000, iters = sh ? 3 : 10;
    float *pts = malloc(sizeof(float) * n * F), ctr[K * F], rctr[K * F];
    int *member = malloc(sizeof(int) * n), *rmember = malloc(sizeof(int) * n);
    for (int i = 0; i < n * F; i++) pts[i] = (float)(((unsigned)i * 2246822519u >> 9) % 100);
    for (int i = 0; i < K * F; i++) ctr[i] = rctr[i] = pts[i * 7];
    cl_platform_id platform;
    cl_device_id device;
    cl_context ctx;
    cl_command_queue q;
    setup(&platform, &device, &ctx, &q, 0);
    cl_program p = build(ctx, device, SRC);
    cl_kernel ka = kernel(p, "assign");
    cl_mem dp = buffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof(float) * n * F, pts);
    cl_mem dc = buffer(ctx, CL_MEM_READ_ONLY, sizeof ctr, NULL);
    cl_mem dm = buffer(ctx, CL_MEM_WRITE_ONLY, sizeof(int) * n, NULL);
    CHECK(clSetKernelArg(ka, 0, sizeof dp, &dp));
    CHECK(clSetKernelArg(ka, 1, sizeof dc, &dc));
    CHECK(clSetKernelArg(ka, 2, sizeof dm, &dm));
    CHECK(clSetKernelArg(ka, 3, sizeof n, &n));
    size_t local = 256, g = ((size_t)n + local - 1) / local * local;
    int bad = 0;
    for (int it = 0; it < iters; it++) {
        CHECK(clEnqueueWriteBuffer(q, dc, CL_TRUE, 0, sizeof ctr, ctr, 0, NULL, NULL));
        CHECK(clEnqueueNDRangeKernel(q, ka, 1, NULL, &g, &local, 0, NULL, NULL));
        CHECK(clEnqueueReadBuffer(q, dm, CL_TRUE, 0, sizeof(int) * n, member, 0, NULL, NULL));
        for (int i = 0; i < n; i++) {
            int best = 0;
            float bd = 0;
            for (int c = 0; c < K; c++) {
                float d = 0;
                for (int f = 0; f < F; f++) {
                    float x = pts[i * F + f] - rctr[c * F + f];
                    d += x * x;
                }
                if (c == 0 || d < bd) {
                    bd = d;
                    best = c;
                }
            }
            rmember[i] = best;
            bad += member[i] != best;
        }
        centres(pts, member, n, ctr);
        centres(pts, rmember, n, rctr);
    }
    char d[128];
    snprintf(d, sizeof d, "points=%d k=%d iters=%d c0=(%.0f,%.0f,%.0f,%.0f)", n, K, iters, ctr[0], ctr[1], ctr[2], ctr[3]);
    return finish("kmeans", bad == 0, d);
}
