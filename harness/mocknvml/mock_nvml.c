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
 *   gpu.<i>.sm_count        = 132                (optional: multiprocessors, for libcuda; default 132
 *                                                 for hopper, 108 for ampere, else 80)
 *   gpu.<i>.mig_mode        = enabled            (optional: disabled (default), enabled or pending-enable;
 *                                                 the MIG mode a GPU starts with, see mock_mig.h)
 *   gpu.<i>.pcie_root       = pci0000:17         (optional: the PCIe root complex and NUMA node (-1: none)
 *   gpu.<i>.numa_node       = 0                   of the driver root's sysfs, harness/mocknvml; ignored here)
 *   state_dir               = /run/fracgpu-mock  (optional: where compute modes, MPS servers and MIG instances
 *                                                 are kept, shared by all processes; FRACGPU_MOCK_NVML_STATE_DIR
 *                                                 wins; see mock_mps.h)
 *
 * GPU indices must run 0..n-1 (n <= 64) and every GPU needs all non-optional keys; UUIDs, minors and
 * PCI bus ids must be distinct. A missing or unreadable profile makes nvmlInit* return
 * NVML_ERROR_LIBRARY_NOT_FOUND, a malformed one NVML_ERROR_UNKNOWN; either way one line naming the
 * profile path and the problem goes to stderr.
 *
 * Build: harness/mocknvml/build.sh [outdir]
 */

#include "mock_mps.h"
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
    MOCK_ERROR_NO_PERMISSION = 4,
    MOCK_ERROR_NOT_FOUND = 6,
    MOCK_ERROR_INSUFFICIENT_SIZE = 7,
    MOCK_ERROR_TIMEOUT = 10,
    MOCK_ERROR_IN_USE = 19,
    MOCK_ERROR_INSUFFICIENT_RESOURCES = 23,
    MOCK_ERROR_LIBRARY_NOT_FOUND = 12,
    MOCK_ERROR_GPU_IS_LOST = 15,
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

/* mock_nvml_events.c: the control file's history on init; whether a GPU fell off the bus */
MOCK_HIDDEN void mock_events_init(void);
MOCK_HIDDEN int mock_events_lost(unsigned int index);
/* mock_nvml_mig.c: what a MIG device handle stands for (returns 0 for other handles) */
MOCK_HIDDEN int mock_nvml_mig_device(const void *handle, mock_return *ret, char *uuid, char *name,
                                     unsigned long long *memory_mib);

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

/* Common checks for per-device calls: library initialised, handle valid, output pointer given, GPU not lost
 * (the control file of mock_nvml_events.c). */
static mock_return check_device(mock_handle dev, const void *out) {
    if (!initialized()) {
        return MOCK_ERROR_UNINITIALIZED;
    }
    if (dev == NULL || out == NULL || dev < &g_state.gpus[0] || dev >= &g_state.gpus[g_state.count]) {
        return MOCK_ERROR_INVALID_ARGUMENT;
    }
    if (mock_events_lost((unsigned int)(dev - &g_state.gpus[0]))) {
        return MOCK_ERROR_GPU_IS_LOST;
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
    if (ret == MOCK_SUCCESS) {
        mock_events_init();
    }
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
    case MOCK_ERROR_NO_PERMISSION:
        return "Insufficient Permissions";
    case MOCK_ERROR_NOT_FOUND:
        return "Not Found";
    case MOCK_ERROR_INSUFFICIENT_SIZE:
        return "Insufficient Size";
    case MOCK_ERROR_TIMEOUT:
        return "Timeout";
    case MOCK_ERROR_IN_USE:
        return "In use by another client";
    case MOCK_ERROR_INSUFFICIENT_RESOURCES:
        return "Insufficient resources";
    case MOCK_ERROR_LIBRARY_NOT_FOUND:
        return "NVML Shared Library Not Found";
    case MOCK_ERROR_GPU_IS_LOST:
        return "GPU is lost";
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
    char mig[MOCK_UUID_SIZE];
    mock_return ret;
    if (mock_nvml_mig_device(device, &ret, mig, NULL, NULL)) {
        return ret == MOCK_SUCCESS ? put_text(uuid, length, mig) : ret;
    }
    ret = check_device(device, uuid);
    return ret == MOCK_SUCCESS ? put_text(uuid, length, device->uuid) : ret;
}

mock_return nvmlDeviceGetName(mock_handle device, char *name, unsigned int length) {
    char mig[MOCK_NAME_SIZE];
    mock_return ret;
    if (mock_nvml_mig_device(device, &ret, NULL, mig, NULL)) {
        return ret == MOCK_SUCCESS ? put_text(name, length, mig) : ret;
    }
    ret = check_device(device, name);
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

/* The memory of a GPU, or of a MIG device (its GPU instance's). */
static mock_return memory_mib(mock_handle device, const void *out, unsigned long long *mib) {
    mock_return ret;
    if (mock_nvml_mig_device(device, &ret, NULL, NULL, mib)) {
        return ret == MOCK_SUCCESS && out == NULL ? MOCK_ERROR_INVALID_ARGUMENT : ret;
    }
    ret = check_device(device, out);
    if (ret == MOCK_SUCCESS) {
        *mib = device->memory_mib;
    }
    return ret;
}

mock_return nvmlDeviceGetMemoryInfo(mock_handle device, mock_memory_v1 *memory) {
    unsigned long long mib;
    mock_return ret = memory_mib(device, memory, &mib);
    if (ret == MOCK_SUCCESS) {
        memory->total = mib * 1048576ull;
        memory->free = memory->total;
        memory->used = 0;
    }
    return ret;
}

mock_return nvmlDeviceGetMemoryInfo_v2(mock_handle device, mock_memory_v2 *memory) {
    unsigned long long mib;
    mock_return ret = memory_mib(device, memory, &mib);
    if (ret != MOCK_SUCCESS) {
        return ret;
    }
    if (memory->version != MOCK_MEMORY_V2_VERSION) {
        return MOCK_ERROR_ARGUMENT_VERSION_MISMATCH;
    }
    memory->total = mib * 1048576ull;
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

/* ---- compute mode: kept in <state dir>/compute_mode.<uuid> (mock_mps.h), shared across processes ----
 * Get: the file's mode, DEFAULT (0) when there is no state directory or file. Set: NVML_ERROR_INVALID_ARGUMENT
 * for a mode other than 0..3, NVML_ERROR_NOT_SUPPORTED for EXCLUSIVE_THREAD (1, gone from the driver) or
 * when no state directory is configured, NVML_ERROR_NO_PERMISSION unless root, NVML_ERROR_UNKNOWN when the
 * file cannot be written (written to a temporary file and renamed, so readers never see half a mode). */

mock_return nvmlDeviceGetComputeMode(mock_handle device, int *mode) {
    mock_return ret = check_device(device, mode);
    if (ret == MOCK_SUCCESS) {
        *mode = mock_compute_mode(&g_state, device->uuid);
    }
    return ret;
}

mock_return nvmlDeviceSetComputeMode(mock_handle device, int mode) {
    char path[MOCK_LINE_SIZE + MOCK_UUID_SIZE + 32], tmp[sizeof(path) + 32];
    mock_return ret = check_device(device, &mode);
    if (ret != MOCK_SUCCESS) {
        return ret;
    }
    if (mode < MOCK_COMPUTE_DEFAULT || mode > MOCK_COMPUTE_EXCLUSIVE_PROCESS) {
        return MOCK_ERROR_INVALID_ARGUMENT;
    }
    if (mode == MOCK_COMPUTE_EXCLUSIVE_THREAD || !mock_state_file(path, sizeof(path), &g_state, "compute_mode",
                                                                  device->uuid)) {
        return MOCK_ERROR_NOT_SUPPORTED;
    }
    if (geteuid() != 0) {
        return MOCK_ERROR_NO_PERMISSION;
    }
    snprintf(tmp, sizeof(tmp), "%s.%ld.tmp", path, (long)getpid());
    FILE *f = fopen(tmp, "we");
    if (f == NULL) {
        return MOCK_ERROR_UNKNOWN;
    }
    int ok = fprintf(f, "%d\n", mode) > 0;
    ok = fclose(f) == 0 && ok && rename(tmp, path) == 0;
    if (!ok) {
        unlink(tmp);
    }
    return ok ? MOCK_SUCCESS : MOCK_ERROR_UNKNOWN;
}

/* ---- for mock_nvml_limits.c (nvmlDeviceSetMemoryLimits_v1): the state, read under the library's checks ---- */

MOCK_HIDDEN mock_return mock_nvml_check_device(const mock_device *device, const void *out) {
    return check_device((mock_handle)device, out);
}

MOCK_HIDDEN const char *mock_nvml_limits_record(void) {
    return g_state.memory_limits_record;
}

/* ---- for mock_nvml_mig.c ---- */

MOCK_HIDDEN const mock_state *mock_nvml_state(void) {
    return &g_state;
}

/* ---- for mock_nvml_events.c ---- */

MOCK_HIDDEN int mock_nvml_initialized(void) {
    return initialized();
}

MOCK_HIDDEN unsigned int mock_nvml_device_count(void) {
    return g_state.count;
}

MOCK_HIDDEN const mock_device *mock_nvml_device(unsigned int index) {
    return index < g_state.count ? &g_state.gpus[index] : NULL;
}

/* ==== per-process GPU memory (nvmlDeviceGetComputeRunningProcesses*) ====================================
 *
 * The processes of each GPU come from the control file named by FRACGPU_MOCK_NVML_PROCESSES, re-read on
 * every call so that tests can change it while a caller samples. One entry per line, '#' comments and blank
 * lines ignored:
 *
 *   <GPU UUID> <pid> <used bytes>      a process with a context on that GPU using that much memory
 *   <GPU UUID> error <NVML code>       the call fails for that GPU with that return code (e.g. 999)
 *
 * Only the GPUs the caller can open have handles (see mock_profile.h), so lines of other GPUs are never
 * reported. No variable, or no file: no processes. A malformed line is skipped with one stderr line.
 * Structs: nvmlProcessInfo_v1_t (legacy symbol) and nvmlProcessInfo_v2_t (= _v3's nvmlProcessInfo_t), as in
 * NVIDIA's nvml.h. Semantics: infos may be NULL; *infoCount smaller than the number of processes ->
 * NVML_ERROR_INSUFFICIENT_SIZE with *infoCount set to that number; none running -> NVML_SUCCESS, 0.
 * Built with -DMOCK_NO_RUNNING_PROCESSES the library has none of these symbols (a driver without the call).
 */
#ifndef MOCK_NO_RUNNING_PROCESSES

#include <stdlib.h>

#define MOCK_PROCESSES_ENV "FRACGPU_MOCK_NVML_PROCESSES"
#define MOCK_MAX_PROCESSES 1024

typedef struct {
    unsigned int pid;
    unsigned long long used_gpu_memory;
} mock_process_v1; /* nvmlProcessInfo_v1_t */

typedef struct {
    unsigned int pid;
    unsigned long long used_gpu_memory;
    unsigned int gpu_instance_id;     /* 0xFFFFFFFF: not MIG */
    unsigned int compute_instance_id; /* 0xFFFFFFFF: not MIG */
} mock_process_v2; /* nvmlProcessInfo_v2_t, nvmlProcessInfo_t */

/* Reads the control file's processes of `uuid` into pids/used (at most MOCK_MAX_PROCESSES); returns the
 * number found, or sets *error to the code of an `error` line for this GPU. */
static unsigned int read_processes(const char *uuid, unsigned int *pids, unsigned long long *used, int *error) {
    const char *path = getenv(MOCK_PROCESSES_ENV);
    unsigned int n = 0;
    *error = MOCK_SUCCESS;
    if (path == NULL || *path == '\0') {
        return 0;
    }
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return 0;
    }
    char line[MOCK_LINE_SIZE];
    while (fgets(line, sizeof(line), f) != NULL) {
        char gpu[MOCK_UUID_SIZE], what[32];
        unsigned long long value;
        const char *p = line;
        while (*p == ' ' || *p == '\t') {
            p++;
        }
        if (*p == '#' || *p == '\n' || *p == '\0') {
            continue;
        }
        if (sscanf(p, "%95s %31s %llu", gpu, what, &value) != 3) {
            fprintf(stderr, "fracgpu mock NVML: %s: skipping malformed line: %s", path, line);
            continue;
        }
        if (strcmp(gpu, uuid) != 0) {
            continue;
        }
        if (strcmp(what, "error") == 0) {
            *error = (int)value;
            break;
        }
        char *end;
        unsigned long pid = strtoul(what, &end, 10);
        if (*end != '\0' || pid == 0 || pid > 0xffffffffUL) {
            fprintf(stderr, "fracgpu mock NVML: %s: skipping line with a bad pid: %s", path, line);
            continue;
        }
        if (n < MOCK_MAX_PROCESSES) {
            pids[n] = (unsigned int)pid;
            used[n] = value;
            n++;
        }
    }
    fclose(f);
    return n;
}

/* The common part of the versioned calls: the count check, then one v1 or v2 struct per process. */
static mock_return running_processes(mock_handle device, unsigned int *count, void *infos, int v2) {
    static unsigned int pids[MOCK_MAX_PROCESSES];
    static unsigned long long used[MOCK_MAX_PROCESSES];
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    mock_return ret = check_device(device, count);
    if (ret != MOCK_SUCCESS) {
        return ret;
    }
    pthread_mutex_lock(&lock);
    int error;
    unsigned int n = read_processes(device->uuid, pids, used, &error);
    if (error != MOCK_SUCCESS) {
        ret = error;
    } else if (*count < n) {
        *count = n;
        ret = MOCK_ERROR_INSUFFICIENT_SIZE;
    } else if (n > 0 && infos == NULL) {
        ret = MOCK_ERROR_INVALID_ARGUMENT;
    } else {
        for (unsigned int i = 0; i < n; i++) {
            if (v2) {
                mock_process_v2 *out = (mock_process_v2 *)infos + i;
                out->pid = pids[i];
                out->used_gpu_memory = used[i];
                out->gpu_instance_id = 0xFFFFFFFFu;
                out->compute_instance_id = 0xFFFFFFFFu;
            } else {
                mock_process_v1 *out = (mock_process_v1 *)infos + i;
                out->pid = pids[i];
                out->used_gpu_memory = used[i];
            }
        }
        *count = n;
    }
    pthread_mutex_unlock(&lock);
    return ret;
}

/* For mock_nvml_mig.c: how many processes the control file lists on `uuid` (a GPU's or a MIG device's). */
MOCK_HIDDEN unsigned int mock_nvml_processes_on(const char *uuid) {
    static unsigned int pids[MOCK_MAX_PROCESSES];
    static unsigned long long used[MOCK_MAX_PROCESSES];
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    int error;
    pthread_mutex_lock(&lock);
    unsigned int n = read_processes(uuid, pids, used, &error);
    pthread_mutex_unlock(&lock);
    return n;
}

mock_return nvmlDeviceGetComputeRunningProcesses_v3(mock_handle device, unsigned int *count, mock_process_v2 *infos) {
    return running_processes(device, count, infos, 1);
}

mock_return nvmlDeviceGetComputeRunningProcesses_v2(mock_handle device, unsigned int *count, mock_process_v2 *infos) {
    return running_processes(device, count, infos, 1);
}

mock_return nvmlDeviceGetComputeRunningProcesses(mock_handle device, unsigned int *count, mock_process_v1 *infos) {
    return running_processes(device, count, infos, 0);
}

#else

MOCK_HIDDEN unsigned int mock_nvml_processes_on(const char *uuid) {
    (void)uuid;
    return 0; /* a driver without the per-process calls: nothing known to run */
}

#endif /* MOCK_NO_RUNNING_PROCESSES */
/* ==== end of per-process GPU memory ===================================================================== */
