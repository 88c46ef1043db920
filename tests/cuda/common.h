/* Shared by Hira's CUDA test programs: error checks and loading the kernels' PTX. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                              \
    do {                                                                         \
        CUresult r_ = (call);                                                    \
        if (r_ != CUDA_SUCCESS) {                                                \
            const char *n_ = NULL;                                               \
            cuGetErrorName(r_, &n_);                                             \
            fprintf(stderr, "%s:%d: %s failed: %d %s\n", __FILE__, __LINE__,     \
                    #call, (int)r_, n_ ? n_ : "?");                              \
            exit(1);                                                             \
        }                                                                        \
    } while (0)

/* Expects `call` to fail with `want`. */
#define EXPECT(call, want)                                                       \
    do {                                                                         \
        CUresult r_ = (call);                                                    \
        if (r_ != (want)) {                                                      \
            fprintf(stderr, "%s:%d: %s gave %d, expected %d\n", __FILE__,        \
                    __LINE__, #call, (int)r_, (int)(want));                      \
            exit(1);                                                             \
        }                                                                        \
    } while (0)

/* The PTX text of the file `path`, NUL-terminated. */
static char *read_ptx(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        exit(1);
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc(n + 1);
    if (fread(text, 1, n, f) != (size_t)n) {
        perror("read");
        exit(1);
    }
    text[n] = 0;
    fclose(f);
    return text;
}

/* Initialises the driver, makes a context on device 0 and loads the kernels. */
static CUmodule setup(const char *ptx_path, CUcontext *ctx) {
    CUdevice dev;
    CUmodule mod;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuCtxCreate(ctx, 0, dev));
    char *ptx = read_ptx(ptx_path);
    CHECK(cuModuleLoadData(&mod, ptx));
    free(ptx);
    return mod;
}
