/*
 * fracgpu mock NVML, part 2: nvmlDeviceSetMemoryLimits_v1, the call NVIDIA's
 * `nvidia-cdi-hook apply-cuda-memory-limits` makes (driver r615+). Written from scratch for fracgpu.
 *
 * Signature as NVML declares it (and go-nvml passes it):
 *   nvmlReturn_t nvmlDeviceSetMemoryLimits_v1(nvmlDevice_t device, nvmlSetMemoryLimits_v1_t *limits);
 *   typedef struct { const char *nameSpace; unsigned long long softLimit, hardLimit; }
 *       nvmlSetMemoryLimits_v1_t;
 * nameSpace is the container's cgroup directory (e.g. /sys/fs/cgroup/kubepods/.../<ctr>), limits in bytes.
 *
 * Answers, in this order:
 *   NVML_ERROR_UNINITIALIZED     before nvmlInit;
 *   NVML_ERROR_INVALID_ARGUMENT  an invalid device handle;
 *   NVML_ERROR_NOT_SUPPORTED     the profile says `gpu.<i>.memory_limits = not_supported` (default supported);
 *   NVML_ERROR_INVALID_ARGUMENT  limits or nameSpace NULL (the plugin's probe passes NULL limits), softLimit
 *                                above hardLimit, or a limit above the GPU's memory (hardLimit ULLONG_MAX,
 *                                NVML_DEVICE_MEMORY_LIMIT_MAX, means "no hard limit" and is accepted);
 *   NVML_ERROR_OPERATING_SYSTEM  nameSpace is not an existing directory;
 *   NVML_SUCCESS                 otherwise.
 * Every call with limits is appended, as one JSON line {"uuid","cgroup","soft","hard","return"}, to the file
 * named by FRACGPU_MOCK_NVML_LIMITS_RECORD, else by the profile's `memory_limits_record = <path>` (for
 * processes without that environment, such as OCI hooks, which the runtime starts with the hook's env only).
 *
 * A driver without the call (older than r615): build.sh also builds libnvidia-ml.so.1 without this file,
 * into <outdir>/without-memory-limits/.
 */
#include "mock_profile.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef int mock_return;
enum {
    LIMITS_SUCCESS = 0,
    LIMITS_ERROR_INVALID_ARGUMENT = 2,
    LIMITS_ERROR_NOT_SUPPORTED = 3,
    LIMITS_ERROR_OPERATING_SYSTEM = 17
};

typedef struct {
    const char *name_space;
    unsigned long long soft_limit;
    unsigned long long hard_limit;
} mock_set_memory_limits_v1; /* nvmlSetMemoryLimits_v1_t */

MOCK_HIDDEN mock_return mock_nvml_check_device(const mock_device *device, const void *out);
MOCK_HIDDEN const char *mock_nvml_limits_record(void);

/* Appends one JSON line for the call; the cgroup path is escaped for JSON. Failures are reported on stderr. */
static void record(const mock_device *device, const mock_set_memory_limits_v1 *limits, mock_return ret) {
    const char *path = getenv("FRACGPU_MOCK_NVML_LIMITS_RECORD");
    if (path == NULL || path[0] == '\0') {
        path = mock_nvml_limits_record();
    }
    if (path == NULL || path[0] == '\0') {
        return;
    }
    char cgroup[2 * MOCK_LINE_SIZE] = "";
    size_t n = 0;
    for (const char *c = limits->name_space ? limits->name_space : ""; *c && n + 7 < sizeof(cgroup); c++) {
        if (*c == '"' || *c == '\\') {
            cgroup[n++] = '\\';
            cgroup[n++] = *c;
        } else if ((unsigned char)*c < 0x20) {
            n += (size_t)snprintf(cgroup + n, sizeof(cgroup) - n, "\\u%04x", (unsigned char)*c);
        } else {
            cgroup[n++] = *c;
        }
    }
    cgroup[n] = '\0';
    char line[3 * MOCK_LINE_SIZE];
    int len = snprintf(line, sizeof(line),
                       "{\"uuid\":\"%s\",\"cgroup\":\"%s\",\"soft\":%llu,\"hard\":%llu,\"return\":%d}\n",
                       device->uuid, cgroup, limits->soft_limit, limits->hard_limit, ret);
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0 || len <= 0 || write(fd, line, (size_t)len) != len) {
        fprintf(stderr, "fracgpu mock NVML: cannot record nvmlDeviceSetMemoryLimits_v1 in '%s'\n", path);
    }
    if (fd >= 0) {
        close(fd);
    }
}

mock_return nvmlDeviceSetMemoryLimits_v1(const mock_device *device, const mock_set_memory_limits_v1 *limits) {
    mock_return ret = mock_nvml_check_device(device, device); /* the handle only: limits may be NULL */
    if (ret != LIMITS_SUCCESS) {
        return ret;
    }
    if (device->memory_limits_unsupported) {
        return LIMITS_ERROR_NOT_SUPPORTED;
    }
    if (limits == NULL || limits->name_space == NULL) {
        return LIMITS_ERROR_INVALID_ARGUMENT;
    }
    unsigned long long total = device->memory_mib * 1048576ull;
    struct stat st;
    if (limits->soft_limit > limits->hard_limit || limits->soft_limit > total ||
        (limits->hard_limit > total && limits->hard_limit != ~0ull)) {
        ret = LIMITS_ERROR_INVALID_ARGUMENT;
    } else if (stat(limits->name_space, &st) != 0 || !S_ISDIR(st.st_mode)) {
        ret = LIMITS_ERROR_OPERATING_SYSTEM;
    }
    record(device, limits, ret);
    return ret;
}
