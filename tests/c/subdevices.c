/* Device partitioning: clCreateSubDevices by every type the device reports, with its
 * errors; sub-devices used wherever a device is (contexts, queues, builds, kernels,
 * queries); references; a partition of a sub-device. */
#include "cl30.h"
#include <stdio.h>
#include <string.h>

static const char *SRC =
    "__kernel void add(__global const int *a, __global int *c, int k) {\n"
    "    size_t i = get_global_id(0);\n"
    "    c[i] = a[i] + k;\n"
    "}\n";

static const char *code(cl_int e) {
    switch (e) {
    case CL_SUCCESS: return "CL_SUCCESS";
    case CL_INVALID_VALUE: return "CL_INVALID_VALUE";
    case CL_INVALID_DEVICE: return "CL_INVALID_DEVICE";
    case CL_DEVICE_PARTITION_FAILED: return "CL_DEVICE_PARTITION_FAILED";
    case CL_INVALID_DEVICE_PARTITION_COUNT: return "CL_INVALID_DEVICE_PARTITION_COUNT";
    default: {
        static char b[32];
        snprintf(b, sizeof b, "%d", e);
        return b;
    }
    }
}

static void show_props(const char *what, cl_device_id d, cl_device_info param) {
    cl_device_partition_property p[16];
    size_t n = 0;
    cl_int e = clGetDeviceInfo(d, param, sizeof p, p, &n);
    printf("%s: %s, %zu bytes:", what, code(e), n);
    for (size_t i = 0; e == CL_SUCCESS && i < n / sizeof p[0]; i++) printf(" %#lx", (long)p[i]);
    printf("\n");
}

static cl_uint uint_info(cl_device_id d, cl_device_info param) {
    cl_uint v = 0;
    clGetDeviceInfo(d, param, sizeof v, &v, NULL);
    return v;
}

/* Runs `add` on `dev` in a context of `ndev` devices; prints whether it computed. */
static void compute_on(cl_context ctx, cl_device_id dev, cl_program p, int k) {
    cl_int err;
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err);
    if (err) { printf("queue: %s\n", code(err)); return; }
    enum { N = 256 };
    int a[N], c[N];
    for (int i = 0; i < N; i++) a[i] = i;
    cl_mem ma = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof a, a, &err);
    cl_mem mc = clCreateBuffer(ctx, CL_MEM_WRITE_ONLY, sizeof c, NULL, &err);
    cl_kernel kn = clCreateKernel(p, "add", &err);
    clSetKernelArg(kn, 0, sizeof ma, &ma);
    clSetKernelArg(kn, 1, sizeof mc, &mc);
    clSetKernelArg(kn, 2, sizeof k, &k);
    size_t g = N;
    err = clEnqueueNDRangeKernel(q, kn, 1, NULL, &g, NULL, 0, NULL, NULL);
    if (!err) err = clEnqueueReadBuffer(q, mc, CL_TRUE, 0, sizeof c, c, 0, NULL, NULL);
    int ok = err == CL_SUCCESS;
    for (int i = 0; ok && i < N; i++) ok = c[i] == i + k;
    cl_device_id qd = NULL;
    clGetCommandQueueInfo(q, CL_QUEUE_DEVICE, sizeof qd, &qd, NULL);
    printf("computed on the sub-device: %s (%s), queue's device is it: %d\n", ok ? "right" : "wrong",
           code(err), qd == dev);
    clReleaseKernel(kn);
    clReleaseMemObject(ma);
    clReleaseMemObject(mc);
    clReleaseCommandQueue(q);
}

