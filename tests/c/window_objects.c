/* Many large memory objects made, mapped and released one after another, more in
 * all than Hira's data window holds: through Hira each lives in the window while the
 * application holds it (a map is then the host's own, nothing copied), and its region
 * serves a later object only once the host has destroyed it. Checks, for each round:
 *
 * - a buffer made from host data (CL_MEM_COPY_HOST_PTR), mapped for reading and
 *   writing, changed through the map, read back after a kernel used it;
 * - a sub-buffer of it, mapped and written;
 * - a 2D image array made from host data, a region mapped with its pitches and
 *   changed, read back whole;
 * - a non-blocking read of the buffer enqueued behind a user event and the buffer
 *   released before the read may run: the next round's objects, made meanwhile, must
 *   not take its memory (the read gives this round's data).
 *
 * Prints one line per round with sums that depend on every byte. */
#include "common.h"
#include <string.h>

#define ROUNDS 24
#define FLOATS (2 << 20) /* 8 MiB */
#define W 512
#define H 256
#define LAYERS 4 /* 2 MiB of RGBA8 */

static const char *src =
    "__kernel void twice(__global float *a) { size_t i = get_global_id(0); a[i] = a[i] * 2.0f + 1.0f; }\n";

static double fsum(const float *v, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += v[i] * (double)(i % 97 + 1);
    return s;
}

int main(void) {
    cl_platform_id platform;
    cl_device_id device;
    cl_context ctx;
    cl_command_queue q;
    cl_int err;
    setup(&platform, &device, &ctx, &q, 0);
    cl_program prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
    CHECK_ERR(err, "clCreateProgramWithSource");
    CHECK(clBuildProgram(prog, 1, &device, NULL, NULL, NULL));
    cl_kernel twice = clCreateKernel(prog, "twice", &err);
    CHECK_ERR(err, "clCreateKernel");

    float *host = malloc(FLOATS * sizeof(float));
    float *back = malloc(FLOATS * sizeof(float));
    float *late = malloc(FLOATS * sizeof(float));
    unsigned char *pixels = malloc(W * H * LAYERS * 4);
    cl_mem held = NULL;
    cl_event gate = NULL;
    for (int round = 0; round < ROUNDS; round++) {
        for (size_t i = 0; i < FLOATS; i++) host[i] = (float)((i * 7 + round) % 1013);
        cl_mem buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                                    FLOATS * sizeof(float), host, &err);
        CHECK_ERR(err, "clCreateBuffer");
        /* The previous round's buffer may go now that this round's exists. */
        if (held) {
            CHECK(clSetUserEventStatus(gate, CL_COMPLETE));
            CHECK(clFinish(q));
            CHECK(clReleaseEvent(gate));
            printf("late read of round %d: %.6e\n", round - 1, fsum(late, FLOATS));
            held = NULL;
        }
        float *view = clEnqueueMapBuffer(q, buf, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 4096,
                                         (FLOATS - 2048) * sizeof(float), 0, NULL, NULL, &err);
        CHECK_ERR(err, "clEnqueueMapBuffer");
        double mapped = fsum(view, 1000);
        for (size_t i = 0; i < FLOATS - 2048; i += 5) view[i] += 0.5f;
        CHECK(clEnqueueUnmapMemObject(q, buf, view, 0, NULL, NULL));

        cl_buffer_region part = {FLOATS * sizeof(float) / 2, 65536 * sizeof(float)};
        cl_mem sub = clCreateSubBuffer(buf, 0, CL_BUFFER_CREATE_TYPE_REGION, &part, &err);
        CHECK_ERR(err, "clCreateSubBuffer");
        float *sview = clEnqueueMapBuffer(q, sub, CL_TRUE, CL_MAP_WRITE, 0, 65536 * sizeof(float),
                                          0, NULL, NULL, &err);
        CHECK_ERR(err, "clEnqueueMapBuffer (sub-buffer)");
        for (int i = 0; i < 65536; i += 3) sview[i] = (float)(i % 11);
        CHECK(clEnqueueUnmapMemObject(q, sub, sview, 0, NULL, NULL));
        CHECK(clReleaseMemObject(sub));

        CHECK(clSetKernelArg(twice, 0, sizeof buf, &buf));
        size_t n = FLOATS;
        CHECK(clEnqueueNDRangeKernel(q, twice, 1, NULL, &n, NULL, 0, NULL, NULL));
        CHECK(clEnqueueReadBuffer(q, buf, CL_TRUE, 0, FLOATS * sizeof(float), back, 0, NULL, NULL));

        for (size_t i = 0; i < (size_t)W * H * LAYERS * 4; i++)
            pixels[i] = (unsigned char)((i * 13 + round) % 251);
        cl_image_format fmt = {CL_RGBA, CL_UNSIGNED_INT8};
        cl_image_desc desc;
        memset(&desc, 0, sizeof desc);
        desc.image_type = CL_MEM_OBJECT_IMAGE2D_ARRAY;
        desc.image_width = W;
        desc.image_height = H;
        desc.image_array_size = LAYERS;
        cl_mem img = clCreateImage(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, &fmt, &desc,
                                   pixels, &err);
        CHECK_ERR(err, "clCreateImage");
        size_t origin[3] = {3 + round, 5, 1}, region[3] = {100, 40, 2}, row, slice;
        unsigned char *px = clEnqueueMapImage(q, img, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, origin,
                                              region, &row, &slice, 0, NULL, NULL, &err);
        CHECK_ERR(err, "clEnqueueMapImage");
        unsigned long image_in = 0;
        for (size_t z = 0; z < 2; z++)
            for (size_t y = 0; y < 40; y++)
                for (size_t x = 0; x < 400; x++) {
                    unsigned char *p = px + z * slice + y * row + x;
                    image_in += *p * (x % 7 + 1);
                    *p ^= (unsigned char)(y + z);
                }
        CHECK(clEnqueueUnmapMemObject(q, img, px, 0, NULL, NULL));
        size_t zero[3] = {0, 0, 0}, all[3] = {W, H, LAYERS};
        CHECK(clEnqueueReadImage(q, img, CL_TRUE, zero, all, 0, 0, pixels, 0, NULL, NULL));
        unsigned long image_out = 0;
        for (size_t i = 0; i < (size_t)W * H * LAYERS * 4; i++) image_out += pixels[i] * (i % 29 + 1);
        CHECK(clReleaseMemObject(img));

        /* A read that cannot run before the next round's objects are made. */
        gate = clCreateUserEvent(ctx, &err);
        CHECK_ERR(err, "clCreateUserEvent");
        CHECK(clEnqueueReadBuffer(q, buf, CL_FALSE, 0, FLOATS * sizeof(float), late, 1, &gate, NULL));
        CHECK(clReleaseMemObject(buf));
        held = buf;
        /* (Pitches are the implementation's: natively and with Hira's objects in the
         * window the image's own, else the mapped region's.) */
        printf("round %d: mapped %.6e after %.6e image %lu %lu\n", round, mapped,
               fsum(back, FLOATS), image_in, image_out);
    }
    CHECK(clSetUserEventStatus(gate, CL_COMPLETE));
    CHECK(clFinish(q));
    printf("late read of round %d: %.6e\n", ROUNDS - 1, fsum(late, FLOATS));
    CHECK(clReleaseEvent(gate));
    CHECK(clReleaseKernel(twice));
    CHECK(clReleaseProgram(prog));
    CHECK(clReleaseCommandQueue(q));
    CHECK(clReleaseContext(ctx));
    return 0;
}
