/* Tiled matrix multiply using local memory (a __local kernel argument). */
#include "common.h"

#define TILE 16

static const char *SRC =
    "#define TILE 16\n"
    "__kernel void matmul(__global const float *A, __global const float *B,\n"
    "                     __global float *C, int n, __local float *As, __local float *Bs) {\n"
    "    int row = get_global_id(1), col = get_global_id(0);\n"
    "    int lr = get_local_id(1), lc = get_local_id(0);\n"
    "    float acc = 0.0f;\n"
    "    for (int t = 0; t < n / TILE; t++) {\n"
    "        As[lr * TILE + lc] = A[row * n + t * TILE + lc];\n"
    "        Bs[lr * TILE + lc] = B[(t * TILE + lr) * n + col];\n"
    "        barrier(CLK_LOCAL_MEM_FENCE);\n"
    "        for (int k = 0; k < TILE; k++) acc += As[lr * TILE + k] * Bs[k * TILE + lc];\n"
    "        barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    }\n"
    "    C[row * n + col] = acc;\n"
    "}\n";

int main(void) {
    enum { N = 128 };
    static float A[N * N], B[N * N], C[N * N], R[N * N];
    for (int i = 0; i < N * N; i++) {
        A[i] = (float)((i * 7) % 13) - 6.0f;
        B[i] = (float)((i * 5) % 11) - 5.0f;
    }
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++) {
            float s = 0;
            for (int k = 0; k < N; k++) s += A[i * N + k] * B[k * N + j];
            R[i * N + j] = s;
        }
    cl_platform_id platform;
    cl_device_id device;
    cl_context ctx;
    cl_command_queue q;
    cl_int err;
    setup(&platform, &device, &ctx, &q, 0);
    cl_program prog = build(ctx, device, SRC);
    cl_kernel k = clCreateKernel(prog, "matmul", &err);
    CHECK_ERR(err, "clCreateKernel");
    cl_mem dA = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof A, A, &err);
    CHECK_ERR(err, "buffer A");
    cl_mem dB = clCreateBuffer(ctx, CL_MEM_READ_ONLY, sizeof B, NULL, &err);
    CHECK_ERR(err, "buffer B");
    CHECK(clEnqueueWriteBuffer(q, dB, CL_FALSE, 0, sizeof B, B, 0, NULL, NULL));
    cl_mem dC = clCreateBuffer(ctx, CL_MEM_WRITE_ONLY, sizeof C, NULL, &err);
    CHECK_ERR(err, "buffer C");
    int n = N;
    CHECK(clSetKernelArg(k, 0, sizeof dA, &dA));
    CHECK(clSetKernelArg(k, 1, sizeof dB, &dB));
    CHECK(clSetKernelArg(k, 2, sizeof dC, &dC));
    CHECK(clSetKernelArg(k, 3, sizeof n, &n));
    CHECK(clSetKernelArg(k, 4, TILE * TILE * sizeof(float), NULL));
    CHECK(clSetKernelArg(k, 5, TILE * TILE * sizeof(float), NULL));
    size_t global[2] = {N, N}, local[2] = {TILE, TILE};
    CHECK(clEnqueueNDRangeKernel(q, k, 2, NULL, global, local, 0, NULL, NULL));
    CHECK(clFinish(q));
    CHECK(clEnqueueReadBuffer(q, dC, CL_TRUE, 0, sizeof C, C, 0, NULL, NULL));
    int bad = 0;
    double trace = 0;
    for (int i = 0; i < N * N; i++)
        if (C[i] != R[i]) bad++;
    for (int i = 0; i < N; i++) trace += C[i * N + i];
    size_t wg = 0;
    CHECK(clGetKernelWorkGroupInfo(k, device, CL_KERNEL_WORK_GROUP_SIZE, sizeof wg, &wg, NULL));
    printf("matmul n=%d trace=%.1f C[1][2]=%.1f mismatches=%d wg_ok=%d\n", N, trace, C[N + 2], bad,
           wg >= TILE * TILE);
    clReleaseMemObject(dA);
    clReleaseMemObject(dB);
    clReleaseMemObject(dC);
    clReleaseKernel(k);
    clReleaseProgram(prog);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    return bad != 0;
}
