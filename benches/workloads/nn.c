/* Nearest neighbour (after Rodinia's nn): distances from every record to a target in
 * one kernel, the k nearest chosen on the host. Interposition-rare. */
#include "workload.h"

static const char *SRC =
    "__kernel void dist(__global const float2 *rec, __global float *d, int n, float lat, float lng) {\n"
    "    int i = get_global_id(0); if (i >= n) return;\n"
    "    float2 r = rec[i];\n"
    "    d[i] = (r.x - lat) * (r.x - lat) + (r.y - lng) * (r.y - lng);\n"
    "}\n";

int main(int argc, char **argv) {
    int n = is_short(argc, argv) ? 50000 : 4000000, k = 10;
    float *rec = malloc(sizeof(float) * 2 * n), *d = malloc(sizeof(float) * n), lat = 30.0f, lng = 90.0f;
    /* Integer coordinates keep every distance exact in single precision. */
    for (int i = 0; i < n; i++) {
        rec[2 * i] = (float)(((unsigned)i * 2654435761u >> 8) % 180);
        rec[2 * i + 1] = (float)(((unsigned)i * 40503u >> 4) % 360);
    }
    cl_platform_id platform;
    cl_device_id device;
    cl_context ctx;
    cl_command_queue q;
    setup(&platform, &device, &ctx, &q, 0);
    cl_program p = build(ctx, device, SRC);
    cl_kernel kd = kernel(p, "dist");
    cl_mem dr = buffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof(float) * 2 * n, rec);
    cl_mem dd = buffer(ctx, CL_MEM_WRITE_ONLY, sizeof(float) * n, NULL);
    CHECK(clSetKernelArg(kd, 0, sizeof dr, &dr));
    CHECK(clSetKernelArg(kd, 1, sizeof dd, &dd));
    CHECK(clSetKernelArg(kd, 2, sizeof n, &n));
    CHECK(clSetKernelArg(kd, 3, sizeof lat, &lat));
    CHECK(clSetKernelArg(kd, 4, sizeof lng, &lng));
    size_t local = 256, g = ((size_t)n + local - 1) / local * local;
    CHECK(clEnqueueNDRangeKernel(q, kd, 1, NULL, &g, &local, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, dd, CL_TRUE, 0, sizeof(float) * n, d, 0, NULL, NULL));
    int bad = 0;
    for (int i = 0; i < n; i++) {
        float dx = rec[2 * i] - lat, dy = rec[2 * i + 1] - lng;
        bad += d[i] != dx * dx + dy * dy;
    }
    /* k nearest by repeated selection, ties broken by index. */
    double total = 0;
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int i = 0; i < n; i++)
            if (d[i] >= 0 && (best < 0 || d[i] < d[best])) best = i;
        total += d[best];
        d[best] = -1;
    }
    char dsc[128];
    snprintf(dsc, sizeof dsc, "records=%d k=%d nearest_sum=%.1f", n, k, total);
    return finish("nn", bad == 0, dsc);
}
