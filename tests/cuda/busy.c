/* A CUDA guest that launches kernels when told, for the scheduling tests: reads
 * commands on stdin, answers one line each.
 *   run MS   launch the spin kernel, doubling its length until one launch takes MS ms
 *            (timed with events); answers "ok N NS"
 *   once N   one launch of N steps, waited for; answers "ok" if its result is right */
#include "common.h"

static unsigned expected(unsigned n) {
    unsigned x = 1;
    for (unsigned i = 0; i < n; i++) x = x * 1664525u + 1013904223u + (x >> 7);
    return x;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    CUcontext ctx;
    CUmodule mod = setup(argv[1], &ctx);
    CUfunction spin;
    CHECK(cuModuleGetFunction(&spin, mod, "spin"));
    CUdeviceptr out;
    CHECK(cuMemAlloc(&out, sizeof(unsigned)));
    CUevent a, b;
    CHECK(cuEventCreate(&a, 0));
    CHECK(cuEventCreate(&b, 0));
    char line[256];
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("ready\n");
    while (fgets(line, sizeof line, stdin)) {
        char cmd[32];
        unsigned long long arg = 0;
        if (sscanf(line, "%31s %llu", cmd, &arg) < 1) return 2;
        if (!strcmp(cmd, "run")) {
            unsigned n = 1 << 10;
            float ms = 0;
            for (;;) {
                void *args[] = {&n, &out};
                CHECK(cuEventRecord(a, NULL));
                CHECK(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL));
                CHECK(cuEventRecord(b, NULL));
                CHECK(cuEventSynchronize(b));
                CHECK(cuEventElapsedTime(&ms, a, b));
                if (ms >= (float)arg || n >= (1u << 31)) break;
                n *= 2;
            }
            printf("ok %u %llu\n", n, (unsigned long long)(ms * 1e6));
        } else if (!strcmp(cmd, "once")) {
            unsigned n = (unsigned)arg, got = 0;
            void *args[] = {&n, &out};
            CHECK(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL));
            CHECK(cuMemcpyDtoH(&got, out, sizeof got));
            printf(got == expected(n) ? "ok\n" : "wrong\n");
        } else {
            return 2;
        }
    }
    CHECK(cuCtxDestroy(ctx));
    return 0;
}
