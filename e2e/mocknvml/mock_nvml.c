/*
 * fracgpu mock NVML: a stand-in for libnvidia-ml.so.1 on machines without an NVIDIA GPU or driver.
 *
 * Written from scratch for fracgpu (no NVIDIA header is used). The exported symbols, argument lists,
 * struct layouts and return codes follow what the `nvidia-ml-py` package (imported as `pynvml`) passes
 * through ctypes, so the real pynvml and the production discovery code run unchanged against it.
 *
 * The GPUs come from a profile file named by the environment variable FRACGPU_MOCK_NVML_PROFILE, or
 * one compiled in, read on the first successful nvmlInit*; only GPUs whose /dev/nvidia<minor> the
 * process can open are enumerated (mock_profile.h says where from, and which device root).
 * Format: one `key = value` per line; blank lines and lines whose first non-blank character is '#' are
 * ignored. Keys:
 *
 *   driver_version          = 580.65.06          (required)
 *   cuda_driver_version     = 13000              (optional, default 13000; CUDA 13.0)
 *   uvm_major               = 510                (optional; used by the e2e harness, ignored here)
 *   gpu.<i>.uuid            = GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx
 *   gpu.<i>.name            = NVIDIA H100 80GB HBM3
 *   gpu.<i>.memory_mib      = 81559
 *   gpu.<i>.minor           = 0
 *   gpu.<i>.pci_bus_id      = 0000:18:00.0       (domain of up to 8 hex digits)
 *   gpu.<i>.architecture    = hopper             (kepler maxwell pascal volta turing ampere ada hopper
 *                                                 blackwell rubin)
 *   gpu.<i>.cuda_cc         = 9.0
 *   gpu.<i>.pci_device_id   = 0x233010de         (optional: device id << 16 | vendor id)
 *
 * GPU indices must run 0..n-1 (n <= 64) and every GPU needs all non-optional keys; UUIDs, minors and
 * PCI bus ids must be distinct. A missing or unreadable profile makes nvmlInit* return
 * NVML_ERROR_LIBRARY_NOT_FOUND, a malformed one NVML_ERROR_UNKNOWN; either way one line naming the
 * profile path and the problem goes to stderr.
 *
 * Build: e2e/mocknvml/build.sh [outdir]
 */

#include "mock_profile.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* ---- return codes (values as in pynvml's NVML_* constants) ---- */
enum {
    MOCK_SUCCESS = 0,
    MOCK_ERROR_UNINITIALIZED = 1,
    MOCK_ERROR_INVALID_ARGUMENT = 2,
    MOCK_ERROR_NOT_SUPPORTED = 3,
    MOCK_ERROR_NOT_FOUND = 6,
    MOCK_ERROR_INSUFFICIENT_SIZE = 7,
    MOCK_ERROR_LIBRARY_NOT_FOUND = 12,
    MOCK_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    MOCK_ERROR_UNKNOWN = 999
};
typedef int mock_return;

/* ---- structs exchanged with callers (layouts match pynvml's ctypes structures) ---- */
typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} mock_memory_v1; /* c_nvmlMemory_t */

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} mock_memory_v2; /* c_nvmlMemory_v2_t */

#define MOCK_MEMORY_V2_VERSION ((unsigned int)(sizeof(mock_memory_v2) | (2u << 24)))

typedef struct {
    char bus_id_legacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pci_device_id;
    unsigned int pci_subsystem_id;
    char bus_id[32];
} mock_pci_info; /* nvmlPciInfo_t, as filled by nvmlDeviceGetPciInfo_v3 */

typedef mock_device *mock_handle; /* nvmlDevice_t is an opaque pointer */

static mock_state g_state;
static int g_refcount;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

/* Reads the profile into g_state. Returns MOCK_SUCCESS or the error nvmlInit* should return. */
static mock_return load_profile(void) {
    switch (mock_profile_load("fracgpu mock NVML", &g_state)) {
    case MOCK_PROFILE_OK:
        return MOCK_SUCCESS;
    case MOCK_PROFILE_MISSING:
        return MOCK_ERROR_LIBRARY_NOT_FOUND;
    default:
        return MOCK_ERROR_UNKNOWN;
    }
}

/* ---- helpers for the exported calls ---- */

static int initialized(void) {
    pthread_mutex_lock(&g_lock);
    int yes = g_refcount > 0;
    pthread_mutex_unlock(&g_lock);
    return yes;
}

/* Common checks for per-device calls: library initialised, handle valid, output pointer given. */
static mock_return check_device(mock_handle dev, const void *out) {
    if (!initialized()) {
        return MOCK_ERROR_UNINITIALIZED;
    }
    if (dev == NULL || out == NULL || dev < &g_state.gpus[0] || dev >= &g_state.gpus[g_state.count]) {
        return MOCK_ERROR_INVALID_ARGUMENT;
    }
    return MOCK_SUCCESS;
}

