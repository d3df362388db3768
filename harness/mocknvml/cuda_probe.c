/*
 * fracgpu CUDA probe: what a process can see and allocate through the CUDA driver API, as one JSON line.
 *
 *   cuda-probe [alloc_mib [hold_seconds]]
 *
 * dlopens libcuda.so.1 through the normal loader search and uses only the real driver API (the symbols
 * cuda.h maps the calls to), so the same binary runs against the mock libcuda and on a real GPU. For each
 * visible device it reports name, UUID and cuMemGetInfo in a context of its own; with alloc_mib it also
 * allocates that many MiB on device 0 and reports the result and free memory before and after.
 * With hold_seconds it keeps that allocation (and its context) after printing the line, flushed, so that
 * several clients can be alive at once; the hold ends after hold_seconds or at the first line on stdin (end
 * of input does not end it), then the same allocation is tried once more and a second line reports it:
 *   {"after_hold":{"mib":1024,"result":"CUDA_ERROR_OUT_OF_MEMORY"}}
 * (frees then are best effort; exit 0). Each device also reports cuDeviceGetAttribute(MULTIPROCESSOR_COUNT) and
 * "mig_uuid": the MIG UUID cuDeviceGetUuid_v2 gives a MIG device (null for a whole GPU, whose v2 UUID is its own),
 * and "mps" shows the MPS client environment the driver reads (CUDA_MPS_PIPE_DIRECTORY, default
 * /tmp/nvidia-mps; the two limits, null when unset).
 *
 * Output on success (exit 0):
 *   {"driver_version":13000,"device_count":1,"devices":[{"index":0,"name":"...","uuid":"GPU-...",
 *    "total_mib":81559,"free_mib":81559,"multiprocessor_count":132}],"mps":{"pipe_directory":"/tmp/nvidia-mps",
 *    "pinned_limit_env":null,"thread_percentage_env":"30"},"alloc":{"mib":1024,"result":"CUDA_SUCCESS",
 *    "free_mib_before":81559,"free_mib_after":80535}}
 * A failed allocation is reported in "alloc" (exit 0: not being allowed memory is an observation).
 * Any other failed call (exit 1): {"error":"cuInit","code":100,"result":"CUDA_ERROR_NO_DEVICE"}
 * Bad usage exits 2; libcuda.so.1 missing gives {"error":"dlopen","message":"..."} and exit 1.
 *
 * Build: harness/mocknvml/build.sh [outdir]
 */
#include <dlfcn.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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
    CUresult (*uuid_v2)(CUuuid *, CUdevice); /* optional: CUDA 11.4+ */
    CUresult (*attribute)(int *, int, CUdevice);
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
        {(void **)&cu.attribute, "cuDeviceGetAttribute"},
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
    *(void **)&cu.uuid_v2 = dlsym(lib, "cuDeviceGetUuid_v2");
    return 1;
}

static void json_env(const char *name) {
    const char *value = getenv(name);
    if (value == NULL) {
        printf("null");
    } else {
        json_string(value);
    }
}

/* Waits hold_seconds, or until a line arrives on stdin. */
static void hold(double seconds) {
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    int watch_stdin = 1;
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        double left = seconds - (double)(now.tv_sec - start.tv_sec) - (double)(now.tv_nsec - start.tv_nsec) / 1e9;
        if (left <= 0) {
            return;
        }
        struct pollfd fd = {.fd = 0, .events = POLLIN};
        int ready = poll(&fd, watch_stdin ? 1 : 0, (int)(left * 1000) + 1);
        if (ready > 0) {
            char buf[256];
            ssize_t n = read(0, buf, sizeof(buf));
            if (n > 0) {
                return;
            }
            watch_stdin = 0; /* end of input (or an error): only the time counts */
        }
    }
}

