/* Path finder (after Rodinia's pathfinder): dynamic programming down a wide grid, one
 * kernel per row over a large buffer. Interposition-rare. */
#include "workload.h"

static const char *SRC =
    "__kernel void row(__global const int *wall, __global const int *prev, __global int *next, int cols, int r) {\n"
    "    int c = get_global_id(0); if (c >= cols) return;\n"
    "    int best = prev[c];\n"
    "    if (c > 0 && prev[c - 1] < best) best = prev[c - 1];\n"
    "    if (c < cols - 1 && prev[c + 1] < best) best = prev[c + 1];\n"
    "    next[c] = best + wall[r * cols + c];\n"
    "}\n";

int main(int argc, char **argv) {
    int sh = is_short(argc, argv), cols = sh ? 20000 : 400000, rows = sh ? 20 : 100;
    int *wall = malloc(sizeof(int) * rows * cols), *res = malloc(sizeof(int) * cols);
    int *ra = malloc(sizeof(int) * cols), *rb = malloc(sizeof(int) * cols);
    for (int i = 0; i < rows * cols; i++) wall[i] = (int)(((unsigned)i * 2654435761u) >> 24) % 10;
    cl_platform_id platform;
    cl_device_id device;
    cl_context ctx;
    cl_command_queue q;
    setup(&platform, &device, &ctx, &q, 0);
    cl_program p = build(ctx, device, SRC);
    cl_kernel k = kernel(p, "row");
    cl_mem dw = buffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof(int) * rows * cols, wall);
    cl_mem da = buffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof(int) * cols, wall);
    cl_mem db = buffer(ctx, CL_MEM_READ_WRITE, sizeof(int) * cols, NULL);
    CHECK(clSetKernelArg(k, 0, sizeof dw, &dw));
    CHECK(clSetKernelArg(k, 3, sizeof cols, &cols));
    size_t local = 256, g = ((size_t)cols + local - 1) / local * local;
    for (int r = 1; r < rows; r++) {
        cl_mem prev = r % 2 ? da : db, next = r % 2 ? db : da;
        CHECK(clSetKernelArg(k, 1, sizeof prev, &prev));
        CHECK(clSetKernelArg(k, 2, sizeof next, &next));
        CHECK(clSetKernelArg(k, 4, sizeof r, &r));
        CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &g, &local, 0, NULL, NULL));
    }
    CHECK(clEnqueueReadBuffer(q, rows % 2 ? da : db, CL_TRUE, 0, sizeof(int) * cols, res, 0, NULL, NULL));
    memcpy(ra, wall, sizeof(int) * cols);
    for (int r = 1; r < rows; r++) {
        for (int c = 0; c < cols; c++) {
            int best = ra[c];
            if (c > 0 && ra[c - 1] < best) best = ra[c - 1];
            if (c < cols - 1 && ra[c + 1] < best) best = ra[c + 1];
            rb[c] = best + wall[r * cols + c];
        }
        int *t = ra; ra = rb; rb = t;
    }
    int ok = memcmp(res, ra, sizeof(int) * cols) == 0, min = res[0];
    for (int c = 1; c < cols; c++) min = res[c] < min ? res[c] : min;
    char d[128];
    snprintf(d, sizeof d, "grid=%dx%d shortest=%d", rows, cols, min);
    return finish("pathfinder", ok, d);
}
