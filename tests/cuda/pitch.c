/* Pitched memory and 2D copies and memsets: host matrices with their own pitches
 * into and out of pitched device memory, a device-to-device copy of a
 * sub-rectangle, an asynchronous copy, a copy whose rows are contiguous, memory
 * types told apart by address (UNIFIED), a 3D copy of a box of a volume, copies
 * of bytes with a 1D array side (host, device and array to and from arrays, on a
 * stream too), and the driver's errors. */
#include "common.h"

#define W 100
#define H 37

static double sum(const float *m, size_t pitch_floats, int w, int h) {
    double s = 0;
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) s += m[y * pitch_floats + x] * (1 + (x + 3 * y) % 7);
    return s;
}

static CUDA_MEMCPY2D plain(size_t w, size_t h) {
    CUDA_MEMCPY2D c;
    memset(&c, 0, sizeof c);
    c.WidthInBytes = w;
    c.Height = h;
    return c;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    CUcontext ctx;
    CUmodule mod = setup(argv[1], &ctx);
    CUfunction add;
    CHECK(cuModuleGetFunction(&add, mod, "add_pitched"));
    CUdeviceptr a, b;
    size_t pa, pb;
    CHECK(cuMemAllocPitch(&a, &pa, W * sizeof(float), H, 4));
    CHECK(cuMemAllocPitch(&b, &pb, W * sizeof(float), H, 4));
    printf("pitches %zu %zu\n", pa, pb);

    static float host[H][120], back[H][130];
    for (int y = 0; y < H; y++)
        for (int x = 0; x < 120; x++) host[y][x] = (float)(y * 1000 + x);
    CUDA_MEMCPY2D up = plain(W * sizeof(float), H);
    up.srcMemoryType = CU_MEMORYTYPE_HOST;
    up.srcHost = host;
    up.srcPitch = sizeof host[0];
    up.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    up.dstDevice = a;
    up.dstPitch = pa;
    CHECK(cuMemcpy2D(&up));
    CHECK(cuMemsetD2D32(b, pb, 0, W, H));

    unsigned long pitch = pa;
    int w = W, h = H;
    float k = 0.5f;
    void *args[] = {&a, &pitch, &w, &h, &k};
    CHECK(cuLaunchKernel(add, 4, H, 1, 32, 1, 1, 0, NULL, args, NULL));

    /* Rows 3..22, columns 2..61 of a into b at column 5, row 10. */
    CUDA_MEMCPY2D dd = plain(60 * sizeof(float), 20);
    dd.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    dd.srcDevice = a;
    dd.srcPitch = pa;
    dd.srcXInBytes = 2 * sizeof(float);
    dd.srcY = 3;
    dd.dstMemoryType = CU_MEMORYTYPE_UNIFIED;
    dd.dstDevice = b;
    dd.dstPitch = pb;
    dd.dstXInBytes = 5 * sizeof(float);
    dd.dstY = 10;
    CHECK(cuMemcpy2D(&dd));
    /* A rectangle of b set to 7, by a 2D memset at an offset. */
    CHECK(cuMemsetD2D32(b + 2 * pb + 40 * sizeof(float), pb, 0x40e00000u, 10, 4));

    CUstream st;
    CHECK(cuStreamCreate(&st, 0));
    /* Rows 30-31, columns 0-2 of b set to 8 on the stream, before the copy back. */
    CHECK(cuMemsetD2D32Async(b + 30 * pb, pb, 0x41000000u, 3, 2, st));
    CUDA_MEMCPY2D down = plain(W * sizeof(float), H);
    down.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    down.srcDevice = b;
    down.srcPitch = pb;
    down.dstMemoryType = CU_MEMORYTYPE_UNIFIED;
    down.dstDevice = (CUdeviceptr)(uintptr_t)back;
    down.dstPitch = sizeof back[0];
    CHECK(cuMemcpy2DAsync(&down, st));
    CHECK(cuStreamSynchronize(st));
    printf("b: sum %.1f, [10][5] %.1f, [2][40] %.1f, [31][2] %.1f, [36][99] %.1f\n",
           sum(&back[0][0], 130, W, H), back[10][5], back[2][40], back[31][2], back[36][99]);
    CUDA_MEMCPY2D da = down;
    da.srcDevice = a;
    da.srcPitch = pa;
    da.srcY = 1;
    da.Height = H - 1;
    CHECK(cuMemcpy2DUnaligned(&da));
    printf("a from row 1: sum %.1f, [0][0] %.1f\n", sum(&back[0][0], 130, W, H - 1), back[0][0]);

    /* Contiguous rows: one copy each way. */
    CUdeviceptr flat;
    CHECK(cuMemAlloc(&flat, 16 * 64));
    static unsigned char in[16][64], out[16][64];
    for (int i = 0; i < 16 * 64; i++) in[i / 64][i % 64] = (unsigned char)(i * 7);
    CUDA_MEMCPY2D c = plain(64, 16);
    c.srcMemoryType = CU_MEMORYTYPE_HOST;
    c.srcHost = in;
    c.srcPitch = 64;
    c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    c.dstDevice = flat;
    c.dstPitch = 64;
    CHECK(cuMemcpy2D(&c));
    CHECK(cuMemsetD2D8(flat + 64 * 3, 64, 0xab, 8, 2));
    c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    c.srcDevice = flat;
    c.dstMemoryType = CU_MEMORYTYPE_HOST;
    c.dstHost = out;
    CHECK(cuMemcpy2D(&c));
    int same = 0;
    for (int i = 0; i < 16 * 64; i++) same += in[i / 64][i % 64] == out[i / 64][i % 64];
    printf("contiguous: %d of 1024 bytes as sent, [3][0] %x [4][7] %x\n", same, out[3][0], out[4][7]);

    /* A volume of 4 slices of 6 rows of 16 floats in pitched memory, and a box of it
     * (slices 1-3, rows 1-5, columns 2-15) back into a host volume of its own shape. */
    static float vol[4][6][20], box[3][5][18];
    for (int z = 0; z < 4; z++)
        for (int y = 0; y < 6; y++)
            for (int x = 0; x < 20; x++) vol[z][y][x] = (float)(z * 10000 + y * 100 + x);
    CUdeviceptr v;
    size_t pv;
    CHECK(cuMemAllocPitch(&v, &pv, 16 * sizeof(float), 6 * 4, 4));
    CUDA_MEMCPY3D c3;
    memset(&c3, 0, sizeof c3);
    c3.srcMemoryType = CU_MEMORYTYPE_HOST;
    c3.srcHost = vol;
    c3.srcPitch = sizeof vol[0][0];
    c3.srcHeight = 6;
    c3.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    c3.dstDevice = v;
    c3.dstPitch = pv;
    c3.dstHeight = 6;
    c3.WidthInBytes = 16 * sizeof(float);
    c3.Height = 6;
    c3.Depth = 4;
    CHECK(cuMemcpy3D(&c3));
    memset(&c3, 0, sizeof c3);
    c3.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    c3.srcDevice = v;
    c3.srcPitch = pv;
    c3.srcHeight = 6;
    c3.srcXInBytes = 2 * sizeof(float);
    c3.srcY = 1;
    c3.srcZ = 1;
    c3.dstMemoryType = CU_MEMORYTYPE_HOST;
    c3.dstHost = box;
    c3.dstPitch = sizeof box[0][0];
    c3.dstHeight = 5;
    c3.WidthInBytes = 14 * sizeof(float);
    c3.Height = 5;
    c3.Depth = 3;
    CHECK(cuMemcpy3DAsync(&c3, st));
    CHECK(cuStreamSynchronize(st));
    double vs = 0;
    for (int z = 0; z < 3; z++)
        for (int y = 0; y < 5; y++)
            for (int x = 0; x < 14; x++) vs += box[z][y][x];
    printf("3D box: sum %.1f, [0][0][0] %.1f, [2][4][13] %.1f\n", vs, box[0][0][0], box[2][4][13]);
    c3.srcHeight = 4;
    CUresult overlapping = cuMemcpy3D(&c3);
    printf("3D with slices shorter than the copy: %d\n", (int)overlapping);
    CHECK(cuMemFree(v));

    /* 1D arrays: bytes to and from arrays, at offsets. */
    {
        CUDA_ARRAY_DESCRIPTOR ad;
        memset(&ad, 0, sizeof ad);
        ad.Width = 256;
        ad.Format = CU_AD_FORMAT_FLOAT;
        ad.NumChannels = 1;
        CUarray a1, a2;
        CHECK(cuArrayCreate(&a1, &ad));
        CHECK(cuArrayCreate(&a2, &ad));
        float line[256], zeros[256], back[256];
        for (int i = 0; i < 256; i++) line[i] = i * 0.5f - 7;
        memset(zeros, 0, sizeof zeros);
        CHECK(cuMemcpyHtoA(a1, 0, line, sizeof line));
        CHECK(cuMemcpyHtoA(a2, 0, zeros, sizeof zeros));
        CHECK(cuMemcpyAtoA(a2, 64 * sizeof(float), a1, 0, 128 * sizeof(float)));
        CUdeviceptr lin;
        CHECK(cuMemAlloc(&lin, sizeof line));
        CHECK(cuMemcpyAtoD(lin, a2, 0, sizeof line));
        CHECK(cuMemcpyDtoA(a1, 16 * sizeof(float), lin + 64 * sizeof(float), 32 * sizeof(float)));
        CHECK(cuMemcpyAtoH(back, a1, 0, sizeof back));
        double s1 = 0;
        for (int i = 0; i < 256; i++) s1 += back[i] * (1 + i % 5);
        float a1_20 = back[20];
        CHECK(cuMemcpyHtoAAsync(a2, 8 * sizeof(float), line + 100, 16 * sizeof(float), st));
        CHECK(cuMemcpyAtoHAsync(back, a2, 0, sizeof back, st));
        CHECK(cuStreamSynchronize(st));
        double s2 = 0;
        for (int i = 0; i < 256; i++) s2 += back[i] * (1 + i % 5);
        CUresult past = cuMemcpyHtoA(a1, 250 * sizeof(float), line, 10 * sizeof(float));
        printf("1D arrays: sum %.2f, [20] %.2f, on a stream %.2f, [10] %.2f, past the end %d\n", s1,
               a1_20, s2, back[10], (int)past);
        CHECK(cuMemFree(lin));
        CHECK(cuArrayDestroy(a1));
        CHECK(cuArrayDestroy(a2));
    }

    /* The driver's errors. */
    CUDA_MEMCPY2D bad = up;
    bad.srcPitch = 8;
    CUresult short_pitch = cuMemcpy2D(&bad);
    bad = up;
    bad.Height = H + 1;
    CUresult past_end = cuMemcpy2D(&bad);
    bad = up;
    bad.dstMemoryType = 9;
    CUresult bad_type = cuMemcpy2D(&bad);
    size_t p2;
    CUdeviceptr d2;
    CUresult bad_element = cuMemAllocPitch(&d2, &p2, 64, 4, 3);
    printf("errors: short pitch %d, past the end %d, bad type %d, element size 3 %d\n",
           (int)short_pitch, (int)past_end, (int)bad_type, (int)bad_element);
    CHECK(cuMemFree(a));
    CHECK(cuMemFree(b));
    CHECK(cuMemFree(flat));
    CHECK(cuStreamDestroy(st));
    CHECK(cuCtxDestroy(ctx));
    return 0;
}
