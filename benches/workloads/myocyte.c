/* ODE solver with hundreds of thousands of tiny calls (after Rodinia's myocyte): every
 * time step writes the state, sets arguments, launches a one-work-group kernel and
 * reads the derivatives back, all blocking. Interposition-dominant. */
#include "workload.h"

#define EQ 32

static const char *SRC =
    "#define EQ 32\n"
    "__kernel void deriv(__global const float *y, __global float *dy, float t, float k) {\n"
    "    int i = get_global_id(0);\n"
    "    float left = y[(i + EQ - 1) % EQ], right = y[(i + 1) % EQ];\n"
    "    dy[i] = k * (left + right - 2.0f * y[i]) - 0.01f * y[i] + 0.001f * (float)(i % 3) * t;\n"
    "}\n";

static void cpu_deriv(const float *y, float *dy, float t, float k) {
    for (int i = 0; i < EQ; i++) {
        float left = y[(i + EQ - 1) % EQ], right = y[(i + 1) % EQ];
        dy[i] = k * (left + right - 2.0f * y[i]) - 0.01f * y[i] + 0.001f * (float)(i % 3) * t;
    }
}

int main(int argc, char **argv) {
    int steps = is_short(argc, argv) ? 1000 : 25000;
    float y[EQ], dy[EQ], ry[EQ], rdy[EQ], h = 0.01f, k = 0.5f;
    for (int i = 0; i < EQ; i++) y[i] = ry[i] = (float)(i % 5);
    cl_platform_id platform;
    cl_device_id device;
    cl_context ctx;
    cl_command_queue q;
    setup(&platform, &device, &ctx, &q, 0);
    cl_program p = build(ctx, device, SRC);
    cl_kernel kd = kernel(p, "deriv");
    cl_mem dy_buf = buffer(ctx, CL_MEM_READ_WRITE, sizeof dy, NULL);
    cl_mem y_buf = buffer(ctx, CL_MEM_READ_WRITE, sizeof y, NULL);
    size_t g = EQ;
    for (int s = 0; s < steps; s++) {
        float t = s * h;
        CHECK(clEnqueueWriteBuffer(q, y_buf, CL_TRUE, 0, sizeof y, y, 0, NULL, NULL));
        CHECK(clSetKernelArg(kd, 0, sizeof y_buf, &y_buf));
        CHECK(clSetKernelArg(kd, 1, sizeof dy_buf, &dy_buf));
        CHECK(clSetKernelArg(kd, 2, sizeof t, &t));
        CHECK(clSetKernelArg(kd, 3, sizeof k, &k));
        CHECK(clEnqueueNDRangeKernel(q, kd, 1, NULL, &g, &g, 0, NULL, NULL));
        CHECK(clEnqueueReadBuffer(q, dy_buf, CL_TRUE, 0, sizeof dy, dy, 0, NULL, NULL));
        for (int i = 0; i < EQ; i++) y[i] += h * dy[i];
        cpu_deriv(ry, rdy, t, k);
        for (int i = 0; i < EQ; i++) ry[i] += h * rdy[i];
    }
    double err = 0, sum = 0;
    for (int i = 0; i < EQ; i++) {
        err = fmax(err, fabs(y[i] - ry[i]));
        sum += y[i];
    }
    char d[128];
    snprintf(d, sizeof d, "equations=%d steps=%d calls=%d sum=%.4f", EQ, steps, steps * 7, sum);
    return finish("myocyte", err < 1e-3, d);
}
