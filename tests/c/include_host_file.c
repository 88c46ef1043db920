/* Builds a kernel that includes a host file by absolute path and prints whether the
 * build log contains MARKER (such as "PATH:1:", an error inside the file: it was read).
 * Through Hira the name is moved into the API server's private build directory, which
 * holds only what the guest shipped, and Landlock keeps the compiler from the rest.
 * Usage: include_host_file PATH MARKER */
#include "cl30.h"
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    char src[512];
    snprintf(src, sizeof src, "#include \"%s\"\n__kernel void k(void) {}\n", argv[1]);
    const char *s = src;
    cl_platform_id platform;
    cl_device_id device;
    cl_int err;
    cl_context ctx = first_context(&platform, &device);
    cl_program p = clCreateProgramWithSource(ctx, 1, &s, NULL, &err);
    cl_int built = clBuildProgram(p, 1, &device, NULL, NULL, NULL);
    static char log[65536];
    clGetProgramBuildInfo(p, device, CL_PROGRAM_BUILD_LOG, sizeof log, log, NULL);
    printf("build=%d contents_in_log=%d\n", built, strstr(log, argv[2]) != NULL);
    return 0;
}
