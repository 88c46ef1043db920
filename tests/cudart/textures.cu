// CUDA arrays, texture objects and surface objects through NVIDIA's runtime: 2D and
// 3D arrays filled and read back with 2D and 3D copies, textures over arrays, linear
// and pitched memory (linear and point filtering, normalised coordinates, the wrap,
// clamp, mirror and border address modes, bytes read as normalised floats), layered
// 1D and 2D arrays, surfaces written and read by kernels, the arrays' descriptions,
// and the runtime's errors for copies outside an array.
#include <cstdio>
#include <cuda_runtime.h>

#define CHECK(call)                                                                  \
    do {                                                                             \
        cudaError_t e_ = (call);                                                     \
        if (e_ != cudaSuccess) {                                                     \
            printf("%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorName(e_)); \
            return 1;                                                                \
        }                                                                            \
    } while (0)

#define W 64
#define H 48

__global__ void sample2d(cudaTextureObject_t t, float *out, int w, int h, float scale, float shift) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
    if (x < w && y < h) out[y * w + x] = tex2D<float>(t, x * scale + shift, y * scale - shift);
}

__global__ void sample2d4(cudaTextureObject_t t, float4 *out, int w, int h) {
    int x = threadIdx.x, y = blockIdx.x;
    if (x < w && y < h) out[y * w + x] = tex2D<float4>(t, x + 0.25f, y + 0.75f);
}

__global__ void fetch1d(cudaTextureObject_t t, int *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = tex1Dfetch<int>(t, i - 3);
}

__global__ void sample3d(cudaTextureObject_t t, float *out, int n) {
    int i = threadIdx.x;
    if (i < n) out[i] = tex3D<float>(t, 0.37f * i, 0.5f + 0.21f * i, 1.1f + 0.13f * i);
}

__global__ void sample_layers(cudaTextureObject_t t2, cudaTextureObject_t t1, float *out, int n) {
    int i = threadIdx.x;
    if (i < n) {
        out[2 * i] = tex2DLayered<float>(t2, 0.7f * i, 0.3f + 0.4f * i, i % 4);
        out[2 * i + 1] = tex1DLayered<float>(t1, 1.3f * i, i % 3);
    }
}

__global__ void surface_write(cudaSurfaceObject_t s, int w, int h) {
    int x = threadIdx.x, y = blockIdx.x;
    if (x < w && y < h) surf2Dwrite(float(x * 3 - y), s, x * (int)sizeof(float), y);
}

__global__ void surface_scale(cudaSurfaceObject_t s, int w, int h, float k) {
    int x = threadIdx.x, y = blockIdx.x;
    if (x < w && y < h) {
        float v = surf2Dread<float>(s, x * (int)sizeof(float), y);
        surf2Dwrite(v * k, s, x * (int)sizeof(float), y);
    }
}

static double weighted(const float *v, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += v[i] * (1 + i % 13);
    return s;
}

static cudaTextureObject_t texture(const cudaResourceDesc &res, cudaTextureFilterMode filter,
                                   cudaTextureAddressMode mode, int normalized,
                                   cudaTextureReadMode read) {
    cudaTextureDesc td = {};
    td.addressMode[0] = td.addressMode[1] = td.addressMode[2] = mode;
    td.filterMode = filter;
    td.readMode = read;
    td.normalizedCoords = normalized;
    td.borderColor[0] = -2.5f;
    cudaTextureObject_t t = 0;
    cudaError_t e = cudaCreateTextureObject(&t, &res, &td, nullptr);
    if (e != cudaSuccess) printf("cudaCreateTextureObject: %s\n", cudaGetErrorName(e));
    return t;
}

int main() {
    static float host[H][W + 5];
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W + 5; x++) host[y][x] = 0.5f * x + 0.01f * y * y - (x * y % 7);

    // A 2D float array, filled from a host matrix with its own pitch.
    cudaChannelFormatDesc fd = cudaCreateChannelDesc<float>();
    cudaArray_t arr;
    CHECK(cudaMallocArray(&arr, &fd, W, H));
    CHECK(cudaMemcpy2DToArray(arr, 0, 0, host, sizeof host[0], W * sizeof(float), H,
                              cudaMemcpyHostToDevice));
    cudaChannelFormatDesc got;
    cudaExtent extent;
    unsigned flags;
    CHECK(cudaGetChannelDesc(&got, arr));
    CHECK(cudaArrayGetInfo(&got, &extent, &flags, arr));
    printf("array: channel bits %d %d %d %d kind %d, extent %zu x %zu x %zu, flags %u\n", got.x,
           got.y, got.z, got.w, (int)got.f, extent.width, extent.height, extent.depth, flags);

    float *out;
    CHECK(cudaMalloc(&out, W * H * sizeof(float)));
    static float back[W * H];
    cudaResourceDesc res = {};
    res.resType = cudaResourceTypeArray;
    res.res.array.array = arr;
    struct {
        const char *name;
        cudaTextureFilterMode filter;
        cudaTextureAddressMode mode;
        int normalized;
        float scale, shift;
    } cases[] = {
        {"point clamp", cudaFilterModePoint, cudaAddressModeClamp, 0, 1.1f, 0.5f},
        {"linear clamp", cudaFilterModeLinear, cudaAddressModeClamp, 0, 1.07f, 0.3f},
        {"linear wrap normalised", cudaFilterModeLinear, cudaAddressModeWrap, 1, 0.031f, -0.4f},
        {"point mirror normalised", cudaFilterModePoint, cudaAddressModeMirror, 1, 0.029f, 0.2f},
        {"linear border", cudaFilterModeLinear, cudaAddressModeBorder, 0, 1.3f, -2.0f},
    };
    for (auto &c : cases) {
        cudaTextureObject_t t = texture(res, c.filter, c.mode, c.normalized, cudaReadModeElementType);
        sample2d<<<dim3(2, H), 32>>>(t, out, W, H, c.scale, c.shift);
        CHECK(cudaGetLastError());
        CHECK(cudaMemcpy(back, out, sizeof back, cudaMemcpyDeviceToHost));
        printf("%s: %.4f, %.5f %.5f %.5f\n", c.name, weighted(back, W * H), back[0], back[W + 1],
               back[W * H - 1]);
        CHECK(cudaDestroyTextureObject(t));
    }

    // The same texels back through a device copy and a copy out of the array.
    float *copy;
    size_t pitch;
    CHECK(cudaMallocPitch(&copy, &pitch, W * sizeof(float), H));
    CHECK(cudaMemcpy2DFromArray(copy, pitch, arr, 0, 0, W * sizeof(float), H,
                                cudaMemcpyDeviceToDevice));
    CHECK(cudaMemcpy2D(back, W * sizeof(float), copy, pitch, W * sizeof(float), H,
                       cudaMemcpyDeviceToHost));
    double want = 0;
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) want += host[y][x] * (1 + (y * W + x) % 13);
    printf("array to pitched to host: %s\n", weighted(back, W * H) == want ? "same" : "DIFFERENT");

    // A texture over that pitched memory.
    cudaResourceDesc pres = {};
    pres.resType = cudaResourceTypePitch2D;
    pres.res.pitch2D.devPtr = copy;
    pres.res.pitch2D.desc = fd;
    pres.res.pitch2D.width = W;
    pres.res.pitch2D.height = H;
    pres.res.pitch2D.pitchInBytes = pitch;
    cudaTextureObject_t pt = texture(pres, cudaFilterModeLinear, cudaAddressModeClamp, 0,
                                     cudaReadModeElementType);
    sample2d<<<dim3(2, H), 32>>>(pt, out, W, H, 0.9f, 0.7f);
    CHECK(cudaMemcpy(back, out, sizeof back, cudaMemcpyDeviceToHost));
    printf("pitched linear: %.4f\n", weighted(back, W * H));
    CHECK(cudaDestroyTextureObject(pt));

    // Bytes of four channels, read as normalised floats.
    static uchar4 bytes[8][16];
    for (int y = 0; y < 8; y++)
        for (int x = 0; x < 16; x++)
            bytes[y][x] = make_uchar4(x * 16, y * 30, (x * y) & 255, 255 - x);
    cudaChannelFormatDesc bd = cudaCreateChannelDesc<uchar4>();
    cudaArray_t barr;
    CHECK(cudaMallocArray(&barr, &bd, 16, 8));
    CHECK(cudaMemcpy2DToArray(barr, 0, 0, bytes, sizeof bytes[0], sizeof bytes[0], 8,
                              cudaMemcpyHostToDevice));
    cudaResourceDesc bres = {};
    bres.resType = cudaResourceTypeArray;
    bres.res.array.array = barr;
    cudaTextureObject_t bt = texture(bres, cudaFilterModeLinear, cudaAddressModeClamp, 0,
                                     cudaReadModeNormalizedFloat);
    float4 *out4;
    static float4 back4[16 * 8];
    CHECK(cudaMalloc(&out4, sizeof back4));
    sample2d4<<<8, 16>>>(bt, out4, 16, 8);
    CHECK(cudaMemcpy(back4, out4, sizeof back4, cudaMemcpyDeviceToHost));
    printf("uchar4 normalised: %.5f %.5f %.5f %.5f | %.5f %.5f %.5f %.5f\n", back4[0].x,
           back4[0].y, back4[0].z, back4[0].w, back4[77].x, back4[77].y, back4[77].z, back4[77].w);
    CHECK(cudaDestroyTextureObject(bt));

    // Integers fetched from linear memory; outside it, zeros.
    int ints[40], got_ints[40];
    for (int i = 0; i < 40; i++) ints[i] = i * i - 7;
    int *lin, *iout;
    CHECK(cudaMalloc(&lin, sizeof ints));
    CHECK(cudaMalloc(&iout, sizeof got_ints));
    CHECK(cudaMemcpy(lin, ints, sizeof ints, cudaMemcpyHostToDevice));
    cudaResourceDesc lres = {};
    lres.resType = cudaResourceTypeLinear;
    lres.res.linear.devPtr = lin;
    lres.res.linear.desc = cudaCreateChannelDesc<int>();
    lres.res.linear.sizeInBytes = sizeof ints;
    cudaTextureObject_t lt = texture(lres, cudaFilterModePoint, cudaAddressModeClamp, 0,
                                     cudaReadModeElementType);
    fetch1d<<<1, 40>>>(lt, iout, 40);
    CHECK(cudaMemcpy(got_ints, iout, sizeof got_ints, cudaMemcpyDeviceToHost));
    printf("tex1Dfetch: %d %d %d %d %d\n", got_ints[0], got_ints[2], got_ints[3], got_ints[20],
           got_ints[39]);
    CHECK(cudaDestroyTextureObject(lt));

    // A 3D array from a host volume, sampled with trilinear filtering.
    const int X = 9, Y = 7, Z = 5;
    static float vol[Z][Y][X];
    for (int z = 0; z < Z; z++)
        for (int y = 0; y < Y; y++)
            for (int x = 0; x < X; x++) vol[z][y][x] = x + 10 * y + 100 * z;
    cudaArray_t varr;
    CHECK(cudaMalloc3DArray(&varr, &fd, make_cudaExtent(X, Y, Z)));
    cudaMemcpy3DParms p3 = {};
    p3.srcPtr = make_cudaPitchedPtr(vol, X * sizeof(float), X, Y);
    p3.dstArray = varr;
    p3.extent = make_cudaExtent(X, Y, Z);
    p3.kind = cudaMemcpyHostToDevice;
    CHECK(cudaMemcpy3D(&p3));
    cudaResourceDesc vres = {};
    vres.resType = cudaResourceTypeArray;
    vres.res.array.array = varr;
    cudaTextureObject_t vt = texture(vres, cudaFilterModeLinear, cudaAddressModeClamp, 0,
                                     cudaReadModeElementType);
    sample3d<<<1, 24>>>(vt, out, 24);
    CHECK(cudaMemcpy(back, out, 24 * sizeof(float), cudaMemcpyDeviceToHost));
    printf("tex3D: %.4f %.4f %.4f %.4f\n", back[0], back[5], back[11], back[23]);
    CHECK(cudaDestroyTextureObject(vt));

    // Layered arrays: three layers of 16 x 8 (the fourth layer asked for clamps to
    // the last), and three 1D layers of 16, each sampled within its layer.
    static float layers[3][8][16];
    for (int l = 0; l < 3; l++)
        for (int y = 0; y < 8; y++)
            for (int x = 0; x < 16; x++) layers[l][y][x] = 1000 * l + 10 * y + x;
    cudaArray_t larr, l1arr;
    CHECK(cudaMalloc3DArray(&larr, &fd, make_cudaExtent(16, 8, 3), cudaArrayLayered));
    CHECK(cudaMalloc3DArray(&l1arr, &fd, make_cudaExtent(16, 0, 3), cudaArrayLayered));
    cudaMemcpy3DParms pl = {};
    pl.srcPtr = make_cudaPitchedPtr(layers, 16 * sizeof(float), 16, 8);
    pl.dstArray = larr;
    pl.extent = make_cudaExtent(16, 8, 3);
    pl.kind = cudaMemcpyHostToDevice;
    CHECK(cudaMemcpy3D(&pl));
    pl.dstArray = l1arr;
    pl.srcPtr = make_cudaPitchedPtr(layers, 16 * sizeof(float), 16, 8);
    pl.srcPos = make_cudaPos(0, 2, 0);
    pl.extent = make_cudaExtent(16, 1, 3);
    CHECK(cudaMemcpy3D(&pl));
    CHECK(cudaArrayGetInfo(&got, &extent, &flags, l1arr));
    printf("1D layered: extent %zu x %zu x %zu, flags %u\n", extent.width, extent.height,
           extent.depth, flags);
    cudaResourceDesc lr2 = {}, lr1 = {};
    lr2.resType = lr1.resType = cudaResourceTypeArray;
    lr2.res.array.array = larr;
    lr1.res.array.array = l1arr;
    cudaTextureObject_t lt2 = texture(lr2, cudaFilterModeLinear, cudaAddressModeClamp, 0,
                                      cudaReadModeElementType);
    cudaTextureObject_t lt1 = texture(lr1, cudaFilterModePoint, cudaAddressModeClamp, 0,
                                      cudaReadModeElementType);
    sample_layers<<<1, 12>>>(lt2, lt1, out, 12);
    CHECK(cudaMemcpy(back, out, 24 * sizeof(float), cudaMemcpyDeviceToHost));
    printf("layered: %.3f %.3f %.3f %.3f | %.1f %.1f %.1f\n", back[0], back[6], back[14],
           back[22], back[1], back[7], back[23]);
    CHECK(cudaDestroyTextureObject(lt2));
    CHECK(cudaDestroyTextureObject(lt1));
    CHECK(cudaFreeArray(larr));
    CHECK(cudaFreeArray(l1arr));

    // A surface written by one kernel, read and rewritten by another, copied out.
    cudaArray_t sarr;
    CHECK(cudaMallocArray(&sarr, &fd, 32, 16, cudaArraySurfaceLoadStore));
    cudaResourceDesc sres = {};
    sres.resType = cudaResourceTypeArray;
    sres.res.array.array = sarr;
    cudaSurfaceObject_t so;
    CHECK(cudaCreateSurfaceObject(&so, &sres));
    surface_write<<<16, 32>>>(so, 32, 16);
    surface_scale<<<16, 32>>>(so, 32, 16, 0.5f);
    CHECK(cudaGetLastError());
    static float sback[16][32];
    CHECK(cudaMemcpy2DFromArray(sback, sizeof sback[0], sarr, 0, 0, sizeof sback[0], 16,
                                cudaMemcpyDeviceToHost));
    printf("surface: %.2f %.2f %.2f\n", sback[0][0], sback[3][5], sback[15][31]);
    CHECK(cudaDestroySurfaceObject(so));
    // An array made without surface load/store is no surface.
    cudaSurfaceObject_t bad;
    printf("surface of a plain array: %s\n", cudaGetErrorName(cudaCreateSurfaceObject(&bad, &res)));

    // Copies outside an array are refused.
    printf("copy past the array: %s\n",
           cudaGetErrorName(cudaMemcpy2DToArray(arr, 8, 0, host, sizeof host[0], W * sizeof(float),
                                                H, cudaMemcpyHostToDevice)));
    printf("copy below the array: %s\n",
           cudaGetErrorName(cudaMemcpy2DToArray(arr, 0, 1, host, sizeof host[0], W * sizeof(float),
                                                H, cudaMemcpyHostToDevice)));
    cudaGetLastError();

    CHECK(cudaFreeArray(arr));
    CHECK(cudaFreeArray(barr));
    CHECK(cudaFreeArray(varr));
    CHECK(cudaFreeArray(sarr));
    CHECK(cudaFree(out));
    CHECK(cudaFree(out4));
    CHECK(cudaFree(copy));
    CHECK(cudaFree(lin));
    CHECK(cudaFree(iout));
    printf("done\n");
    return 0;
}
