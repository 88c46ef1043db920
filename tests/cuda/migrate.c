/* A CUDA program whose state must survive moves between API servers, driven by
 * commands on stdin after it says "ready", one answer line each (migration's tests compare the answers
 * natively and with the session moved after every command):
 *   build N   allocate N list nodes, each in its own allocation (small ones, and
 *             every third of 3 MiB), linked by their device addresses
 *   walk K    a kernel follows the links and adds K to each node (on a stream,
 *             waited for with an event)
 *   sum       the nodes' values, and the kernel-only variable `visits`, read by a
 *             kernel and directly
 *   drop I    unlinks node I and frees it
 *   set V     writes `visits` from the host
 *   range I   the allocation holding a byte inside node I
 *   say       launches a kernel that can print (and prints nothing): from then on
 *             the context's printf FIFO size is fixed
 *   fifo      sets the printf FIFO size; answers the status
 *   end       frees everything */
#include "common.h"

#define MAX_NODES 64

struct node {
    CUdeviceptr next;
    unsigned long long value;
};

static CUdeviceptr nodes[MAX_NODES];
static int count;

static CUdeviceptr head(void) {
    for (int i = 0; i < count; i++)
        if (nodes[i]) return nodes[i];
    return 0;
}

static void link_all(void) {
    CUdeviceptr next = 0;
    for (int i = count - 1; i >= 0; i--) {
        if (!nodes[i]) continue;
        CHECK(cuMemcpyHtoD(nodes[i], &next, sizeof next));
        next = nodes[i];
    }
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    CUcontext ctx;
    CUmodule mod = setup(argv[1], &ctx);
    CUfunction walk, read_visits, say;
    CHECK(cuModuleGetFunction(&walk, mod, "walk"));
    CHECK(cuModuleGetFunction(&say, mod, "say"));
    CHECK(cuModuleGetFunction(&read_visits, mod, "read_visits"));
    CUstream stream;
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CUevent done;
    CHECK(cuEventCreate(&done, CU_EVENT_DISABLE_TIMING));
    CUdeviceptr result;
    CHECK(cuMemAlloc(&result, sizeof(unsigned long long)));
    CUdeviceptr visits;
    size_t visits_size;
    CHECK(cuModuleGetGlobal(&visits, &visits_size, mod, "visits"));
    char line[256];
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("ready\n");
    while (fgets(line, sizeof line, stdin)) {
        char cmd[32];
        unsigned long long arg = 0;
        if (sscanf(line, "%31s %llu", cmd, &arg) < 1) return 2;
        if (!strcmp(cmd, "build")) {
            for (unsigned long long i = 0; i < arg && count < MAX_NODES; i++, count++) {
                size_t size = count % 3 == 2 ? (size_t)3 << 20 : 16 + 8 * (size_t)count;
                CHECK(cuMemAlloc(&nodes[count], size));
                struct node n = {0, (unsigned long long)count};
                CHECK(cuMemcpyHtoD(nodes[count], &n, sizeof n));
            }
            link_all();
            printf("ok %d\n", count);
        } else if (!strcmp(cmd, "walk")) {
            CUdeviceptr h = head();
            void *args[] = {&h, &arg};
            CHECK(cuLaunchKernel(walk, 1, 1, 1, 1, 1, 1, 0, stream, args, NULL));
            CHECK(cuEventRecord(done, stream));
            CHECK(cuEventSynchronize(done));
            printf("ok\n");
        } else if (!strcmp(cmd, "sum")) {
            unsigned long long sum = 0, by_kernel = 0, direct = 0;
            for (int i = 0; i < count; i++) {
                if (!nodes[i]) continue;
                struct node n;
                CHECK(cuMemcpyDtoH(&n, nodes[i], sizeof n));
                sum += n.value;
            }
            void *args[] = {&result};
            CHECK(cuLaunchKernel(read_visits, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL));
            CHECK(cuMemcpyDtoH(&by_kernel, result, sizeof by_kernel));
            CHECK(cuMemcpyDtoH(&direct, visits, sizeof direct));
            printf("sum %llu visits %llu %llu\n", sum, by_kernel, direct);
        } else if (!strcmp(cmd, "drop")) {
            if (arg >= (unsigned long long)count || !nodes[arg]) return 2;
            CHECK(cuMemFree(nodes[arg]));
            nodes[arg] = 0;
            link_all();
            printf("ok\n");
        } else if (!strcmp(cmd, "set")) {
            CHECK(cuMemcpyHtoD(visits, &arg, sizeof arg));
            printf("ok\n");
        } else if (!strcmp(cmd, "range")) {
            if (arg >= (unsigned long long)count || !nodes[arg]) return 2;
            CUdeviceptr base;
            size_t size;
            CHECK(cuMemGetAddressRange(&base, &size, nodes[arg] + 8));
            printf("base %s size %zu\n", base == nodes[arg] ? "same" : "other", size);
        } else if (!strcmp(cmd, "say")) {
            int none = 0;
            void *args[] = {&none, &result};
            CHECK(cuLaunchKernel(say, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL));
            CHECK(cuCtxSynchronize());
            printf("ok\n");
        } else if (!strcmp(cmd, "fifo")) {
            CUresult r = cuCtxSetLimit(CU_LIMIT_PRINTF_FIFO_SIZE, (size_t)1 << 20);
            printf("fifo %d\n", (int)r);
        } else if (!strcmp(cmd, "end")) {
            for (int i = 0; i < count; i++)
                if (nodes[i]) CHECK(cuMemFree(nodes[i]));
            CHECK(cuMemFree(result));
            CHECK(cuEventDestroy(done));
            CHECK(cuStreamDestroy(stream));
            CHECK(cuCtxDestroy(ctx));
            printf("bye\n");
            return 0;
        } else {
            return 2;
        }
    }
    return 0;
}
