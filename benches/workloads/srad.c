/* Speckle-reducing anisotropic diffusion (after Rodinia's srad): per iteration a
 * reduction kernel whose two sums are read back, then two image kernels. Moderate. */
#include "workload.h"

static const char *SRC =
    "#pragma OPENCL FP_CONTRACT OFF\n"
    "__kernel void stats(__global const float *img, __global float *partial, int n, __local float *l) {\n"
    "    int lid = get_local_id(0), gid = get_global_id(0), ls = get_local_size(0);\n"
    "    float v = gid < n ? img[gid] : 0.0f;\n"
    "    l[2 * lid] = v; l[2 * lid + 1] = v * v;\n"
    "    barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    if (lid == 0) { float s = 0, s2 = 0; for (int i = 0; i < ls; i++) { s += l[2 * i]; s2 += l[2 * i + 1]; }\n"
    "        partial[2 * get_group_id(0)] = s; partial[2 * get_group_id(0) + 1] = s2; }\n"
    "}\n"
    "__kernel void coeff(__global const float *j, __global float *c, int rows, int cols, float q0sqr) {\n"
    "    int x = get_global_id(0), y = get_global_id(1); int i = y * cols + x;\n"
    "    float jc = j[i];\n"
    "    float dn = j[(y > 0 ? y - 1 : 0) * cols + x] - jc, ds = j[(y < rows - 1 ? y + 1 : y) * cols + x] - jc;\n"
    "    float dw = j[y * cols + (x > 0 ? x - 1 : 0)] - jc, de = j[y * cols + (x < cols - 1 ? x + 1 : x)] - jc;\n"
    "    float g2 = (dn * dn + ds * ds + dw * dw + de * de) / (jc * jc);\n"
    "    float l = (dn + ds + dw + de) / jc;\n"
    "    float num = 0.5f * g2 - 0.0625f * l * l, den = 1.0f + 0.25f * l;\n"
    "    float qsqr = num / (den * den);\n"
    "    float cc = 1.0f / (1.0f + (qsqr - q0sqr) / (q0sqr * (1.0f + q0sqr)));\n"
    "    c[i] = cc < 0.0f ? 0.0f : (cc > 1.0f ? 1.0f : cc);\n"
    "}\n"
    "__kernel void update(__global const float *j, __global const float *c, int rows, int cols, float lambda,\n"
    "                     __global float *out) {\n"
    "    int x = get_global_id(0), y = get_global_id(1); int i = y * cols + x;\n"
    "    float jc = j[i];\n"
    "    int s = (y < rows - 1 ? y + 1 : y) * cols + x, e = y * cols + (x < cols - 1 ? x + 1 : x);\n"
    "    float dn = j[(y > 0 ? y - 1 : 0) * cols + x] - jc, ds = j[s] - jc;\n"
    "    float dw = j[y * cols + (x > 0 ? x - 1 : 0)] - jc, de = j[e] - jc;\n"
    "    float div = c[i] * dn + c[s] * ds + c[i] * dw + c[e] * de;\n"
    "    out[i] = jc + 0.25f * lambda * div;\n"
    "}\n";