static mock_return put_text(char *dst, unsigned int length, const char *src) {
    if (dst == NULL) {
        return MOCK_ERROR_INVALID_ARGUMENT;
    }
    if (strlen(src) + 1 > length) {
        return MOCK_ERROR_INSUFFICIENT_SIZE;
    }
    strcpy(dst, src);
    return MOCK_SUCCESS;
}

/* ---- exported NVML API ---- */

mock_return nvmlInitWithFlags(unsigned int flags) {
    (void)flags; /* NVML_INIT_FLAG_NO_GPUS / NO_ATTACH need nothing special here */
    pthread_mutex_lock(&g_lock);
    mock_return ret = MOCK_SUCCESS;
    if (g_refcount == 0) {
        ret = load_profile();
    }
    if (ret == MOCK_SUCCESS) {
        g_refcount++;
    }
    pthread_mutex_unlock(&g_lock);
    return ret;
}

mock_return nvmlInit_v2(void) {
    return nvmlInitWithFlags(0);
}

mock_return nvmlInit(void) {
    return nvmlInitWithFlags(0);
}

mock_return nvmlShutdown(void) {
    pthread_mutex_lock(&g_lock);
    mock_return ret = MOCK_SUCCESS;
    if (g_refcount == 0) {
        ret = MOCK_ERROR_UNINITIALIZED;
    } else {
        g_refcount--;
    }
    pthread_mutex_unlock(&g_lock);
    return ret;
}

const char *nvmlErrorString(mock_return result) {
    switch (result) {
    case MOCK_SUCCESS:
        return "Success";
    case MOCK_ERROR_UNINITIALIZED:
        return "Uninitialized";
    case MOCK_ERROR_INVALID_ARGUMENT:
        return "Invalid Argument";
    case MOCK_ERROR_NOT_SUPPORTED:
        return "Not Supported";
    case MOCK_ERROR_NOT_FOUND:
        return "Not Found";
    case MOCK_ERROR_INSUFFICIENT_SIZE:
        return "Insufficient Size";
    case MOCK_ERROR_LIBRARY_NOT_FOUND:
        return "NVML Shared Library Not Found";
    case MOCK_ERROR_ARGUMENT_VERSION_MISMATCH:
        return "Argument Version Mismatch";
    case MOCK_ERROR_UNKNOWN:
        return "Unknown Error";
    default:
        return "Unknown Error";
    }
}

mock_return nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!initialized()) {
        return MOCK_ERROR_UNINITIALIZED;
    }
    return put_text(version, length, g_state.driver_version);
}

mock_return nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    char text[MOCK_DRIVER_SIZE + 16];
    if (!initialized()) {
        return MOCK_ERROR_UNINITIALIZED;
    }
    snprintf(text, sizeof(text), "%d.%s", g_state.cuda_driver_version / 1000, g_state.driver_version);
    return put_text(version, length, text);
}

mock_return nvmlSystemGetCudaDriverVersion(int *cuda_driver_version) {
    if (!initialized()) {
        return MOCK_ERROR_UNINITIALIZED;
    }
    if (cuda_driver_version == NULL) {
        return MOCK_ERROR_INVALID_ARGUMENT;
    }
    *cuda_driver_version = g_state.cuda_driver_version;
    return MOCK_SUCCESS;
}

mock_return nvmlSystemGetCudaDriverVersion_v2(int *cuda_driver_version) {
    return nvmlSystemGetCudaDriverVersion(cuda_driver_version);
}

mock_return nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialized()) {
        return MOCK_ERROR_UNINITIALIZED;
    }
    if (count == NULL) {
        return MOCK_ERROR_INVALID_ARGUMENT;
    }
    *count = g_state.count;
    return MOCK_SUCCESS;
}

mock_return nvmlDeviceGetCount(unsigned int *count) {
    return nvmlDeviceGetCount_v2(count);
}

mock_return nvmlDeviceGetHandleByIndex_v2(unsigned int index, mock_handle *device) {
    if (!initialized()) {
        return MOCK_ERROR_UNINITIALIZED;
    }
    if (device == NULL || index >= g_state.count) {
        return MOCK_ERROR_INVALID_ARGUMENT;
    }
    *device = &g_state.gpus[index];
    return MOCK_SUCCESS;
}

