/* cl_pocl_content_size: whether the platform reports the extension, its entry point
 * found through clGetExtensionFunctionAddressForPlatform where it does, a buffer given
 * a content-size buffer and then used as usual; an unknown name gives no entry point. */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <CL/cl_ext.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(e)                                                                       \
    do {                                                                               \
        cl_int c_ = (e);                                                               \
        if (c_ != CL_SUCCESS) {                                                        \
            printf("%s:%d: %s: %d\n", __FILE__, __LINE__, #e, c_);                     \
            exit(2);                                                                   \
        }                                                                              \
    } while (0)

/* CL/cl_ext_pocl.h is not installed with the ICD loader's headers. */
typedef cl_int (*set_content_size_fn)(cl_mem buffer, cl_mem content_size_buffer);

int main(void) {
    cl_platform_id platform;
    cl_device_id device;
    cl_int err;
    CHECK(clGetPlatformIDs(1, &platform, NULL));
    CHECK(clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &device, NULL));
    char exts[8192] = {0};
    CHECK(clGetPlatformInfo(platform, CL_PLATFORM_EXTENSIONS, sizeof exts, exts, NULL));
    int reported = strstr(exts, "cl_pocl_content_size") != NULL;
    printf("platform reports cl_pocl_content_size: %s\n", reported ? "yes" : "no");
    printf("unknown entry point: %s\n",
           clGetExtensionFunctionAddressForPlatform(platform, "clNoSuchFunctionHIRA") ? "found"
                                                                                      : "none");
    set_content_size_fn set = (set_content_size_fn)clGetExtensionFunctionAddressForPlatform(
        platform, "clSetContentSizeBufferPoCL");
    printf("clSetContentSizeBufferPoCL: %s\n", set ? "found" : "none");
    if (!reported || !set) return 0;

    cl_context ctx = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
    CHECK(err);
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, device, NULL, &err);
    CHECK(err);
    cl_mem data = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 1024, NULL, &err);
    CHECK(err);
    cl_mem size = clCreateBuffer(ctx, CL_MEM_READ_WRITE, sizeof(cl_ulong), NULL, &err);
    CHECK(err);
    cl_ulong meaningful = 16;
    CHECK(clEnqueueWriteBuffer(q, size, CL_TRUE, 0, sizeof meaningful, &meaningful, 0, NULL, NULL));
    printf("set: %d\n", set(data, size));
    unsigned char in[16], out[16];
    for (int i = 0; i < 16; i++) in[i] = (unsigned char)(i * 7 + 1);
    CHECK(clEnqueueWriteBuffer(q, data, CL_TRUE, 0, sizeof in, in, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, data, CL_TRUE, 0, sizeof out, out, 0, NULL, NULL));
    printf("read back: %s\n", memcmp(in, out, sizeof in) ? "differs" : "same");
    CHECK(clReleaseMemObject(data));
    CHECK(clReleaseMemObject(size));
    CHECK(clReleaseCommandQueue(q));
    CHECK(clReleaseContext(ctx));
    return 0;
}
