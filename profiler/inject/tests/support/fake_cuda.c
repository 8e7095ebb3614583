/*
 * A stand-in for the CUDA driver library (libcuda.so.1), for testing CUPTI injection without a
 * GPU: its cuInit does what the real driver's does for an injection library -- it loads the
 * library named by CUDA_INJECTION64_PATH and calls its InitializeInjection, once -- and nothing
 * else. Without CUDA_INJECTION64_PATH it answers CUDA_ERROR_NO_DEVICE, as a driver on a machine
 * without a GPU does. Built by the tests with `cc -shared` under the soname libcuda.so.1.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

enum { CUDA_SUCCESS = 0, CUDA_ERROR_NO_DEVICE = 100, CUDA_ERROR_UNKNOWN = 999 };

static int g_initialized;

int cuInit(unsigned int flags) {
    (void)flags;
    const char *path = getenv("CUDA_INJECTION64_PATH");
    if (!path || !*path) return CUDA_ERROR_NO_DEVICE;
    if (g_initialized) return CUDA_SUCCESS;
    g_initialized = 1;
    void *lib = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
        fprintf(stderr, "fake-cuda: cannot load %s: %s\n", path, dlerror());
        return CUDA_ERROR_UNKNOWN;
    }
    int (*init)(void) = (int (*)(void))dlsym(lib, "InitializeInjection");
    if (!init) {
        fprintf(stderr, "fake-cuda: %s has no InitializeInjection\n", path);
        return CUDA_ERROR_UNKNOWN;
    }
    init();
    return CUDA_SUCCESS;
}

int cuDriverGetVersion(int *version) {
    *version = 13000;
    return CUDA_SUCCESS;
}