mock_return nvmlDeviceGetHandleByIndex(unsigned int index, mock_handle *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

mock_return nvmlDeviceGetHandleByUUID(const char *uuid, mock_handle *device) {
    if (!initialized()) {
        return MOCK_ERROR_UNINITIALIZED;
    }
    if (uuid == NULL || device == NULL) {
        return MOCK_ERROR_INVALID_ARGUMENT;
    }
    for (unsigned int i = 0; i < g_state.count; i++) {
        if (strcmp(g_state.gpus[i].uuid, uuid) == 0) {
            *device = &g_state.gpus[i];
            return MOCK_SUCCESS;
        }
    }
    return MOCK_ERROR_NOT_FOUND;
}

mock_return nvmlDeviceGetHandleByPciBusId_v2(const char *pci_bus_id, mock_handle *device) {
    mock_device want;
    if (!initialized()) {
        return MOCK_ERROR_UNINITIALIZED;
    }
    if (pci_bus_id == NULL || device == NULL || !mock_parse_pci(pci_bus_id, &want)) {
        return MOCK_ERROR_INVALID_ARGUMENT;
    }
    for (unsigned int i = 0; i < g_state.count; i++) {
        const mock_device *d = &g_state.gpus[i];
        if (d->domain == want.domain && d->bus == want.bus && d->device == want.device &&
            d->function == want.function) {
            *device = &g_state.gpus[i];
            return MOCK_SUCCESS;
        }
    }
    return MOCK_ERROR_NOT_FOUND;
}

mock_return nvmlDeviceGetIndex(mock_handle device, unsigned int *index) {
    mock_return ret = check_device(device, index);
    if (ret == MOCK_SUCCESS) {
        *index = (unsigned int)(device - &g_state.gpus[0]);
    }
    return ret;
}

mock_return nvmlDeviceGetUUID(mock_handle device, char *uuid, unsigned int length) {
    mock_return ret = check_device(device, uuid);
    return ret == MOCK_SUCCESS ? put_text(uuid, length, device->uuid) : ret;
}

mock_return nvmlDeviceGetName(mock_handle device, char *name, unsigned int length) {
    mock_return ret = check_device(device, name);
    return ret == MOCK_SUCCESS ? put_text(name, length, device->name) : ret;
}

mock_return nvmlDeviceGetMinorNumber(mock_handle device, unsigned int *minor) {
    mock_return ret = check_device(device, minor);
    if (ret == MOCK_SUCCESS) {
        *minor = device->minor;
    }
    return ret;
}

mock_return nvmlDeviceGetPciInfo_v3(mock_handle device, mock_pci_info *pci) {
    mock_return ret = check_device(device, pci);
    if (ret != MOCK_SUCCESS) {
        return ret;
    }
    memset(pci, 0, sizeof(*pci));
    pci->domain = device->domain;
    pci->bus = device->bus;
    pci->device = device->device;
    pci->pci_device_id = device->pci_device_id;
    snprintf(pci->bus_id_legacy, sizeof(pci->bus_id_legacy), "%04X:%02X:%02X.%X", device->domain & 0xffffu,
             device->bus & 0xffu, device->device & 0x1fu, device->function & 7u);
    snprintf(pci->bus_id, sizeof(pci->bus_id), "%08X:%02X:%02X.%X", device->domain, device->bus & 0xffu,
             device->device & 0x1fu, device->function & 7u);
    return MOCK_SUCCESS;
}

mock_return nvmlDeviceGetMemoryInfo(mock_handle device, mock_memory_v1 *memory) {
    mock_return ret = check_device(device, memory);
    if (ret == MOCK_SUCCESS) {
        memory->total = device->memory_mib * 1048576ull;
        memory->free = memory->total;
        memory->used = 0;
    }
    return ret;
}

mock_return nvmlDeviceGetMemoryInfo_v2(mock_handle device, mock_memory_v2 *memory) {
    mock_return ret = check_device(device, memory);
    if (ret != MOCK_SUCCESS) {
        return ret;
    }
    if (memory->version != MOCK_MEMORY_V2_VERSION) {
        return MOCK_ERROR_ARGUMENT_VERSION_MISMATCH;
    }
    memory->total = device->memory_mib * 1048576ull;
    memory->reserved = 0;
    memory->free = memory->total;
    memory->used = 0;
    return MOCK_SUCCESS;
}

mock_return nvmlDeviceGetArchitecture(mock_handle device, unsigned int *architecture) {
    mock_return ret = check_device(device, architecture);
    if (ret == MOCK_SUCCESS) {
        *architecture = device->architecture;
    }
    return ret;
}

mock_return nvmlDeviceGetCudaComputeCapability(mock_handle device, int *major, int *minor) {
    mock_return ret = check_device(device, major);
    if (ret == MOCK_SUCCESS && minor == NULL) {
        ret = MOCK_ERROR_INVALID_ARGUMENT;
    }
    if (ret == MOCK_SUCCESS) {
        *major = device->cc_major;
        *minor = device->cc_minor;
    }
    return ret;
}

/* ---- for mock_nvml_limits.c (nvmlDeviceSetMemoryLimits_v1): the state, read under the library's checks ---- */

MOCK_HIDDEN mock_return mock_nvml_check_device(const mock_device *device, const void *out) {
    return check_device((mock_handle)device, out);
}

MOCK_HIDDEN const char *mock_nvml_limits_record(void) {
    return g_state.memory_limits_record;
}