int main(int argc, char **argv) {
    int sh = is_short(argc, argv), rows = sh ? 128 : 512, cols = rows, iters = sh ? 4 : 40, wg = 256;
    int n = rows * cols, groups = n / wg;
    size_t bytes = sizeof(float) * n;
    float *img = malloc(bytes), *partial = malloc(sizeof(float) * 2 * groups), lambda = 0.5f;
    for (int i = 0; i < n; i++) img[i] = 1.0f + (float)((i * 7919) % 255) / 255.0f;
    cl_platform_id platform;
    cl_device_id device;
    cl_context ctx;
    cl_command_queue q;
    setup(&platform, &device, &ctx, &q, 0);
    cl_program p = build(ctx, device, SRC);
    cl_kernel kst = kernel(p, "stats"), kc = kernel(p, "coeff"), ku = kernel(p, "update");
    cl_mem dj = buffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, bytes, img);
    cl_mem dc = buffer(ctx, CL_MEM_READ_WRITE, bytes, NULL);
    cl_mem dj2 = buffer(ctx, CL_MEM_READ_WRITE, bytes, NULL);
    cl_mem dp = buffer(ctx, CL_MEM_READ_WRITE, sizeof(float) * 2 * groups, NULL);
    CHECK(clSetKernelArg(kst, 1, sizeof dp, &dp));
    CHECK(clSetKernelArg(kst, 2, sizeof n, &n));
    CHECK(clSetKernelArg(kst, 3, sizeof(float) * 2 * wg, NULL));
    CHECK(clSetKernelArg(kc, 1, sizeof dc, &dc));
    CHECK(clSetKernelArg(kc, 2, sizeof rows, &rows));
    CHECK(clSetKernelArg(kc, 3, sizeof cols, &cols));
    CHECK(clSetKernelArg(ku, 1, sizeof dc, &dc));
    CHECK(clSetKernelArg(ku, 2, sizeof rows, &rows));
    CHECK(clSetKernelArg(ku, 3, sizeof cols, &cols));
    CHECK(clSetKernelArg(ku, 4, sizeof lambda, &lambda));
    /* The CPU reference runs the same steps, using the device's statistics so both
     * follow one path; it checks the image kernels exactly. */
    float *r = malloc(bytes), *rc = malloc(bytes);
    memcpy(r, img, bytes);
    size_t gs = (size_t)n, ls = (size_t)wg, g2[2] = {(size_t)cols, (size_t)rows};
    double err = 0;
    for (int it = 0; it < iters; it++) {
        cl_mem cur = it % 2 ? dj2 : dj, next = it % 2 ? dj : dj2;
        CHECK(clSetKernelArg(kst, 0, sizeof cur, &cur));
        CHECK(clSetKernelArg(kc, 0, sizeof cur, &cur));
        CHECK(clSetKernelArg(ku, 0, sizeof cur, &cur));
        CHECK(clSetKernelArg(ku, 5, sizeof next, &next));
        CHECK(clEnqueueNDRangeKernel(q, kst, 1, NULL, &gs, &ls, 0, NULL, NULL));
        CHECK(clEnqueueReadBuffer(q, dp, CL_TRUE, 0, sizeof(float) * 2 * groups, partial, 0, NULL, NULL));
        double sum = 0, sum2 = 0;
        for (int g = 0; g < groups; g++) {
            sum += partial[2 * g];
            sum2 += partial[2 * g + 1];
        }
        double mean = sum / n, var = sum2 / n - mean * mean;
        float q0sqr = (float)(var / (mean * mean));
        CHECK(clSetKernelArg(kc, 4, sizeof q0sqr, &q0sqr));
        CHECK(clEnqueueNDRangeKernel(q, kc, 2, NULL, g2, NULL, 0, NULL, NULL));
        CHECK(clEnqueueNDRangeKernel(q, ku, 2, NULL, g2, NULL, 0, NULL, NULL));
        for (int y = 0; y < rows; y++)
            for (int x = 0; x < cols; x++) {
                int i = y * cols + x;
                float jc = r[i];
                float dn = r[(y > 0 ? y - 1 : 0) * cols + x] - jc, ds = r[(y < rows - 1 ? y + 1 : y) * cols + x] - jc;
                float dw = r[y * cols + (x > 0 ? x - 1 : 0)] - jc, de = r[y * cols + (x < cols - 1 ? x + 1 : x)] - jc;
                float g2v = (dn * dn + ds * ds + dw * dw + de * de) / (jc * jc);
                float l = (dn + ds + dw + de) / jc;
                float num = 0.5f * g2v - 0.0625f * l * l, den = 1.0f + 0.25f * l;
                float qsqr = num / (den * den);
                float cc = 1.0f / (1.0f + (qsqr - q0sqr) / (q0sqr * (1.0f + q0sqr)));
                rc[i] = cc < 0.0f ? 0.0f : (cc > 1.0f ? 1.0f : cc);
            }
        for (int y = 0; y < rows; y++)
            for (int x = 0; x < cols; x++) {
                int i = y * cols + x, s = (y < rows - 1 ? y + 1 : y) * cols + x, e = y * cols + (x < cols - 1 ? x + 1 : x);
                float jc = r[i];
                float dn = r[(y > 0 ? y - 1 : 0) * cols + x] - jc, ds = r[s] - jc;
                float dw = r[y * cols + (x > 0 ? x - 1 : 0)] - jc, de = r[e] - jc;
                float div = rc[i] * dn + rc[s] * ds + rc[i] * dw + rc[e] * de;
                img[i] = jc + 0.25f * lambda * div;
            }
        memcpy(r, img, bytes);
    }
    CHECK(clEnqueueReadBuffer(q, iters % 2 ? dj2 : dj, CL_TRUE, 0, bytes, img, 0, NULL, NULL));
    double sum = 0;
    for (int i = 0; i < n; i++) {
        err = fmax(err, fabs(img[i] - r[i]));
        sum += img[i];
    }
    char d[128];
    snprintf(d, sizeof d, "image=%dx%d iters=%d mean=%.5f", rows, cols, iters, sum / n);
    return finish("srad", err < 1e-3, d);
}
