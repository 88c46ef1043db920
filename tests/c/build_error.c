/* A program with a deliberate compile error: the build fails and the log says why. */
#include "common.h"
#include <string.h>

static const char *SRC =
    "__kernel void broken(__global float *x) {\n"
    "    x[get_global_id(0)] = undeclared_variable * 2.0f;\n"
    "}\n";

int main(void) {
    cl_platform_id platform;
    cl_device_id device;
    cl_context ctx;
    cl_command_queue q;
    cl_int err;
    setup(&platform, &device, &ctx, &q, 0);
    cl_program p = clCreateProgramWithSource(ctx, 1, &SRC, NULL, &err);
    CHECK_ERR(err, "clCreateProgramWithSource");
    err = clBuildProgram(p, 1, &device, "-cl-std=CL1.2", NULL, NULL);
    printf("build status: %s\n", err == CL_BUILD_PROGRAM_FAILURE ? "CL_BUILD_PROGRAM_FAILURE" : "unexpected");
    cl_build_status bs;
    CHECK(clGetProgramBuildInfo(p, device, CL_PROGRAM_BUILD_STATUS, sizeof bs, &bs, NULL));
    printf("build info status: %s\n", bs == CL_BUILD_ERROR ? "CL_BUILD_ERROR" : "unexpected");
    size_t n = 0;
    CHECK(clGetProgramBuildInfo(p, device, CL_PROGRAM_BUILD_LOG, 0, NULL, &n));
    char *log = malloc(n);
    CHECK(clGetProgramBuildInfo(p, device, CL_PROGRAM_BUILD_LOG, n, log, NULL));
    char opts[256];
    CHECK(clGetProgramBuildInfo(p, device, CL_PROGRAM_BUILD_OPTIONS, sizeof opts, opts, NULL));
    printf("build options: %s\n", opts);
    printf("log mentions the identifier: %d\n", strstr(log, "undeclared_variable") != NULL);
    /* The compiler names a temporary file that differs from run to run: print each
     * log line from the source position on. */
    printf("--- build log ---\n");
    for (char *line = strtok(log, "\n"); line; line = strtok(NULL, "\n")) {
        char *at = strstr(line, ".cl:");
        printf("%s\n", at ? at + 3 : line);
    }
    printf("--- end ---\n");
    err = clGetProgramBuildInfo(p, device, CL_PROGRAM_BUILD_LOG, 1, opts, NULL);
    printf("too-small buffer: %s\n", err == CL_INVALID_VALUE ? "CL_INVALID_VALUE" : "unexpected");
    cl_kernel k = clCreateKernel(p, "broken", &err);
    printf("kernel from failed build: %s\n", k == NULL && err == CL_INVALID_PROGRAM_EXECUTABLE
                                                 ? "CL_INVALID_PROGRAM_EXECUTABLE"
                                                 : "unexpected");
    free(log);
    clReleaseProgram(p);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    return 0;
}
