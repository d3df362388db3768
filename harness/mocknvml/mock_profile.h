/*
 * fracgpu mock driver: the simulated GPUs shared by the mock NVML (mock_nvml.c), the mock CUDA driver
 * (mock_cuda.c) and, through NVML, the mock nvidia-smi. Written from scratch for fracgpu.
 *
 * Where the profile comes from, first match wins:
 *   1. the file named by FRACGPU_MOCK_NVML_PROFILE;
 *   2. a profile compiled into the library (build.sh --embed-profile), as used in a fake driver root, so
 *      a container that gets the libraries sees the GPUs without any environment of its own.
 * Profile format: see mock_nvml.c.
 *
 * Like the real driver, only GPUs whose device node the calling process can open are enumerated:
 * `<dev root>/dev/nvidia<minor>` must open O_RDWR (ENXIO, the kernel having no driver behind a
 * mknod-made node, counts as opened: permissions and the device cgroup allowed it). The dev root is
 * FRACGPU_MOCK_NVML_DEV_ROOT; unset, it is "/" for a library with a compiled-in profile, and a library
 * reading the profile file from the environment then enumerates every profile GPU (development use).
 * Visible GPUs keep their profile order and are indexed 0..n-1.
 */
#ifndef FRACGPU_MOCK_PROFILE_H
#define FRACGPU_MOCK_PROFILE_H

#define MOCK_MAX_GPUS 64
#define MOCK_UUID_SIZE 96    /* NVML_DEVICE_UUID_V2_BUFFER_SIZE */
#define MOCK_NAME_SIZE 96    /* NVML_DEVICE_NAME_V2_BUFFER_SIZE */
#define MOCK_DRIVER_SIZE 80  /* NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE */
#define MOCK_LINE_SIZE 1024
#define MOCK_ENV "FRACGPU_MOCK_NVML_PROFILE"
#define MOCK_DEV_ROOT_ENV "FRACGPU_MOCK_NVML_DEV_ROOT"

#define MOCK_HIDDEN __attribute__((visibility("hidden")))

enum {
    HAS_UUID = 1 << 0,
    HAS_NAME = 1 << 1,
    HAS_MEMORY = 1 << 2,
    HAS_MINOR = 1 << 3,
    HAS_PCI = 1 << 4,
    HAS_ARCH = 1 << 5,
    HAS_CC = 1 << 6,
    HAS_REQUIRED = (1 << 7) - 1
};

typedef struct mock_device {
    unsigned int fields; /* HAS_* bits seen in the profile */
    char uuid[MOCK_UUID_SIZE];
    char name[MOCK_NAME_SIZE];
    unsigned long long memory_mib;
    unsigned int minor;
    unsigned int domain, bus, device, function;
    unsigned int pci_device_id;
    unsigned int architecture;
    int cc_major, cc_minor;
    int memory_limits_unsupported; /* gpu.<i>.memory_limits = not_supported (mock_nvml_limits.c) */
    unsigned int sm_count;         /* gpu.<i>.sm_count; default by architecture (132 hopper, 108 ampere, 80) */
    int mig_mode;                  /* gpu.<i>.mig_mode: 0 disabled, 1 enabled, 2 pending-enable (mock_mig.h) */
    char mig_uuid[48];             /* mock_cuda.c: the MIG UUID of a CUDA device that is a MIG device, else empty */
} mock_device;

typedef struct {
    mock_device gpus[MOCK_MAX_GPUS];
    unsigned int count;
    char driver_version[MOCK_DRIVER_SIZE];
    int cuda_driver_version;
    char memory_limits_record[MOCK_LINE_SIZE]; /* memory_limits_record = <path> (mock_nvml_limits.c) */
    char state_dir[MOCK_LINE_SIZE]; /* state_dir = <path>: compute modes, MPS servers (mock_mps.h) */
} mock_state;

enum { MOCK_PROFILE_OK = 0, MOCK_PROFILE_MISSING = 1, MOCK_PROFILE_INVALID = 2 };

/*
 * Reads and validates the profile, keeps only the GPUs the process can open, and stores the result in
 * *out (untouched on error). `who` prefixes the one stderr line printed on error, e.g. "fracgpu mock
 * NVML". Returns MOCK_PROFILE_OK, MOCK_PROFILE_MISSING (no profile, or unreadable) or
 * MOCK_PROFILE_INVALID (malformed). Not thread-safe: callers hold their own lock.
 */
MOCK_HIDDEN int mock_profile_load(const char *who, mock_state *out);

/* Parses `domain:bus:device.function` (1-8 digit domain) into d's PCI fields; returns 1 on success. */
MOCK_HIDDEN int mock_parse_pci(const char *s, mock_device *d);

/* Parses "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" into 16 bytes; returns 1 on success. */
MOCK_HIDDEN int mock_uuid_bytes(const char *uuid, unsigned char out[16]);

#endif
