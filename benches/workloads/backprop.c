/* Back-propagation (after Rodinia's backprop): a large input layer into 16 hidden
 * units, forward pass and weight adjustment as two big kernels. Interposition-rare. */
#include "workload.h"

#define HID 16

static const char *SRC =
    "#define HID 16\n"
    "__kernel void forward(__global const float *in, __global const float *w, __global float *partial, int n) {\n"
    "    int h = get_global_id(0), chunk = get_global_id(1), per = n / get_global_size(1);\n"
    "    float s = 0; for (int i = chunk * per; i < (chunk + 1) * per; i++) s += in[i] * w[i * HID + h];\n"
    "    partial[chunk * HID + h] = s;\n"
    "}\n"
    "__kernel void adjust(__global const float *in, __global float *w, __global const float *delta, float eta) {\n"
    "    int i = get_global_id(0);\n"
    "    for (int h = 0; h < HID; h++) w[i * HID + h] += eta * delta[h] * in[i];\n"
    "}\n";

int main(int argc, char **argv) {
    int n = is_short(argc, argv) ? 16384 : 1 << 20, chunks = 64;
    float *in = malloc(sizeof(float) * n), *w = malloc(sizeof(float) * n * HID), *rw = malloc(sizeof(float) * n * HID);
    float partial[64 * HID], hidden[HID], delta[HID], eta = 0.3f;
    for (int i = 0; i < n; i++) in[i] = (float)(i % 10) / 10.0f;
    /* Weights centred on zero and scaled by the fan-in keep the hidden units active. */
    for (int i = 0; i < n * HID; i++) w[i] = rw[i] = ((float)((i * 31) % 201) - 100.0f) / (0.05f * n);
    cl_platform_id platform;
    cl_device_id device;
    cl_context ctx;
    cl_command_queue q;
    setup(&platform, &device, &ctx, &q, 0);
    cl_program p = build(ctx, device, SRC);
    cl_kernel kf = kernel(p, "forward"), ka = kernel(p, "adjust");
    cl_mem din = buffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof(float) * n, in);
    cl_mem dw = buffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof(float) * n * HID, w);
    cl_mem dp = buffer(ctx, CL_MEM_READ_WRITE, sizeof partial, NULL);
    cl_mem dd = buffer(ctx, CL_MEM_READ_ONLY, sizeof delta, NULL);
    CHECK(clSetKernelArg(kf, 0, sizeof din, &din));
    CHECK(clSetKernelArg(kf, 1, sizeof dw, &dw));
    CHECK(clSetKernelArg(kf, 2, sizeof dp, &dp));
    CHECK(clSetKernelArg(kf, 3, sizeof n, &n));
    size_t gf[2] = {HID, (size_t)chunks};
    CHECK(clEnqueueNDRangeKernel(q, kf, 2, NULL, gf, NULL, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, dp, CL_TRUE, 0, sizeof partial, partial, 0, NULL, NULL));
    for (int h = 0; h < HID; h++) {
        double s = 0;
        for (int c = 0; c < chunks; c++) s += partial[c * HID + h];
        hidden[h] = (float)(1.0 / (1.0 + exp(-s)));
        delta[h] = hidden[h] * (1.0f - hidden[h]) * (0.5f - hidden[h]);
    }
    CHECK(clEnqueueWriteBuffer(q, dd, CL_TRUE, 0, sizeof delta, delta, 0, NULL, NULL));
    CHECK(clSetKernelArg(ka, 0, sizeof din, &din));
    CHECK(clSetKernelArg(ka, 1, sizeof dw, &dw));
    CHECK(clSetKernelArg(ka, 2, sizeof dd, &dd));
    CHECK(clSetKernelArg(ka, 3, sizeof eta, &eta));
    size_t ga = (size_t)n;
    CHECK(clEnqueueNDRangeKernel(q, ka, 1, NULL, &ga, NULL, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, dw, CL_TRUE, 0, sizeof(float) * n * HID, w, 0, NULL, NULL));
    double err = 0, herr = 0;
    for (int h = 0; h < HID; h++) {
        double s = 0;
        for (int i = 0; i < n; i++) s += (double)in[i] * rw[i * HID + h];
        herr = fmax(herr, fabs(1.0 / (1.0 + exp(-s)) - hidden[h]));
    }
    for (int i = 0; i < n; i++)
        for (int h = 0; h < HID; h++) err = fmax(err, fabs(rw[i * HID + h] + eta * delta[h] * in[i] - w[i * HID + h]));
    char d[128];
    snprintf(d, sizeof d, "inputs=%d hidden=%d h0=%.4f", n, HID, hidden[0]);
    return finish("backprop", err < 1e-5 && herr < 1e-3, d);
}