int main(int argc, char **argv) {
    long long alloc_mib = -1;
    double hold_seconds = 0;
    if (argc > 3 || (argc >= 2 && (sscanf(argv[1], "%lld", &alloc_mib) != 1 || alloc_mib <= 0)) ||
        (argc == 3 && (sscanf(argv[2], "%lf", &hold_seconds) != 1 || !(hold_seconds > 0)))) {
        fprintf(stderr,
                "usage: %s [alloc_mib [hold_seconds]]   (alloc_mib: a positive number of MiB to allocate on device "
                "0; hold_seconds: keep it that long, or until a line on stdin, then allocate it again)\n",
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
        CUuuid uuid, uuid_v2;
        int sm_count;
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
        devs[i].uuid_v2 = devs[i].uuid;
        if (cu.uuid_v2 != NULL && (r = cu.uuid_v2(&devs[i].uuid_v2, dev)) != 0) {
            return failed("cuDeviceGetUuid_v2", r);
        }
        if ((r = cu.attribute(&devs[i].sm_count, 16 /* CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT */, dev)) != 0) {
            return failed("cuDeviceGetAttribute", r);
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
    CUcontext ctx = NULL;
    CUdeviceptr ptr = 0;
    if (alloc_mib > 0 && count > 0) {
        CUdevice dev;
        size_t total = 0;
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
        /* after a failed allocation whose error is sticky (a fault), every call fails: report the allocation */
        if ((r = cu.mem_info(&after, &total)) != 0 && got == 0) {
            return failed("cuMemGetInfo_v2", r);
        }
        if (hold_seconds == 0) {
            if (got == 0 && (r = cu.free(ptr)) != 0) {
                return failed("cuMemFree_v2", r);
            }
            cu.ctx_destroy(ctx);
        }
    }
    printf("{\"driver_version\":%d,\"device_count\":%d,\"devices\":[", version, count);
    for (int i = 0; i < shown; i++) {
        const unsigned char *b = devs[i].uuid.bytes;
        printf("%s{\"index\":%d,\"name\":", i ? "," : "", i);
        json_string(devs[i].name);
        printf(",\"uuid\":\"GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x\"",
               b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
        const unsigned char *m = devs[i].uuid_v2.bytes;
        if (memcmp(m, b, 16) == 0) {
            printf(",\"mig_uuid\":null");
        } else {
            printf(",\"mig_uuid\":\"MIG-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x\"", m[0],
                   m[1], m[2], m[3], m[4], m[5], m[6], m[7], m[8], m[9], m[10], m[11], m[12], m[13], m[14], m[15]);
        }
        printf(",\"total_mib\":%zu,\"free_mib\":%zu,\"multiprocessor_count\":%d}", devs[i].total >> 20,
               devs[i].free_bytes >> 20, devs[i].sm_count);
    }
    printf("],\"mps\":{\"pipe_directory\":");
    const char *pipe_dir = getenv("CUDA_MPS_PIPE_DIRECTORY");
    json_string(pipe_dir != NULL && *pipe_dir != '\0' ? pipe_dir : "/tmp/nvidia-mps");
    printf(",\"pinned_limit_env\":");
    json_env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT");
    printf(",\"thread_percentage_env\":");
    json_env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
    printf("}");
    if (alloc_mib > 0 && count > 0) {
        printf(",\"alloc\":{\"mib\":%lld,\"result\":\"%s\",\"free_mib_before\":%zu,\"free_mib_after\":%zu}",
               alloc_mib, result_name(got), before >> 20, after >> 20);
    }
    printf("}\n");
    if (hold_seconds > 0 && alloc_mib > 0 && count > 0) {
        fflush(stdout);
        hold(hold_seconds);
        CUdeviceptr again = 0;
        CUresult second = cu.alloc(&again, (size_t)alloc_mib << 20);
        printf("{\"after_hold\":{\"mib\":%lld,\"result\":\"%s\"}}\n", alloc_mib, result_name(second));
        if (second == 0) {
            cu.free(again);
        }
        if (got == 0) {
            cu.free(ptr);
        }
        cu.ctx_destroy(ctx);
    }
    return 0;
}
