/* Calls dispatch entries Hira does not remote: each must fail cleanly with the code
 * the specification gives for a device without the feature (Hira reports no pipes and
 * no fine-grained SVM), NULL for functions returning objects, never crash. */
#include "cl30.h"
#include <stdio.h>

int main(void) {
    cl_platform_id platform;
    cl_device_id device;
    cl_int err;
    cl_context ctx = first_context(&platform, &device);
    for (int i = 0; i < 2; i++) {
        err = 0;
        cl_mem pipe = clCreatePipe(ctx, 0, 4, 16, NULL, &err);
        printf("clCreatePipe: null=%d %s\n", pipe == NULL,
               err == CL_INVALID_OPERATION ? "CL_INVALID_OPERATION" : "other");
    }
    /* Fine-grained SVM is not reported, so cannot be allocated. */
    void *svm = clSVMAlloc(ctx, CL_MEM_READ_WRITE | CL_MEM_SVM_FINE_GRAIN_BUFFER, 64, 0);
    printf("clSVMAlloc fine-grained: null=%d\n", svm == NULL);
    clReleaseContext(ctx);
    return 0;
}
