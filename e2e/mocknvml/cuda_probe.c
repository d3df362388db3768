/*
 * fracgpu CUDA probe: what a process can see and allocate through the CUDA driver API, as one JSON line.
 *
 *   cuda-probe [alloc_mib]
 *
 * dlopens libcuda.so.1 through the normal loader search and uses only the real driver API (the symbols
 * cuda.h maps the calls to), so the same binary runs against the mock libcuda and on a real GPU. For each
 * visible device it reports name, UUID and cuMemGetInfo in a context of its own; with alloc_mib it also
 * allocates that many MiB on device 0 and reports the result and free memory before and after.
 *
 * Output on success (exit 0):
 *   {"driver_version":13000,"device_count":1,"devices":[{"index":0,"name":"...","uuid":"GPU-...",
 *    "total_mib":81559,"free_mib":81559}],"alloc":{"mib":1024,"result":"CUDA_SUCCESS",
 *    "free_mib_before":81559,"free_mib_after":80535}}
 * A failed allocation is reported in "alloc" (exit 0: not being allowed memory is an observation).
 * Any other failed call (exit 1): {"error":"cuInit","code":100,"result":"CUDA_ERROR_NO_DEVICE"}
 * Bad usage exits 2; libcuda.so.1 missing gives {"error":"dlopen","message":"..."} and exit 1.
 *
 * Build: e2e/mocknvml/build.sh [outdir]
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef struct {
    unsigned char bytes[16];
} CUuuid;

static struct {
    CUresult (*init)(unsigned int);
    CUresult (*driver_version)(int *);
    CUresult (*error_name)(CUresult, const char **);
    CUresult (*count)(int *);
    CUresult (*get)(CUdevice *, int);
    CUresult (*name)(char *, int, CUdevice);
    CUresult (*uuid)(CUuuid *, CUdevice);
    CUresult (*ctx_create)(CUcontext *, unsigned int, CUdevice);
    CUresult (*ctx_destroy)(CUcontext);
    CUresult (*mem_info)(size_t *, size_t *);
    CUresult (*alloc)(CUdeviceptr *, size_t);
    CUresult (*free)(CUdeviceptr);
} cu;

static const char *result_name(CUresult r) {
    const char *name = NULL;
    if (cu.error_name(r, &name) != 0 || name == NULL) {
        return "CUDA_ERROR_UNRECOGNIZED";
    }
    return name;
}

/* Prints the failure line for `call` and returns the exit status 1. */
static int failed(const char *call, CUresult r) {
    printf("{\"error\":\"%s\",\"code\":%d,\"result\":\"%s\"}\n", call, r, result_name(r));
    return 1;
}

static void json_string(const char *s) {
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            printf("\\%c", c);
        } else if (c < 0x20) {
            printf("\\u%04x", c);
        } else {
            putchar(c);
        }
    }
    putchar('"');
}

static int load(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (lib == NULL) {
        printf("{\"error\":\"dlopen\",\"message\":");
        json_string(dlerror());
        printf("}\n");
        return 0;
    }
    struct {
        void **slot;
        const char *symbol;
    } table[] = {
        {(void **)&cu.init, "cuInit"},
        {(void **)&cu.driver_version, "cuDriverGetVersion"},
        {(void **)&cu.error_name, "cuGetErrorName"},
        {(void **)&cu.count, "cuDeviceGetCount"},
        {(void **)&cu.get, "cuDeviceGet"},
        {(void **)&cu.name, "cuDeviceGetName"},
        {(void **)&cu.uuid, "cuDeviceGetUuid"},
        {(void **)&cu.ctx_create, "cuCtxCreate_v2"},
        {(void **)&cu.ctx_destroy, "cuCtxDestroy_v2"},
        {(void **)&cu.mem_info, "cuMemGetInfo_v2"},
        {(void **)&cu.alloc, "cuMemAlloc_v2"},
        {(void **)&cu.free, "cuMemFree_v2"},
    };
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++) {
        *table[i].slot = dlsym(lib, table[i].symbol);
        if (*table[i].slot == NULL) {
            printf("{\"error\":\"dlsym\",\"message\":\"libcuda.so.1 lacks %s\"}\n", table[i].symbol);
            return 0;
        }
    }
    return 1;
}