int main(void) {
    cl_platform_id platform;
    cl_device_id root;
    cl_int err;
    cl_context root_ctx = first_context(&platform, &root);
    clReleaseContext(root_ctx);
    cl_uint cus = uint_info(root, CL_DEVICE_MAX_COMPUTE_UNITS);
    printf("root: %u compute units, at most %u sub-devices\n", cus,
           uint_info(root, CL_DEVICE_PARTITION_MAX_SUB_DEVICES));
    show_props("root partition properties", root, CL_DEVICE_PARTITION_PROPERTIES);
    show_props("root partition type", root, CL_DEVICE_PARTITION_TYPE);
    cl_device_affinity_domain dom = 0;
    clGetDeviceInfo(root, CL_DEVICE_PARTITION_AFFINITY_DOMAIN, sizeof dom, &dom, NULL);
    printf("root affinity domains: %#lx\n", (unsigned long)dom);
    cl_device_id parent = (cl_device_id)1;
    clGetDeviceInfo(root, CL_DEVICE_PARENT_DEVICE, sizeof parent, &parent, NULL);
    printf("root's parent is null: %d\n", parent == NULL);
    printf("retain and release the root: %s %s\n", code(clRetainDevice(root)), code(clReleaseDevice(root)));

    /* Counting only. */
    cl_device_partition_property equally[] = {CL_DEVICE_PARTITION_EQUALLY, 1, 0};
    cl_uint n = 0;
    err = clCreateSubDevices(root, equally, 0, NULL, &n);
    printf("equally by 1, count only: %s, %u\n", code(err), n);

    /* Errors. */
    cl_device_id subs[8];
    err = clCreateSubDevices(root, NULL, 8, subs, &n);
    printf("no properties: %s\n", code(err));
    cl_device_partition_property zero[] = {CL_DEVICE_PARTITION_EQUALLY, 0, 0};
    printf("equally by 0: %s\n", code(clCreateSubDevices(root, zero, 8, subs, NULL)));
    cl_device_partition_property too_many[] = {CL_DEVICE_PARTITION_BY_COUNTS, cus + 1, 0, 0};
    printf("a count over the units: %s\n", code(clCreateSubDevices(root, too_many, 8, subs, NULL)));
    printf("room for fewer than made: %s\n", code(clCreateSubDevices(root, equally, 1, subs, NULL)));
    cl_device_partition_property affinity[] = {CL_DEVICE_PARTITION_BY_AFFINITY_DOMAIN,
                                               CL_DEVICE_AFFINITY_DOMAIN_NEXT_PARTITIONABLE, 0};
    printf("by affinity domain: %s\n", code(clCreateSubDevices(root, affinity, 8, subs, NULL)));
    cl_device_partition_property unknown[] = {0x4321, 1, 0};
    printf("an unknown type: %s\n", code(clCreateSubDevices(root, unknown, 8, subs, NULL)));

    /* By counts. */
    cl_device_partition_property counts[] = {CL_DEVICE_PARTITION_BY_COUNTS, 1, 1, 0, 0};
    cl_device_id pair[2] = {0};
    err = clCreateSubDevices(root, counts, 2, pair, &n);
    printf("by counts 1,1: %s, %u made\n", code(err), n);
    for (cl_uint i = 0; err == CL_SUCCESS && i < n; i++) {
        printf("  sub-device %u: %u compute units, reference count %u\n", i,
               uint_info(pair[i], CL_DEVICE_MAX_COMPUTE_UNITS), uint_info(pair[i], CL_DEVICE_REFERENCE_COUNT));
        clGetDeviceInfo(pair[i], CL_DEVICE_PARENT_DEVICE, sizeof parent, &parent, NULL);
        printf("  its parent is the root: %d\n", parent == root);
        show_props("  its partition type", pair[i], CL_DEVICE_PARTITION_TYPE);
    }

    /* Equally: one context over both sub-devices, a build for them, a kernel on each. */
    cl_device_id eq[8];
    err = clCreateSubDevices(root, equally, 8, eq, &n);
    printf("equally by 1: %s, %u made, distinct from the first: %d\n", code(err), n,
           n > 0 && eq[0] != pair[0] && eq[0] != pair[1]);
    if (err == CL_SUCCESS && n > 0) {
        cl_context ctx = clCreateContext(NULL, n, eq, NULL, NULL, &err);
        printf("context over them: %s\n", code(err));
        cl_uint cn = 0;
        clGetContextInfo(ctx, CL_CONTEXT_NUM_DEVICES, sizeof cn, &cn, NULL);
        cl_device_id cd[8] = {0};
        clGetContextInfo(ctx, CL_CONTEXT_DEVICES, sizeof cd, cd, NULL);
        printf("its devices: %u, the sub-devices: %d\n", cn, cd[0] == eq[0] && (n < 2 || cd[1] == eq[1]));
        cl_program p = clCreateProgramWithSource(ctx, 1, &SRC, NULL, &err);
        err = clBuildProgram(p, n, eq, NULL, NULL, NULL);
        printf("built for them: %s\n", code(err));
        cl_build_status bs = 0;
        clGetProgramBuildInfo(p, eq[n - 1], CL_PROGRAM_BUILD_STATUS, sizeof bs, &bs, NULL);
        printf("build status on the last: %d\n", bs);
        for (cl_uint i = 0; i < n; i++) compute_on(ctx, eq[i], p, (int)i + 7);
        clReleaseProgram(p);
        printf("context with the root and a sub-device: ");
        cl_device_id mixed[2] = {root, eq[0]};
        cl_context m = clCreateContext(NULL, 2, mixed, NULL, NULL, &err);
        printf("%s\n", code(err));
        if (m) clReleaseContext(m);
        clReleaseContext(ctx);
        /* A partition of a sub-device. */
        cl_device_id nested[4];
        cl_uint nn = 0;
        err = clCreateSubDevices(eq[0], equally, 4, nested, &nn);
        printf("a sub-device partitioned equally by 1: %s, %u made\n", code(err), nn);
        for (cl_uint i = 0; err == CL_SUCCESS && i < nn; i++) {
            clGetDeviceInfo(nested[i], CL_DEVICE_PARENT_DEVICE, sizeof parent, &parent, NULL);
            printf("  its parent is that sub-device: %d\n", parent == eq[0]);
            clReleaseDevice(nested[i]);
        }
    }

    /* References. */
    err = clRetainDevice(pair[0]);
    printf("retain a sub-device: %s, count %u\n", code(err), uint_info(pair[0], CL_DEVICE_REFERENCE_COUNT));
    err = clReleaseDevice(pair[0]);
    printf("release it: %s, count %u\n", code(err), uint_info(pair[0], CL_DEVICE_REFERENCE_COUNT));
    for (cl_uint i = 0; i < 2; i++) printf("release pair %u: %s\n", i, code(clReleaseDevice(pair[i])));
    for (cl_uint i = 0; i < n; i++) clReleaseDevice(eq[i]);
    printf("done\n");
    return 0;
}
