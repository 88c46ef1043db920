/* Maps of regions of buffers and images (a 2D array, a 3D image, a 1D array) at
 * non-zero origins, for reading, writing and writing with CL_MAP_WRITE_INVALIDATE_REGION;
 * the mapped data and the pitches returned are checked, and what was written is read
 * back. Prints, last, the object data the maps must bring in and the unmaps send back
 * (the regions mapped for reading or writing, and written), which the test compares
 * with the shim's statistics. */
#include "cl30.h"
#include <stdio.h>
#include <string.h>

#define CHECK(e)                                                                       \
    do {                                                                               \
        cl_int c_ = (e);                                                               \
        if (c_ != CL_SUCCESS) {                                                        \
            printf("%s:%d: %s: %d\n", __FILE__, __LINE__, #e, c_);                     \
            exit(2);                                                                   \
        }                                                                              \
    } while (0)

static size_t map_in, unmap_out;

static unsigned pixel(size_t x, size_t y, size_t z) { return (unsigned)(x * 7 + y * 131 + z * 5003); }

/* An image of RGBA8 (or R32UI when `r32`) pixels whose every channel derives from
 * pixel(x, y, z). */
static cl_mem image(cl_context ctx, cl_mem_object_type type, size_t w, size_t h, size_t d, int r32) {
    cl_image_format f = {r32 ? CL_R : CL_RGBA, r32 ? CL_UNSIGNED_INT32 : CL_UNSIGNED_INT8};
    cl_image_desc desc = {0};
    desc.image_type = type;
    desc.image_width = w;
    desc.image_height = type == CL_MEM_OBJECT_IMAGE1D_ARRAY ? 1 : h;
    desc.image_depth = type == CL_MEM_OBJECT_IMAGE3D ? d : 1;
    desc.image_array_size = type == CL_MEM_OBJECT_IMAGE2D_ARRAY ? d : type == CL_MEM_OBJECT_IMAGE1D_ARRAY ? h : 1;
    size_t elem = 4, n = w * h * d;
    unsigned char *data = malloc(n * elem);
    for (size_t z = 0; z < d; z++)
        for (size_t y = 0; y < h; y++)
            for (size_t x = 0; x < w; x++) {
                unsigned v = pixel(x, y, z);
                unsigned char *p = data + ((z * h + y) * w + x) * elem;
                if (r32)
                    memcpy(p, &v, 4);
                else
                    for (int c = 0; c < 4; c++) p[c] = (unsigned char)(v >> (c * 3));
            }
    cl_int err;
    cl_mem m = clCreateImage(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, &f, &desc, data, &err);
    CHECK(err);
    free(data);
    return m;
}

static int same_pixel(const unsigned char *p, unsigned v, int r32) {
    if (r32) {
        unsigned got;
        memcpy(&got, p, 4);
        return got == v;
    }
    for (int c = 0; c < 4; c++)
        if (p[c] != (unsigned char)(v >> (c * 3))) return 0;
    return 1;
}

/* Maps `region` at `origin` for reading and checks every pixel; the layers of a 1D
 * array are its rows. */
static void read_map(cl_command_queue q, cl_mem img, const char *what, const size_t o[3], const size_t r[3],
                     int one_d_array, int r32) {
    size_t row = 0, slice = 0;
    cl_int err;
    unsigned char *p = clEnqueueMapImage(q, img, CL_TRUE, CL_MAP_READ, o, r, &row, &slice, 0, NULL, NULL, &err);
    CHECK(err);
    map_in += r[0] * r[1] * r[2] * 4;
    int ok = 1;
    for (size_t z = 0; z < r[2]; z++)
        for (size_t y = 0; y < r[1]; y++)
            for (size_t x = 0; x < r[0]; x++) {
                const unsigned char *at = one_d_array ? p + y * slice + x * 4 : p + z * slice + y * row + x * 4;
                ok &= same_pixel(at, pixel(o[0] + x, o[1] + y, o[2] + z), r32);
            }
    printf("%s: read map %s, row pitch at least the region's: %d, slice pitch %s\n", what, ok ? "right" : "WRONG",
           row >= r[0] * 4, slice == 0 ? "0" : "set");
    CHECK(clEnqueueUnmapMemObject(q, img, p, 0, NULL, NULL));
}

/* Maps `region` for writing (`invalidate`: CL_MAP_WRITE_INVALIDATE_REGION), writes
 * pixel + 1 everywhere, unmaps, and reads the region back. */
static void write_map(cl_command_queue q, cl_mem img, const char *what, const size_t o[3], const size_t r[3],
                      int invalidate, int r32) {
    size_t row = 0, slice = 0, bytes = r[0] * r[1] * r[2] * 4;
    cl_int err;
    unsigned char *p = clEnqueueMapImage(q, img, CL_TRUE, invalidate ? CL_MAP_WRITE_INVALIDATE_REGION : CL_MAP_WRITE,
                                         o, r, &row, &slice, 0, NULL, NULL, &err);
    CHECK(err);
    if (!invalidate) map_in += bytes;
    int shown = 1;
    for (size_t z = 0; z < r[2]; z++)
        for (size_t y = 0; y < r[1]; y++)
            for (size_t x = 0; x < r[0]; x++) {
                unsigned char *at = p + z * slice + y * row + x * 4;
                if (!invalidate) shown &= same_pixel(at, pixel(o[0] + x, o[1] + y, o[2] + z), r32);
                unsigned v = pixel(o[0] + x, o[1] + y, o[2] + z) + 1;
                if (r32)
                    memcpy(at, &v, 4);
                else
                    for (int c = 0; c < 4; c++) at[c] = (unsigned char)(v >> (c * 3));
            }
    CHECK(clEnqueueUnmapMemObject(q, img, p, 0, NULL, NULL));
    unmap_out += bytes;
    unsigned char *back = malloc(bytes);
    CHECK(clEnqueueReadImage(q, img, CL_TRUE, o, r, 0, 0, back, 0, NULL, NULL));
    int ok = 1;
    for (size_t i = 0; i < bytes / 4; i++) {
        size_t x = i % r[0], y = (i / r[0]) % r[1], z = i / (r[0] * r[1]);
        ok &= same_pixel(back + i * 4, pixel(o[0] + x, o[1] + y, o[2] + z) + 1, r32);
    }
    free(back);
    printf("%s: %s map %s, written back %s\n", what, invalidate ? "invalidating" : "write",
           invalidate ? "made" : shown ? "showed the contents" : "showed WRONG contents", ok ? "right" : "WRONG");
}

int main(void) {
    cl_platform_id platform;
    cl_device_id device;
    cl_int err;
    cl_context ctx = first_context(&platform, &device);
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, device, NULL, &err);
    CHECK(err);

    /* A 4 MiB buffer. */
    size_t n = 1 << 20;
    int *host = malloc(n * sizeof(int));
    for (size_t i = 0; i < n; i++) host[i] = (int)(i * 3);
    cl_mem buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n * sizeof(int), host, &err);
    CHECK(err);
    int *p = clEnqueueMapBuffer(q, buf, CL_TRUE, CL_MAP_READ, 1 << 20, 4096, 0, NULL, NULL, &err);
    CHECK(err);
    map_in += 4096;
    int ok = 1;
    for (size_t i = 0; i < 1024; i++) ok &= p[i] == (int)(((1 << 18) + i) * 3);
    CHECK(clEnqueueUnmapMemObject(q, buf, p, 0, NULL, NULL));
    printf("buffer: read map %s\n", ok ? "right" : "WRONG");
    p = clEnqueueMapBuffer(q, buf, CL_TRUE, CL_MAP_WRITE_INVALIDATE_REGION, 2 << 20, 8192, 0, NULL, NULL, &err);
    CHECK(err);
    for (size_t i = 0; i < 2048; i++) p[i] = -(int)i;
    CHECK(clEnqueueUnmapMemObject(q, buf, p, 0, NULL, NULL));
    unmap_out += 8192;
    p = clEnqueueMapBuffer(q, buf, CL_TRUE, CL_MAP_WRITE, 3 << 20, 4096, 0, NULL, NULL, &err);
    CHECK(err);
    map_in += 4096;
    ok = p[5] == (int)(((3 << 18) + 5) * 3);
    for (size_t i = 0; i < 1024; i++) p[i] += 1;
    CHECK(clEnqueueUnmapMemObject(q, buf, p, 0, NULL, NULL));
    unmap_out += 4096;
    CHECK(clEnqueueReadBuffer(q, buf, CL_TRUE, 0, n * sizeof(int), host, 0, NULL, NULL));
    for (size_t i = 0; i < 2048; i++) ok &= host[(1 << 19) + i] == -(int)i;
    for (size_t i = 0; i < 1024; i++) ok &= host[(3 << 18) + i] == (int)(((3 << 18) + i) * 3 + 1);
    ok &= host[(3 << 18) + 1024] == (int)(((3 << 18) + 1024) * 3);
    printf("buffer: write maps written back %s\n", ok ? "right" : "WRONG");
    free(host);

    /* A 2D array of 8 layers of 512x256, 4 MiB. */
    cl_mem arr = image(ctx, CL_MEM_OBJECT_IMAGE2D_ARRAY, 512, 256, 8, 0);
    size_t o1[3] = {16, 8, 2}, r1[3] = {32, 16, 3};
    read_map(q, arr, "2D array", o1, r1, 0, 0);
    write_map(q, arr, "2D array", o1, r1, 0, 0);
    size_t o2[3] = {100, 200, 7}, r2[3] = {50, 10, 1};
    write_map(q, arr, "2D array", o2, r2, 1, 0);

    /* A 3D image of 64^3, 1 MiB. */
    cl_mem vol = image(ctx, CL_MEM_OBJECT_IMAGE3D, 64, 64, 64, 0);
    size_t o3[3] = {3, 5, 7}, r3[3] = {8, 4, 2};
    read_map(q, vol, "3D", o3, r3, 0, 0);
    write_map(q, vol, "3D", o3, r3, 1, 0);

    /* A 1D array of 16 layers of 1024 R32UI pixels. */
    cl_mem lines = image(ctx, CL_MEM_OBJECT_IMAGE1D_ARRAY, 1024, 16, 1, 1);
    size_t o4[3] = {10, 3, 0}, r4[3] = {20, 4, 1};
    read_map(q, lines, "1D array", o4, r4, 1, 1);
    write_map(q, lines, "1D array", o4, r4, 0, 1);

    clReleaseMemObject(buf);
    clReleaseMemObject(arr);
    clReleaseMemObject(vol);
    clReleaseMemObject(lines);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    printf("data: maps bring in %zu bytes, unmaps send back %zu\n", map_in, unmap_out);
    return 0;
}