int main(int argc, char **argv) {
    long long alloc_mib = -1;
    if (argc > 2 || (argc == 2 && (sscanf(argv[1], "%lld", &alloc_mib) != 1 || alloc_mib <= 0))) {
        fprintf(stderr, "usage: %s [alloc_mib]   (alloc_mib: a positive number of MiB to allocate on device 0)\n",
                argv[0]);
        return 2;
    }
    if (!load()) {
        return 1;
    }
    int version = 0, count = 0;
    CUresult r;
    if ((r = cu.driver_version(&version)) != 0) {
        return failed("cuDriverGetVersion", r);
    }
    if ((r = cu.init(0)) != 0) {
        return failed("cuInit", r);
    }
    if ((r = cu.count(&count)) != 0) {
        return failed("cuDeviceGetCount", r);
    }
    enum { MAX_DEVICES = 64 };
    struct {
        char name[256];
        CUuuid uuid;
        size_t free_bytes, total;
    } devs[MAX_DEVICES];
    int shown = count < MAX_DEVICES ? count : MAX_DEVICES;
    for (int i = 0; i < shown; i++) {
        CUdevice dev;
        CUcontext ctx;
        if ((r = cu.get(&dev, i)) != 0) {
            return failed("cuDeviceGet", r);
        }
        if ((r = cu.name(devs[i].name, sizeof(devs[i].name), dev)) != 0) {
            return failed("cuDeviceGetName", r);
        }
        if ((r = cu.uuid(&devs[i].uuid, dev)) != 0) {
            return failed("cuDeviceGetUuid", r);
        }
        if ((r = cu.ctx_create(&ctx, 0, dev)) != 0) {
            return failed("cuCtxCreate_v2", r);
        }
        r = cu.mem_info(&devs[i].free_bytes, &devs[i].total);
        cu.ctx_destroy(ctx);
        if (r != 0) {
            return failed("cuMemGetInfo_v2", r);
        }
    }
    CUresult got = 0;
    size_t before = 0, after = 0;
    if (alloc_mib > 0 && count > 0) {
        CUdevice dev;
        CUcontext ctx;
        size_t total = 0;
        CUdeviceptr ptr = 0;
        if ((r = cu.get(&dev, 0)) != 0) {
            return failed("cuDeviceGet", r);
        }
        if ((r = cu.ctx_create(&ctx, 0, dev)) != 0) {
            return failed("cuCtxCreate_v2", r);
        }
        if ((r = cu.mem_info(&before, &total)) != 0) {
            return failed("cuMemGetInfo_v2", r);
        }
        got = cu.alloc(&ptr, (size_t)alloc_mib << 20);
        if ((r = cu.mem_info(&after, &total)) != 0) {
            return failed("cuMemGetInfo_v2", r);
        }
        if (got == 0 && (r = cu.free(ptr)) != 0) {
            return failed("cuMemFree_v2", r);
        }
        cu.ctx_destroy(ctx);
    }
    printf("{\"driver_version\":%d,\"device_count\":%d,\"devices\":[", version, count);
    for (int i = 0; i < shown; i++) {
        const unsigned char *b = devs[i].uuid.bytes;
        printf("%s{\"index\":%d,\"name\":", i ? "," : "", i);
        json_string(devs[i].name);
        printf(",\"uuid\":\"GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x\"",
               b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
        printf(",\"total_mib\":%zu,\"free_mib\":%zu}", devs[i].total >> 20, devs[i].free_bytes >> 20);
    }
    printf("]");
    if (alloc_mib > 0 && count > 0) {
        printf(",\"alloc\":{\"mib\":%lld,\"result\":\"%s\",\"free_mib_before\":%zu,\"free_mib_after\":%zu}",
               alloc_mib, result_name(got), before >> 20, after >> 20);
    }
    printf("}\n");
    return 0;
}
