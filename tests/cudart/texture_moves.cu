// A runtime program that holds CUDA arrays (2D, layered, and one for surfaces),
// texture objects over arrays and pitched memory, and a surface object, driven one
// command per line from stdin so that a test can move its session between commands
// (vhost/tests/e2e/cudart.rs). Each command answers one line.
//
//   arrays     makes the arrays and the pitched memory, and fills them
//   textures   makes the objects (a first texture is made and destroyed first, so
//              that the values held have a gap before them)
//   write K    a kernel writes x * K - y through the surface object
//   scale K    a kernel multiplies the surface's texels by K
//   surf       copies the surface's array back
//   sample     a kernel samples the three textures
//   drop       destroys the layered texture and its array
//   end        destroys and frees the rest
#include <cstdio>
#include <cstring>
#include <cuda_runtime.h>

#define W 32
#define H 16
#define LAYERS 3

#define CHECK(call)                                                                    \
    do {                                                                               \
        cudaError_t e_ = (call);                                                       \
        if (e_ != cudaSuccess) {                                                       \
            printf("%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorName(e_)); \
            fflush(stdout);                                                            \
            return 1;                                                                  \
        }                                                                              \
    } while (0)

__global__ void sample(cudaTextureObject_t a, cudaTextureObject_t p, cudaTextureObject_t l,
                       float *out, int w, int h) {
    int x = threadIdx.x, y = blockIdx.x;
    if (x < w && y < h) {
        float v = tex2D<float>(a, x * 0.75f + 0.3f, y * 0.5f + 0.2f) +
                  2.0f * tex2D<float>(p, x + 0.5f, y + 0.5f);
        if (l) v += 3.0f * tex2DLayered<float>(l, x + 0.5f, y + 0.5f, (x + y) % LAYERS);
        out[y * w + x] = v;
    }
}

__global__ void surf_write(cudaSurfaceObject_t s, int w, int h, float k) {
    int x = threadIdx.x, y = blockIdx.x;
    if (x < w && y < h) surf2Dwrite(x * k - y, s, x * (int)sizeof(float), y);
}

__global__ void surf_scale(cudaSurfaceObject_t s, int w, int h, float k) {
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

static cudaError_t texture(cudaTextureObject_t *t, const cudaResourceDesc &res,
                           cudaTextureFilterMode filter) {
    cudaTextureDesc td = {};
    td.addressMode[0] = td.addressMode[1] = td.addressMode[2] = cudaAddressModeClamp;
    td.filterMode = filter;
    td.readMode = cudaReadModeElementType;
    return cudaCreateTextureObject(t, &res, &td, nullptr);
}

static cudaResourceDesc of_array(cudaArray_t a) {
    cudaResourceDesc r = {};
    r.resType = cudaResourceTypeArray;
    r.res.array.array = a;
    return r;
}

int main() {
    cudaArray_t plain = nullptr, surface = nullptr, layered = nullptr;
    float *pitched = nullptr, *out = nullptr;
    size_t pitch = 0;
    cudaTextureObject_t ta = 0, tp = 0, tl = 0;
    cudaSurfaceObject_t so = 0;
    static float host[W * H * LAYERS];
    char line[128];
    printf("ready\n");
    fflush(stdout);
    while (fgets(line, sizeof line, stdin)) {
        char cmd[32] = "";
        float k = 0;
        sscanf(line, "%31s %f", cmd, &k);
        if (!strcmp(cmd, "arrays")) {
            cudaChannelFormatDesc f = cudaCreateChannelDesc<float>();
            CHECK(cudaMallocArray(&plain, &f, W, H));
            CHECK(cudaMallocArray(&surface, &f, W, H, cudaArraySurfaceLoadStore));
            CHECK(cudaMalloc3DArray(&layered, &f, make_cudaExtent(W, H, LAYERS), cudaArrayLayered));
            for (int i = 0; i < W * H; i++) host[i] = (float)((i * 7) % 23) - 5.5f;
            CHECK(cudaMemcpy2DToArray(plain, 0, 0, host, W * sizeof(float), W * sizeof(float), H,
                                      cudaMemcpyHostToDevice));
            for (int i = 0; i < W * H * LAYERS; i++) host[i] = (float)((i * 5) % 17) * 0.25f;
            cudaMemcpy3DParms c = {};
            c.srcPtr = make_cudaPitchedPtr(host, W * sizeof(float), W, H);
            c.dstArray = layered;
            c.extent = make_cudaExtent(W, H, LAYERS);
            c.kind = cudaMemcpyHostToDevice;
            CHECK(cudaMemcpy3D(&c));
            CHECK(cudaMallocPitch((void **)&pitched, &pitch, W * sizeof(float), H));
            for (int i = 0; i < W * H; i++) host[i] = (float)(i % 11) * 1.5f;
            CHECK(cudaMemcpy2D(pitched, pitch, host, W * sizeof(float), W * sizeof(float), H,
                               cudaMemcpyHostToDevice));
            CHECK(cudaMalloc((void **)&out, W * H * sizeof(float)));
            printf("arrays made\n");
        } else if (!strcmp(cmd, "textures")) {
            cudaTextureObject_t first = 0;
            CHECK(texture(&first, of_array(plain), cudaFilterModePoint));
            CHECK(texture(&ta, of_array(plain), cudaFilterModeLinear));
            CHECK(cudaDestroyTextureObject(first));
            cudaResourceDesc r = {};
            r.resType = cudaResourceTypePitch2D;
            r.res.pitch2D.devPtr = pitched;
            r.res.pitch2D.desc = cudaCreateChannelDesc<float>();
            r.res.pitch2D.width = W;
            r.res.pitch2D.height = H;
            r.res.pitch2D.pitchInBytes = pitch;
            CHECK(texture(&tp, r, cudaFilterModePoint));
            CHECK(texture(&tl, of_array(layered), cudaFilterModePoint));
            cudaResourceDesc s = of_array(surface);
            CHECK(cudaCreateSurfaceObject(&so, &s));
            printf("textures made\n");
        } else if (!strcmp(cmd, "write")) {
            surf_write<<<H, W>>>(so, W, H, k);
            CHECK(cudaGetLastError());
            CHECK(cudaDeviceSynchronize());
            printf("write %g\n", k);
        } else if (!strcmp(cmd, "scale")) {
            surf_scale<<<H, W>>>(so, W, H, k);
            CHECK(cudaGetLastError());
            CHECK(cudaDeviceSynchronize());
            printf("scale %g\n", k);
        } else if (!strcmp(cmd, "surf")) {
            CHECK(cudaMemcpy2DFromArray(host, W * sizeof(float), surface, 0, 0, W * sizeof(float),
                                        H, cudaMemcpyDeviceToHost));
            printf("surf %.4f\n", weighted(host, W * H));
        } else if (!strcmp(cmd, "sample")) {
            sample<<<H, W>>>(ta, tp, tl, out, W, H);
            CHECK(cudaGetLastError());
            CHECK(cudaMemcpy(host, out, W * H * sizeof(float), cudaMemcpyDeviceToHost));
            printf("sample %.4f\n", weighted(host, W * H));
        } else if (!strcmp(cmd, "drop")) {
            CHECK(cudaDestroyTextureObject(tl));
            CHECK(cudaFreeArray(layered));
            tl = 0;
            layered = nullptr;
            printf("dropped\n");
        } else if (!strcmp(cmd, "end")) {
            CHECK(cudaDestroyTextureObject(ta));
            CHECK(cudaDestroyTextureObject(tp));
            CHECK(cudaDestroySurfaceObject(so));
            CHECK(cudaFreeArray(plain));
            CHECK(cudaFreeArray(surface));
            CHECK(cudaFree(pitched));
            CHECK(cudaFree(out));
            printf("bye\n");
            fflush(stdout);
            return 0;
        } else {
            printf("unknown command %s\n", cmd);
        }
        fflush(stdout);
    }
    return 0;
}
