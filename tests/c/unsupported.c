/* Calls dispatch entries Hira does not remote: each must fail cleanly with the code
 * the specification gives for a device without the feature (Hira reports no partition
 * types, no pipes, no SVM), NULL for functions returning objects, never crash. */
#include "cl30.h"
#include <stdio.h>

int main(void) {
    cl_platform_id platform;
    cl_device_id device;
    cl_int err;
    cl_context ctx = first_context(&platform, &device);
    cl_device_partition_property props[] = {CL_DEVICE_PARTITION_EQUALLY, 1, 0};
    cl_device_id sub[4];
    cl_uint nsub = 0;
    for (int i = 0; i < 2; i++) {
        err = clCreateSubDevices(device, props, 4, sub, &nsub);
        printf("clCreateSubDevices: %s\n", err == CL_INVALID_VALUE ? "CL_INVALID_VALUE" : "other");
    }
    err = 0;
    cl_mem pipe = clCreatePipe(ctx, 0, 4, 16, NULL, &err);
    printf("clCreatePipe: null=%d %s\n", pipe == NULL, err == CL_INVALID_OPERATION ? "CL_INVALID_OPERATION" : "other");
    /* Fine-grained SVM is not reported, so cannot be allocated. */
    void *svm = clSVMAlloc(ctx, CL_MEM_READ_WRITE | CL_MEM_SVM_FINE_GRAIN_BUFFER, 64, 0);
    printf("clSVMAlloc fine-grained: null=%d\n", svm == NULL);
    clReleaseContext(ctx);
    return 0;
}
