/*
 * fracgpu mock CUDA driver: a stand-in for libcuda.so.1 on machines without an NVIDIA GPU or driver.
 *
 * Written from scratch for fracgpu (no NVIDIA header is used). The exported symbols, argument lists and
 * result codes are those of the CUDA driver API as a program resolving them with dlsym sees them (the
 * `_v2` names are what cuda.h maps cuCtxCreate, cuMemAlloc, ... to), so a probe written against the real
 * driver runs unchanged here. The GPUs come from the same profile as the mock NVML, and only GPUs whose
 * /dev/nvidia<minor> the process can open are enumerated (mock_profile.h), so names, UUIDs and memory
 * agree with NVML.
 *
 * Semantics kept from the real driver: every call but cuDriverGetVersion, cuGetErrorString and
 * cuGetErrorName returns CUDA_ERROR_NOT_INITIALIZED before a successful cuInit; cuInit returns
 * CUDA_ERROR_NO_DEVICE when no GPU is visible (and keeps failing); memory calls need a current context
 * (CUDA_ERROR_INVALID_CONTEXT otherwise); cuMemAlloc_v2 fails with CUDA_ERROR_OUT_OF_MEMORY when asked
 * for more than is free; allocations are tracked per device within the process, so cuMemGetInfo_v2
 * reflects them, and a destroyed context frees its allocations. Device memory is not backed: the
 * returned device pointers must not be dereferenced on the host (nor can they be on a real GPU).
 *
 * Build: e2e/mocknvml/build.sh [outdir]
 */
#include "mock_profile.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- CUresult values (as in cuda.h) ---- */
typedef enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_UNKNOWN = 999
} CUresult;

typedef int CUdevice;
typedef unsigned long long CUdeviceptr; /* CUdeviceptr_v2 on 64-bit hosts */
typedef struct mock_ctx *CUcontext;
typedef struct {
    char bytes[16];
} CUuuid;

/* CUdevice_attribute values answered by cuDeviceGetAttribute (as in cuda.h). */
enum {
    ATTR_PCI_BUS_ID = 33,
    ATTR_PCI_DEVICE_ID = 34,
    ATTR_COMPUTE_CAPABILITY_MAJOR = 75,
    ATTR_COMPUTE_CAPABILITY_MINOR = 76,
    ATTR_PCI_DOMAIN_ID = 50
};

struct mock_ctx {
    CUdevice device;
    int alive;
};

typedef struct mock_alloc {
    CUdeviceptr ptr;
    size_t size;
    CUcontext ctx;
    struct mock_alloc *next;
} mock_alloc;

#define MOCK_PTR_BASE 0x7f0000000000ull /* where fake device addresses start */
#define MOCK_PTR_ALIGN 512ull

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static mock_state g_state;
static int g_loaded;                     /* profile read (for cuDriverGetVersion) */
static CUresult g_init = CUDA_ERROR_NOT_INITIALIZED; /* result of the first cuInit */
static int g_init_tried;
static unsigned long long g_used[MOCK_MAX_GPUS]; /* bytes allocated per visible device */
static mock_alloc *g_allocs;
static CUdeviceptr g_next_ptr = MOCK_PTR_BASE;
static __thread CUcontext t_current;

