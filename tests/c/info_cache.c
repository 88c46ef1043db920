/* Queries immutable device and platform info N times (default 1). Through Hira only
 * the first query of each should leave the guest. Usage: info_cache [N] */
#include "common.h"
#include <string.h>

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1;
    cl_platform_id platform;
    cl_device_id device;
    cl_context ctx;
    cl_command_queue q;
    setup(&platform, &device, &ctx, &q, 0);
    char name[256], pname[256];
    cl_uint units = 0;
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        CHECK(clGetDeviceInfo(device, CL_DEVICE_NAME, 0, NULL, &len));
        CHECK(clGetDeviceInfo(device, CL_DEVICE_NAME, sizeof name, name, NULL));
        CHECK(clGetDeviceInfo(device, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof units, &units, NULL));
        CHECK(clGetPlatformInfo(platform, CL_PLATFORM_NAME, sizeof pname, pname, NULL));
    }
    printf("queries=%d name_len_ok=%d units>0=%d\n", n, len == strlen(name) + 1, units > 0);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    return 0;
}
