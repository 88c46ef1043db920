/* Shared by Hira's workload suite: OpenCL setup, sizes, verification exit. */
#ifndef HIRA_WORKLOAD_H
#define HIRA_WORKLOAD_H

#include "../../tests/c/common.h"
#include <math.h>
#include <string.h>

/* `--short` selects the small configuration the test suite runs. */
static inline int is_short(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--short") == 0) return 1;
    return 0;
}

static inline cl_kernel kernel(cl_program p, const char *name) {
    cl_int err;
    cl_kernel k = clCreateKernel(p, name, &err);
    CHECK_ERR(err, name);
    return k;
}

static inline cl_mem buffer(cl_context ctx, cl_mem_flags flags, size_t size, void *host) {
    cl_int err;
    cl_mem m = clCreateBuffer(ctx, flags, size, host, &err);
    CHECK_ERR(err, "clCreateBuffer");
    return m;
}

/* Prints the result line and exits 0 if verified, 1 otherwise. */
static inline int finish(const char *name, int ok, const char *detail) {
    printf("%s: %s %s\n", name, ok ? "verified" : "MISMATCH", detail);
    return ok ? 0 : 1;
}

#endif