/* Reads the profile once; returns the CUresult cuInit reports for it. Caller holds g_lock. */
static CUresult load_locked(void) {
    if (!g_loaded) {
        switch (mock_profile_load("fracgpu mock CUDA", &g_state)) {
        case MOCK_PROFILE_OK:
            g_loaded = 1;
            break;
        case MOCK_PROFILE_MISSING:
            return CUDA_ERROR_NO_DEVICE;
        default:
            return CUDA_ERROR_UNKNOWN;
        }
    }
    return g_state.count > 0 ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

static CUresult initialized(void) {
    pthread_mutex_lock(&g_lock);
    CUresult ret = g_init == CUDA_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_unlock(&g_lock);
    return ret;
}

static CUresult check_device(CUdevice dev) {
    CUresult ret = initialized();
    if (ret == CUDA_SUCCESS && (dev < 0 || (unsigned int)dev >= g_state.count)) {
        ret = CUDA_ERROR_INVALID_DEVICE;
    }
    return ret;
}

/* The calling thread's context, checked to be alive. Caller holds g_lock. */
static CUresult current_locked(CUcontext *ctx) {
    if (t_current == NULL || !t_current->alive) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    *ctx = t_current;
    return CUDA_SUCCESS;
}

static unsigned long long total_bytes(CUdevice dev) {
    return g_state.gpus[dev].memory_mib * 1048576ull;
}

/* ---- exported CUDA driver API ---- */

CUresult cuInit(unsigned int flags) {
    if (flags != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&g_lock);
    if (!g_init_tried) {
        g_init_tried = 1;
        g_init = load_locked();
    }
    CUresult ret = g_init;
    pthread_mutex_unlock(&g_lock);
    return ret;
}

CUresult cuDriverGetVersion(int *version) {
    if (version == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&g_lock);
    CUresult ret = load_locked();
    if (g_loaded) {
        *version = g_state.cuda_driver_version;
        ret = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return ret == CUDA_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN;
}

CUresult cuGetErrorName(CUresult error, const char **name) {
    if (name == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    switch (error) {
    case CUDA_SUCCESS: *name = "CUDA_SUCCESS"; break;
    case CUDA_ERROR_INVALID_VALUE: *name = "CUDA_ERROR_INVALID_VALUE"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *name = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case CUDA_ERROR_NOT_INITIALIZED: *name = "CUDA_ERROR_NOT_INITIALIZED"; break;
    case CUDA_ERROR_NO_DEVICE: *name = "CUDA_ERROR_NO_DEVICE"; break;
    case CUDA_ERROR_INVALID_DEVICE: *name = "CUDA_ERROR_INVALID_DEVICE"; break;
    case CUDA_ERROR_INVALID_CONTEXT: *name = "CUDA_ERROR_INVALID_CONTEXT"; break;
    case CUDA_ERROR_UNKNOWN: *name = "CUDA_ERROR_UNKNOWN"; break;
    default: *name = NULL; return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

CUresult cuGetErrorString(CUresult error, const char **text) {
    if (text == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    switch (error) {
    case CUDA_SUCCESS: *text = "no error"; break;
    case CUDA_ERROR_INVALID_VALUE: *text = "invalid argument"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *text = "out of memory"; break;
    case CUDA_ERROR_NOT_INITIALIZED: *text = "initialization error"; break;
    case CUDA_ERROR_NO_DEVICE: *text = "no CUDA-capable device is detected"; break;
    case CUDA_ERROR_INVALID_DEVICE: *text = "invalid device ordinal"; break;
    case CUDA_ERROR_INVALID_CONTEXT: *text = "invalid device context"; break;
    case CUDA_ERROR_UNKNOWN: *text = "unknown error"; break;
    default: *text = NULL; return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count) {
    CUresult ret = initialized();
    if (ret != CUDA_SUCCESS) {
        return ret;
    }
    if (count == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *count = (int)g_state.count;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    CUresult ret = initialized();
    if (ret != CUDA_SUCCESS) {
        return ret;
    }
    if (device == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (ordinal < 0 || (unsigned int)ordinal >= g_state.count) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    CUresult ret = check_device(dev);
    if (ret != CUDA_SUCCESS) {
        return ret;
    }
    if (name == NULL || len <= 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    snprintf(name, (size_t)len, "%s", g_state.gpus[dev].name); /* truncated like the real driver */
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) {
    CUresult ret = check_device(dev);
    if (ret != CUDA_SUCCESS) {
        return ret;
    }
    if (uuid == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    return mock_uuid_bytes(g_state.gpus[dev].uuid, (unsigned char *)uuid->bytes) ? CUDA_SUCCESS
                                                                                  : CUDA_ERROR_UNKNOWN;
}

CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) {
    return cuDeviceGetUuid(uuid, dev); /* no MIG: the GPU's own UUID */
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    CUresult ret = check_device(dev);
    if (ret != CUDA_SUCCESS) {
        return ret;
    }
    if (bytes == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *bytes = (size_t)total_bytes(dev);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice dev) {
    CUresult ret = check_device(dev);
    if (ret != CUDA_SUCCESS) {
        return ret;
    }
    if (value == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    const mock_device *d = &g_state.gpus[dev];
    switch (attribute) {
    case ATTR_COMPUTE_CAPABILITY_MAJOR: *value = d->cc_major; break;
    case ATTR_COMPUTE_CAPABILITY_MINOR: *value = d->cc_minor; break;
    case ATTR_PCI_BUS_ID: *value = (int)d->bus; break;
    case ATTR_PCI_DEVICE_ID: *value = (int)d->device; break;
    case ATTR_PCI_DOMAIN_ID: *value = (int)d->domain; break;
    default: return CUDA_ERROR_INVALID_VALUE; /* attributes the mock does not model */
    }
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetPCIBusId(char *bus_id, int len, CUdevice dev) {
    CUresult ret = check_device(dev);
    if (ret != CUDA_SUCCESS) {
        return ret;
    }
    if (bus_id == NULL || len <= 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    const mock_device *d = &g_state.gpus[dev];
    snprintf(bus_id, (size_t)len, "%04x:%02x:%02x.%x", d->domain, d->bus, d->device, d->function);
    return CUDA_SUCCESS;
}

CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    (void)flags; /* scheduling flags change nothing here */
    CUresult ret = check_device(dev);
    if (ret != CUDA_SUCCESS) {
        return ret;
    }
    if (pctx == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    CUcontext ctx = calloc(1, sizeof(*ctx));
    if (ctx == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    ctx->device = dev;
    ctx->alive = 1;
    t_current = ctx; /* a new context becomes current to the calling thread */
    *pctx = ctx;
    return CUDA_SUCCESS;
}

CUresult cuCtxDestroy_v2(CUcontext ctx) {
    CUresult ret = initialized();
    if (ret != CUDA_SUCCESS) {
        return ret;
    }
    pthread_mutex_lock(&g_lock);
    if (ctx == NULL || !ctx->alive) {
        pthread_mutex_unlock(&g_lock);
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    for (mock_alloc **p = &g_allocs; *p != NULL;) {
        mock_alloc *a = *p;
        if (a->ctx == ctx) {
            g_used[ctx->device] -= a->size;
            *p = a->next;
            free(a);
        } else {
            p = &a->next;
        }
    }
    ctx->alive = 0; /* kept allocated so a stale handle reads as invalid rather than as freed memory */
    if (t_current == ctx) {
        t_current = NULL;
    }
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
    CUresult ret = initialized();
    if (ret != CUDA_SUCCESS) {
        return ret;
    }
    if (ctx != NULL && !ctx->alive) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    t_current = ctx;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *pctx) {
    CUresult ret = initialized();
    if (ret != CUDA_SUCCESS) {
        return ret;
    }
    if (pctx == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *pctx = t_current != NULL && t_current->alive ? t_current : NULL;
    return CUDA_SUCCESS;
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    CUresult ret = initialized();
    if (ret != CUDA_SUCCESS) {
        return ret;
    }
    if (free_bytes == NULL || total == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&g_lock);
    CUcontext ctx;
    ret = current_locked(&ctx);
    if (ret == CUDA_SUCCESS) {
        *total = (size_t)total_bytes(ctx->device);
        *free_bytes = (size_t)(total_bytes(ctx->device) - g_used[ctx->device]);
    }
    pthread_mutex_unlock(&g_lock);
    return ret;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    CUresult ret = initialized();
    if (ret != CUDA_SUCCESS) {
        return ret;
    }
    if (dptr == NULL || bytesize == 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&g_lock);
    CUcontext ctx;
    ret = current_locked(&ctx);
    if (ret == CUDA_SUCCESS && bytesize > total_bytes(ctx->device) - g_used[ctx->device]) {
        ret = CUDA_ERROR_OUT_OF_MEMORY;
    }
    mock_alloc *a = NULL;
    if (ret == CUDA_SUCCESS && (a = malloc(sizeof(*a))) == NULL) {
        ret = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (ret == CUDA_SUCCESS) {
        a->ptr = g_next_ptr;
        a->size = bytesize;
        a->ctx = ctx;
        a->next = g_allocs;
        g_allocs = a;
        g_used[ctx->device] += bytesize;
        g_next_ptr += (bytesize + MOCK_PTR_ALIGN - 1) / MOCK_PTR_ALIGN * MOCK_PTR_ALIGN;
        *dptr = a->ptr;
    }
    pthread_mutex_unlock(&g_lock);
    return ret;
}

CUresult cuMemFree_v2(CUdeviceptr dptr) {
    CUresult ret = initialized();
    if (ret != CUDA_SUCCESS) {
        return ret;
    }
    pthread_mutex_lock(&g_lock);
    CUcontext ctx;
    ret = current_locked(&ctx);
    if (ret == CUDA_SUCCESS) {
        ret = CUDA_ERROR_INVALID_VALUE; /* not a live allocation */
        for (mock_alloc **p = &g_allocs; *p != NULL; p = &(*p)->next) {
            mock_alloc *a = *p;
            if (a->ptr == dptr) {
                g_used[a->ctx->device] -= a->size;
                *p = a->next;
                free(a);
                ret = CUDA_SUCCESS;
                break;
            }
        }
    }
    pthread_mutex_unlock(&g_lock);
    return ret;
}
