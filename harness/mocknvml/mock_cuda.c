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
 * cuDeviceGetAttribute(MULTIPROCESSOR_COUNT) is the profile's gpu.<i>.sm_count. CUDA_VISIBLE_DEVICES selects
 * and orders the devices as CUDA does (ordinals among those the process can open, or UUIDs; the list ends at the
 * first entry that names none; a MIG device is named by its MIG UUID too), so an image that sets it to a device
 * the container lacks gets no device.
 *
 * MIG (mock_mig.h): a GPU whose MIG mode is on is not a CUDA device itself; each of its compute instances whose
 * GPU-instance and compute-instance capability nodes (/dev/nvidia-caps/nvidia-cap<minor>) the process can open
 * is one, in GI then CI id order, with its GPU instance's memory and its compute instance's multiprocessors, the
 * name "<GPU name> MIG <profile>", the GPU's PCI address, cuDeviceGetUuid the GPU's UUID and cuDeviceGetUuid_v2
 * its MIG UUID, as CUDA does. The instances come from the driver's state (the state dir of mock_mig.h); a
 * process that cannot read it sees a MIG-mode GPU's profile mode and no instance.
 *
 * Compute mode (mock_mps.h: state files shared with the mock NVML): without MPS, cuCtxCreate_v2 returns
 * CUDA_ERROR_DEVICES_UNAVAILABLE on a PROHIBITED GPU, and on an EXCLUSIVE_PROCESS GPU that a live MPS
 * server holds (another non-MPS process's context on an EXCLUSIVE_PROCESS GPU is not modelled).
 *
 * MPS client (mock_mps_control.c is the daemon; protocol in mock_mps.h). cuInit connects to
 * <CUDA_MPS_PIPE_DIRECTORY, default /tmp/nvidia-mps>/control. Nothing answers: CUDA without MPS, as NVIDIA
 * documents ("continues to run as it normally would"). It answers: cuInit registers with its
 * CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT ("0=10240M,1=2G", ordinals as this
 * process sees them; a malformed entry is ignored) and blocks until the daemon answers (a queued client of
 * another UID waits); a refusal makes it return the daemon's code (CUDA_ERROR_MPS_SERVER_NOT_READY for a server
 * in FAULT, CUDA_ERROR_MPS_MAX_CLIENTS_REACHED at the client cap), a closed connection
 * CUDA_ERROR_MPS_CONNECTION_FAILED.
 * The daemon answers the effective limits: the lowest of those set by the daemon's defaults, its server and
 * this process (a client may only lower them). On a GPU the daemon serves:
 *   - cuMemAlloc_v2 fails with CUDA_ERROR_OUT_OF_MEMORY when this process's live allocations plus the request
 *     exceed its pinned limit, or when all clients' allocations would exceed the GPU (the daemon counts);
 *   - cuMemGetInfo_v2: total is the GPU's; free is the lower of the GPU's memory less all clients'
 *     allocations and this process's limit less its own (a stricter reading; the real driver may differ);
 *   - MULTIPROCESSOR_COUNT is max(1, floor(sm_count * percentage / 100)).
 * When the connection is lost (the server died, the daemon quit), cuCtxCreate_v2, cuMemAlloc_v2 and
 * cuMemGetInfo_v2 return CUDA_ERROR_MPS_RPC_FAILURE ("the remote procedure call between the MPS server and
 * client failed" is the documented meaning closest to a dead server; CUDA_ERROR_MPS_SERVER_NOT_READY is for a
 * server still recovering); cuMemFree_v2 and cuCtxDestroy_v2 still free locally.
 * A fatal fault (the mock's stand-in for a kernel's illegal address: FRACGPU_MOCK_CUDA_FAULT=1 makes the
 * process's first cuMemAlloc_v2 through MPS fault) is reported to the daemon, whose server goes to FAULT; the
 * faulting process gets CUDA_ERROR_ILLEGAL_ADDRESS, the server's other clients CUDA_ERROR_MPS_CLIENT_TERMINATED,
 * from then on (sticky, as a real context after a fault).
 *
 * Build: harness/mocknvml/build.sh [outdir]
 */
#include "mock_mig.h"
#include "mock_mps.h"
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
    CUDA_ERROR_DEVICES_UNAVAILABLE = 46,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_MPS_CONNECTION_FAILED = 805,
    CUDA_ERROR_MPS_RPC_FAILURE = 806,
    CUDA_ERROR_MPS_SERVER_NOT_READY = 807,
    CUDA_ERROR_MPS_MAX_CLIENTS_REACHED = 808,
    CUDA_ERROR_MPS_CLIENT_TERMINATED = 809,
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
    ATTR_MULTIPROCESSOR_COUNT = 16,
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
static int g_mps_fd = -1;                         /* connection to the MPS control daemon; -1: no MPS */
static int g_mps_lost;                            /* the daemon closed it */
static double g_mps_pct = 100.0;                  /* effective active thread percentage */
static int g_mps_served[MOCK_MAX_GPUS];           /* per visible device: the daemon serves it */
static unsigned long long g_mps_limit[MOCK_MAX_GPUS]; /* effective pinned limit in bytes; 0: none */
static CUresult g_mps_sticky;                     /* after a fault: what every MPS call returns from then on */

/* Keeps the devices CUDA_VISIBLE_DEVICES names, in its order, as CUDA does: each entry an ordinal among the
 * devices this process can open, or a UUID (GPU-...); the list ends at the first entry that names no device,
 * and an empty list leaves none (cuInit then reports CUDA_ERROR_NO_DEVICE). Unset: all. Caller holds g_lock. */
static void visible_locked(void) {
    const char *visible = getenv("CUDA_VISIBLE_DEVICES");
    if (visible == NULL) {
        return;
    }
    mock_device kept[MOCK_MAX_GPUS];
    int taken[MOCK_MAX_GPUS] = {0};
    unsigned int n = 0;
    char list[MOCK_LINE_SIZE], *save = NULL;
    snprintf(list, sizeof(list), "%s", visible);
    for (char *item = strtok_r(list, ",", &save); item != NULL; item = strtok_r(NULL, ",", &save)) {
        while (*item == ' ') {
            item++;
        }
        char *end;
        unsigned long index = strtoul(item, &end, 10);
        int found = -1;
        for (unsigned int i = 0; i < g_state.count && found < 0; i++) {
            const char *mig = g_state.gpus[i].mig_uuid;
            if (strcmp(item, g_state.gpus[i].uuid) == 0 || (mig[0] != '\0' && strcmp(item, mig) == 0) ||
                (end != item && *end == '\0' && index == i)) {
                found = (int)i;
            }
        }
        if (found < 0 || taken[found]) {
            break;
        }
        taken[found] = 1;
        kept[n++] = g_state.gpus[found];
    }
    memcpy(g_state.gpus, kept, n * sizeof(kept[0]));
    g_state.count = n;
}

/* Replaces each GPU in MIG mode by the compute instances this process may open (see the file comment). */
static void expand_mig(void) {
    static mock_state whole;
    whole = g_state;
    g_state.count = 0;
    for (unsigned int i = 0; i < whole.count; i++) {
        const mock_device *gpu = &whole.gpus[i];
        const mock_mig_table *t = mock_mig_table_of(gpu);
        mock_mig_state s;
        if (t == NULL || !mock_mig_load(&whole, gpu, &s) || s.current != 1) {
            g_state.gpus[g_state.count++] = *gpu;
            continue;
        }
        for (unsigned int g = 0; g < MOCK_MIG_GI_IDS; g++) {
            const mock_mig_profile *p = s.gi[g].used ? mock_mig_profile_by_id(t, s.gi[g].profile_id) : NULL;
            for (unsigned int c = 0; p != NULL && c < MOCK_MIG_CI_IDS && g_state.count < MOCK_MAX_GPUS; c++) {
                if (!s.gi[g].ci[c].used || !mock_mig_cap_openable(mock_mig_cap_minor(gpu->minor, g, -1)) ||
                    !mock_mig_cap_openable(mock_mig_cap_minor(gpu->minor, g, (int)c))) {
                    continue;
                }
                mock_device *d = &g_state.gpus[g_state.count++];
                *d = *gpu;
                snprintf(d->name, sizeof(d->name), "%s MIG %s", gpu->name, p->name);
                d->memory_mib = p->memory_mib;
                d->sm_count = mock_mig_ci_multiprocessors(t, p, s.gi[g].ci[c].slices);
                mock_mig_uuid(gpu->uuid, g, c, s.gi[g].serial, d->mig_uuid);
            }
        }
    }
}

/* Reads the profile once; returns the CUresult cuInit reports for it. Caller holds g_lock. */
static CUresult load_locked(void) {
    if (!g_loaded) {
        switch (mock_profile_load("fracgpu mock CUDA", &g_state)) {
        case MOCK_PROFILE_OK:
            g_loaded = 1;
            expand_mig();
            visible_locked();
            break;
        case MOCK_PROFILE_MISSING:
            return CUDA_ERROR_NO_DEVICE;
        default:
            return CUDA_ERROR_UNKNOWN;
        }
    }
    return g_state.count > 0 ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

/* Whether dev is used through MPS. Caller holds g_lock. */
static int mps_locked(CUdevice dev) {
    return g_mps_fd >= 0 && g_mps_served[dev];
}

/* One request to the daemon and its answer; returns 0 (and the connection is lost) on failure. Caller holds
 * g_lock. */
static int mps_call_locked(const char *request, char *reply, size_t size) {
    if (g_mps_lost) {
        return 0;
    }
    if (!mock_mps_send(g_mps_fd, request) || !mock_mps_recv_line(g_mps_fd, reply, size)) {
        g_mps_lost = 1;
        return 0;
    }
    if (strcmp(reply, "terminated") == 0) {
        g_mps_sticky = CUDA_ERROR_MPS_CLIENT_TERMINATED;
    }
    return 1;
}

/* Reports freed bytes to the daemon, best effort. Caller holds g_lock. */
static void mps_free_locked(CUdevice dev, size_t size) {
    char request[MOCK_UUID_SIZE + 64], reply[64];
    if (mps_locked(dev)) {
        snprintf(request, sizeof(request), "free %s %zu\n", g_state.gpus[dev].uuid, size);
        mps_call_locked(request, reply, sizeof(reply));
    }
}

/* cuInit's MPS part, after the profile loaded: registers with the daemon when one answers. Caller holds g_lock. */
static CUresult mps_register_locked(void) {
    static char msg[MOCK_MPS_LINE], reply[MOCK_MPS_LINE];
    int fd = mock_mps_connect(mock_mps_pipe_dir());
    if (fd < 0) {
        return CUDA_SUCCESS; /* no daemon: CUDA without MPS */
    }
    unsigned long long env_limit[MOCK_MAX_GPUS] = {0};
    const char *limits = getenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT");
    char list[MOCK_LINE_SIZE];
    snprintf(list, sizeof(list), "%s", limits != NULL ? limits : "");
    for (char *save = NULL, *item = strtok_r(list, ",", &save); item != NULL; item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '='), *end;
        unsigned long long bytes;
        if (eq == NULL) {
            continue;
        }
        *eq = '\0';
        unsigned long ordinal = strtoul(item, &end, 10);
        if (end != item && *end == '\0' && ordinal < g_state.count && mock_mps_parse_bytes(eq + 1, &bytes)) {
            env_limit[ordinal] = bytes;
        }
    }
    double pct;
    const char *pct_env = getenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
    size_t len = 0;
    if (pct_env != NULL && mock_mps_parse_pct(pct_env, &pct)) {
        len = (size_t)snprintf(msg, sizeof(msg), "hello %g", pct);
    } else {
        len = (size_t)snprintf(msg, sizeof(msg), "hello -");
    }
    for (unsigned int i = 0; i < g_state.count && len < sizeof(msg); i++) {
        if (env_limit[i] > 0) {
            len += (size_t)snprintf(msg + len, sizeof(msg) - len, " %s=%llu", g_state.gpus[i].uuid, env_limit[i]);
        }
    }
    len = len < sizeof(msg) - 1 ? len : sizeof(msg) - 2; /* never with 64 GPUs */
    snprintf(msg + len, sizeof(msg) - len, "\n");
    int server = 0, used = 0, code = 0;
    if (!mock_mps_send(fd, msg) || !mock_mps_recv_line(fd, reply, sizeof(reply)) ||
        sscanf(reply, "ok %d %lf%n", &server, &g_mps_pct, &used) != 2) {
        close(fd);
        if (sscanf(reply, "err %d", &code) == 1 &&
            (code == CUDA_ERROR_MPS_SERVER_NOT_READY || code == CUDA_ERROR_MPS_MAX_CLIENTS_REACHED)) {
            return (CUresult)code;
        }
        return CUDA_ERROR_MPS_CONNECTION_FAILED;
    }
    char *save = NULL;
    for (char *item = strtok_r(reply + used, " ", &save); item != NULL; item = strtok_r(NULL, " ", &save)) {
        char *eq = strchr(item, '=');
        for (unsigned int i = 0; eq != NULL && i < g_state.count; i++) {
            if (strncmp(item, g_state.gpus[i].uuid, (size_t)(eq - item)) == 0 &&
                g_state.gpus[i].uuid[eq - item] == '\0') {
                g_mps_served[i] = 1;
                g_mps_limit[i] = strtoull(eq + 1, NULL, 10); /* 0: no limit */
            }
        }
    }
    g_mps_fd = fd; /* kept open for the process's life */
    return CUDA_SUCCESS;
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
        if (g_init == CUDA_SUCCESS) {
            g_init = mps_register_locked();
        }
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
    case CUDA_ERROR_DEVICES_UNAVAILABLE: *name = "CUDA_ERROR_DEVICES_UNAVAILABLE"; break;
    case CUDA_ERROR_MPS_CONNECTION_FAILED: *name = "CUDA_ERROR_MPS_CONNECTION_FAILED"; break;
    case CUDA_ERROR_MPS_RPC_FAILURE: *name = "CUDA_ERROR_MPS_RPC_FAILURE"; break;
    case CUDA_ERROR_MPS_SERVER_NOT_READY: *name = "CUDA_ERROR_MPS_SERVER_NOT_READY"; break;
    case CUDA_ERROR_MPS_MAX_CLIENTS_REACHED: *name = "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED"; break;
    case CUDA_ERROR_MPS_CLIENT_TERMINATED: *name = "CUDA_ERROR_MPS_CLIENT_TERMINATED"; break;
    case CUDA_ERROR_ILLEGAL_ADDRESS: *name = "CUDA_ERROR_ILLEGAL_ADDRESS"; break;
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
    case CUDA_ERROR_DEVICES_UNAVAILABLE: *text = "CUDA devices are busy or unavailable"; break;
    case CUDA_ERROR_MPS_CONNECTION_FAILED: *text = "could not connect to the MPS control daemon or server"; break;
    case CUDA_ERROR_MPS_RPC_FAILURE: *text = "remote procedure call to the MPS server failed"; break;
    case CUDA_ERROR_MPS_SERVER_NOT_READY: *text = "MPS server not ready for new clients"; break;
    case CUDA_ERROR_MPS_MAX_CLIENTS_REACHED: *text = "MPS client limit reached"; break;
    case CUDA_ERROR_MPS_CLIENT_TERMINATED: *text = "the MPS client has been terminated by the server"; break;
    case CUDA_ERROR_ILLEGAL_ADDRESS: *text = "an illegal memory access was encountered"; break;
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
    CUresult ret = cuDeviceGetUuid(uuid, dev);
    const char *mig = ret == CUDA_SUCCESS ? g_state.gpus[dev].mig_uuid : "";
    if (*mig == '\0') {
        return ret; /* a whole GPU: its own UUID */
    }
    char as_gpu[MOCK_UUID_SIZE]; /* the MIG UUID's hex digits, in the form mock_uuid_bytes reads */
    snprintf(as_gpu, sizeof(as_gpu), "GPU-%s", mig + 4);
    return mock_uuid_bytes(as_gpu, (unsigned char *)uuid->bytes) ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN;
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
    case ATTR_MULTIPROCESSOR_COUNT:
        pthread_mutex_lock(&g_lock);
        *value = mps_locked(dev) ? (int)(d->sm_count * g_mps_pct / 100.0) : (int)d->sm_count;
        pthread_mutex_unlock(&g_lock);
        *value = *value > 0 ? *value : 1;
        break;
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
    char reply[64];
    pthread_mutex_lock(&g_lock);
    if (g_mps_fd >= 0) { /* through MPS: the server must still be there */
        ret = g_mps_lost || (mps_locked(dev) && !mps_call_locked("ping\n", reply, sizeof(reply)))
                  ? CUDA_ERROR_MPS_RPC_FAILURE
                  : g_mps_sticky != CUDA_SUCCESS ? g_mps_sticky : CUDA_SUCCESS;
    } else {
        int mode = mock_compute_mode(&g_state, g_state.gpus[dev].uuid);
        if (mode == MOCK_COMPUTE_PROHIBITED ||
            (mode == MOCK_COMPUTE_EXCLUSIVE_PROCESS && mock_mps_server_holds(&g_state, g_state.gpus[dev].uuid))) {
            ret = CUDA_ERROR_DEVICES_UNAVAILABLE;
        }
    }
    pthread_mutex_unlock(&g_lock);
    if (ret != CUDA_SUCCESS) {
        return ret;
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
            mps_free_locked(ctx->device, a->size);
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
        CUdevice dev = ctx->device;
        unsigned long long free_now = total_bytes(dev) - g_used[dev];
        if (mps_locked(dev)) {
            char request[MOCK_UUID_SIZE + 16], reply[64];
            unsigned long long all_used = 0;
            snprintf(request, sizeof(request), "info %s\n", g_state.gpus[dev].uuid);
            if (!mps_call_locked(request, reply, sizeof(reply)) || sscanf(reply, "ok %llu", &all_used) != 1) {
                ret = g_mps_sticky != CUDA_SUCCESS ? g_mps_sticky : CUDA_ERROR_MPS_RPC_FAILURE;
            }
            free_now = all_used < total_bytes(dev) ? total_bytes(dev) - all_used : 0;
            if (g_mps_limit[dev] > 0) {
                unsigned long long own = g_mps_limit[dev] > g_used[dev] ? g_mps_limit[dev] - g_used[dev] : 0;
                free_now = own < free_now ? own : free_now;
            }
        }
        *total = (size_t)total_bytes(dev);
        *free_bytes = (size_t)free_now;
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
    if (ret == CUDA_SUCCESS && mps_locked(ctx->device)) {
        CUdevice dev = ctx->device;
        char request[MOCK_UUID_SIZE + 64], reply[64];
        snprintf(request, sizeof(request), "alloc %s %zu\n", g_state.gpus[dev].uuid, bytesize);
        const char *fault = getenv("FRACGPU_MOCK_CUDA_FAULT");
        if (g_mps_lost) {
            ret = CUDA_ERROR_MPS_RPC_FAILURE;
        } else if (g_mps_sticky != CUDA_SUCCESS) {
            ret = g_mps_sticky;
        } else if (fault != NULL && strcmp(fault, "1") == 0) {
            snprintf(request, sizeof(request), "fault %s\n", g_state.gpus[dev].uuid);
            mps_call_locked(request, reply, sizeof(reply));
            ret = g_mps_sticky = CUDA_ERROR_ILLEGAL_ADDRESS;
        } else if (g_mps_limit[dev] > 0 && g_used[dev] + bytesize > g_mps_limit[dev]) {
            ret = CUDA_ERROR_OUT_OF_MEMORY;
        } else if (!mps_call_locked(request, reply, sizeof(reply))) {
            ret = CUDA_ERROR_MPS_RPC_FAILURE;
        } else if (g_mps_sticky != CUDA_SUCCESS) {
            ret = g_mps_sticky;
        } else if (strcmp(reply, "ok") != 0) {
            ret = CUDA_ERROR_OUT_OF_MEMORY;
        }
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
                mps_free_locked(a->ctx->device, a->size);
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
