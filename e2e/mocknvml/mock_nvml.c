/*
 * fracgpu mock NVML: a stand-in for libnvidia-ml.so.1 on machines without an NVIDIA GPU or driver.
 *
 * Written from scratch for fracgpu (no NVIDIA header is used). The exported symbols, argument lists,
 * struct layouts and return codes follow what the `nvidia-ml-py` package (imported as `pynvml`) passes
 * through ctypes, so the real pynvml and the production discovery code run unchanged against it.
 *
 * The GPUs come from a profile file named by the environment variable FRACGPU_MOCK_NVML_PROFILE,
 * read on the first successful nvmlInit*. Format: one `key = value` per line; blank lines and lines
 * whose first non-blank character is '#' are ignored. Keys:
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

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

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

#define MOCK_MAX_GPUS 64
#define MOCK_UUID_SIZE 96    /* NVML_DEVICE_UUID_V2_BUFFER_SIZE */
#define MOCK_NAME_SIZE 96    /* NVML_DEVICE_NAME_V2_BUFFER_SIZE */
#define MOCK_DRIVER_SIZE 80  /* NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE */
#define MOCK_LINE_SIZE 1024
#define MOCK_ENV "FRACGPU_MOCK_NVML_PROFILE"

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

/* ---- the simulated GPUs ---- */
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
} mock_device;

typedef mock_device *mock_handle; /* nvmlDevice_t is an opaque pointer */

typedef struct {
    mock_device gpus[MOCK_MAX_GPUS];
    unsigned int count;
    char driver_version[MOCK_DRIVER_SIZE];
    int cuda_driver_version;
} mock_state;

static mock_state g_state;
static mock_state g_parse; /* scratch space: committed to g_state only when the whole profile is valid */
static int g_refcount;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

/* ---- profile parsing ---- */

/* Prints one line naming the profile and the problem (line 0: the profile as a whole). */
__attribute__((format(printf, 3, 4))) static void complain(const char *path, unsigned int line,
                                                           const char *fmt, ...) {
    char message[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof(message), fmt, ap);
    va_end(ap);
    if (line > 0) {
        fprintf(stderr, "fracgpu mock NVML: profile '%s' (%s) line %u: %s\n", path, MOCK_ENV, line, message);
    } else {
        fprintf(stderr, "fracgpu mock NVML: profile '%s' (%s): %s\n", path, MOCK_ENV, message);
    }
}

static char *trim(char *s) {
    while (*s && isspace((unsigned char)*s)) {
        s++;
    }
    char *end = s + strlen(s);
    while (end > s && isspace((unsigned char)end[-1])) {
        *--end = '\0';
    }
    return s;
}

/* Parses a whole string as an unsigned number no larger than max (base 0 allows 0x...). */
static int parse_ull(const char *s, int base, unsigned long long max, unsigned long long *out) {
    if (*s == '\0' || *s == '-' || *s == '+' || isspace((unsigned char)*s)) {
        return 0;
    }
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, base);
    if (errno != 0 || *end != '\0' || v > max) {
        return 0;
    }
    *out = v;
    return 1;
}

static int parse_uint(const char *s, int base, unsigned int max, unsigned int *out) {
    unsigned long long v;
    if (!parse_ull(s, base, max, &v)) {
        return 0;
    }
    *out = (unsigned int)v;
    return 1;
}

/* Parses `n` hex digits exactly (n > 0) or, when n == 0, 1 to 8 hex digits. */
static int parse_hex_field(const char *s, size_t len, size_t exact, unsigned int *out) {
    if (len == 0 || len > 8 || (exact != 0 && len != exact)) {
        return 0;
    }
    unsigned int v = 0;
    for (size_t i = 0; i < len; i++) {
        int c = (unsigned char)s[i];
        if (!isxdigit(c)) {
            return 0;
        }
        v = v * 16u + (unsigned int)(isdigit(c) ? c - '0' : tolower(c) - 'a' + 10);
    }
    *out = v;
    return 1;
}

/* Accepts `domain:bus:device.function` with a 1-8 digit domain, e.g. 0000:18:00.0 or 00000000:18:00.0. */
static int parse_pci(const char *s, mock_device *d) {
    const char *c1 = strchr(s, ':');
    const char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    const char *dot = c2 ? strchr(c2 + 1, '.') : NULL;
    unsigned int domain, bus, dev, fn;
    if (!dot || !parse_hex_field(s, (size_t)(c1 - s), 0, &domain) ||
        !parse_hex_field(c1 + 1, (size_t)(c2 - c1 - 1), 2, &bus) ||
        !parse_hex_field(c2 + 1, (size_t)(dot - c2 - 1), 2, &dev) ||
        !parse_hex_field(dot + 1, strlen(dot + 1), 1, &fn) || dev > 0x1f || fn > 7) {
        return 0;
    }
    d->domain = domain;
    d->bus = bus;
    d->device = dev;
    d->function = fn;
    return 1;
}

static int valid_uuid(const char *s) {
    static const char pattern[] = "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx";
    if (strlen(s) != sizeof(pattern) - 1) {
        return 0;
    }
    for (size_t i = 0; pattern[i]; i++) {
        if (pattern[i] == 'x' ? !isxdigit((unsigned char)s[i]) : s[i] != pattern[i]) {
            return 0;
        }
    }
    return 1;
}

static int parse_arch(const char *s, unsigned int *out) {
    static const struct {
        const char *name;
        unsigned int value; /* NVML_DEVICE_ARCH_* */
    } archs[] = {
        {"kepler", 2}, {"maxwell", 3}, {"pascal", 4},    {"volta", 5},  {"turing", 6},
        {"ampere", 7}, {"ada", 8},     {"hopper", 9},    {"blackwell", 10}, {"rubin", 13},
    };
    for (size_t i = 0; i < sizeof(archs) / sizeof(archs[0]); i++) {
        if (strcasecmp(s, archs[i].name) == 0) {
            *out = archs[i].value;
            return 1;
        }
    }
    return 0;
}

static int parse_cc(const char *s, int *major, int *minor) {
    char buf[32];
    if (strlen(s) >= sizeof(buf)) {
        return 0;
    }
    strcpy(buf, s);
    char *dot = strchr(buf, '.');
    unsigned int maj, min;
    if (!dot) {
        return 0;
    }
    *dot = '\0';
    if (!parse_uint(buf, 10, 99, &maj) || !parse_uint(dot + 1, 10, 99, &min)) {
        return 0;
    }
    *major = (int)maj;
    *minor = (int)min;
    return 1;
}

static int copy_text(char *dst, size_t size, const char *src) {
    if (*src == '\0' || strlen(src) >= size) {
        return 0;
    }
    strcpy(dst, src);
    return 1;
}

/* Applies one `gpu.<i>.<field> = value` line. Returns 0 and sets *why on error. */
static int apply_gpu_key(mock_state *st, const char *key, const char *value, const char **why) {
    const char *p = key + 4; /* after "gpu." */
    const char *dot = strchr(p, '.');
    char idx_text[8];
    unsigned int idx;
    if (!dot || (size_t)(dot - p) >= sizeof(idx_text) || dot == p) {
        *why = "bad GPU key (expected gpu.<index>.<field>)";
        return 0;
    }
    memcpy(idx_text, p, (size_t)(dot - p));
    idx_text[dot - p] = '\0';
    if (!parse_uint(idx_text, 10, MOCK_MAX_GPUS - 1, &idx)) {
        *why = "GPU index must be 0..63";
        return 0;
    }
    mock_device *d = &st->gpus[idx];
    const char *field = dot + 1;
    unsigned int bit;
    int ok;
    if (strcmp(field, "uuid") == 0) {
        bit = HAS_UUID;
        ok = valid_uuid(value) && copy_text(d->uuid, sizeof(d->uuid), value);
        *why = "uuid must look like GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (hex)";
    } else if (strcmp(field, "name") == 0) {
        bit = HAS_NAME;
        ok = copy_text(d->name, sizeof(d->name), value);
        *why = "name must be 1..95 characters";
    } else if (strcmp(field, "memory_mib") == 0) {
        bit = HAS_MEMORY;
        ok = parse_ull(value, 10, 1ull << 40, &d->memory_mib) && d->memory_mib > 0;
        *why = "memory_mib must be a positive decimal integer";
    } else if (strcmp(field, "minor") == 0) {
        bit = HAS_MINOR;
        ok = parse_uint(value, 10, 255, &d->minor);
        *why = "minor must be a decimal integer 0..255";
    } else if (strcmp(field, "pci_bus_id") == 0) {
        bit = HAS_PCI;
        ok = parse_pci(value, d);
        *why = "pci_bus_id must look like 0000:18:00.0";
    } else if (strcmp(field, "architecture") == 0) {
        bit = HAS_ARCH;
        ok = parse_arch(value, &d->architecture);
        *why = "architecture must be one of kepler maxwell pascal volta turing ampere ada hopper "
               "blackwell rubin";
    } else if (strcmp(field, "cuda_cc") == 0) {
        bit = HAS_CC;
        ok = parse_cc(value, &d->cc_major, &d->cc_minor);
        *why = "cuda_cc must look like 9.0";
    } else if (strcmp(field, "pci_device_id") == 0) {
        bit = 0;
        ok = parse_uint(value, 0, 0xffffffffu, &d->pci_device_id);
        *why = "pci_device_id must be a 32-bit number such as 0x233010de";
    } else {
        *why = "unknown GPU field (uuid name memory_mib minor pci_bus_id architecture cuda_cc "
               "pci_device_id)";
        return 0;
    }
    if (!ok) {
        return 0;
    }
    if (bit != 0 && (d->fields & bit)) {
        *why = "key given twice";
        return 0;
    }
    d->fields |= bit;
    if (st->count < idx + 1) {
        st->count = idx + 1;
    }
    return 1;
}

/* Applies one `key = value` line. Returns 0 and sets *why (a format with one %s) on error. */
static int apply_line(mock_state *st, int *have_driver, const char *key, const char *value,
                      const char **why) {
    unsigned int number;
    if (strcmp(key, "driver_version") == 0) {
        *why = *have_driver ? "key given twice" : "driver_version must be 1..79 characters";
        if (*have_driver || !copy_text(st->driver_version, sizeof(st->driver_version), value)) {
            return 0;
        }
        *have_driver = 1;
        return 1;
    }
    if (strcmp(key, "cuda_driver_version") == 0) {
        *why = "cuda_driver_version must be a decimal integer such as 13000";
        if (!parse_uint(value, 10, 999999, &number)) {
            return 0;
        }
        st->cuda_driver_version = (int)number;
        return 1;
    }
    if (strcmp(key, "uvm_major") == 0) {
        *why = "uvm_major must be a decimal integer 1..4095";
        return parse_uint(value, 10, 4095, &number) && number > 0;
    }
    if (strncmp(key, "gpu.", 4) == 0) {
        return apply_gpu_key(st, key, value, why);
    }
    *why = "unknown key (driver_version cuda_driver_version uvm_major gpu.<i>.<field>)";
    return 0;
}

/* Checks the parsed profile as a whole. Returns 0 after printing the problem. */
static int validate(const mock_state *st, int have_driver, const char *path) {
    if (!have_driver) {
        complain(path, 0, "%s", "driver_version is missing");
        return 0;
    }
    for (unsigned int i = 0; i < st->count; i++) {
        const mock_device *d = &st->gpus[i];
        if ((d->fields & HAS_REQUIRED) != HAS_REQUIRED) {
            complain(path, 0,
                     "gpu.%u is incomplete: needs uuid, name, memory_mib, minor, pci_bus_id, "
                     "architecture and cuda_cc (GPU indices must run 0..n-1)",
                     i);
            return 0;
        }
        for (unsigned int j = 0; j < i; j++) {
            const mock_device *e = &st->gpus[j];
            const char *what = NULL;
            if (strcmp(d->uuid, e->uuid) == 0) {
                what = "uuid";
            } else if (d->minor == e->minor) {
                what = "minor";
            } else if (d->domain == e->domain && d->bus == e->bus && d->device == e->device &&
                       d->function == e->function) {
                what = "pci_bus_id";
            }
            if (what) {
                complain(path, 0, "gpu.%u and gpu.%u have the same %s", j, i, what);
                return 0;
            }
        }
    }
    return 1;
}

/* Reads the profile into g_state. Returns MOCK_SUCCESS or the error nvmlInit* should return. */
static mock_return load_profile(void) {
    const char *path = getenv(MOCK_ENV);
    if (path == NULL || *path == '\0') {
        fprintf(stderr,
                "fracgpu mock NVML: %s is not set; point it at a profile file such as "
                "e2e/mocknvml/profiles/h100x8.profile\n",
                MOCK_ENV);
        return MOCK_ERROR_LIBRARY_NOT_FOUND;
    }
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        complain(path, 0, "cannot open: %s", strerror(errno));
        return MOCK_ERROR_LIBRARY_NOT_FOUND;
    }
    mock_state *st = &g_parse;
    memset(st, 0, sizeof(*st));
    st->cuda_driver_version = 13000;
    int have_driver = 0;
    char buf[MOCK_LINE_SIZE];
    unsigned int line = 0;
    while (fgets(buf, sizeof(buf), f) != NULL) {
        line++;
        size_t len = strlen(buf);
        if (len == sizeof(buf) - 1 && buf[len - 1] != '\n' && !feof(f)) {
            complain(path, line, "%s", "line is longer than 1022 characters");
            fclose(f);
            return MOCK_ERROR_UNKNOWN;
        }
        char *text = trim(buf);
        if (*text == '\0' || *text == '#') {
            continue;
        }
        char *eq = strchr(text, '=');
        if (eq == NULL) {
            complain(path, line, "expected 'key = value', got '%s'", text);
            fclose(f);
            return MOCK_ERROR_UNKNOWN;
        }
        *eq = '\0';
        char *key = trim(text);
        char *value = trim(eq + 1);
        const char *why = "bad line";
        if (!apply_line(st, &have_driver, key, value, &why)) {
            complain(path, line, "%s: '%s = %s'", why, key, value);
            fclose(f);
            return MOCK_ERROR_UNKNOWN;
        }
    }
    int read_error = ferror(f);
    fclose(f);
    if (read_error) {
        complain(path, 0, "%s", "read error");
        return MOCK_ERROR_LIBRARY_NOT_FOUND;
    }
    if (!validate(st, have_driver, path)) {
        return MOCK_ERROR_UNKNOWN;
    }
    g_state = *st;
    return MOCK_SUCCESS;
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
    if (pci_bus_id == NULL || device == NULL || !parse_pci(pci_bus_id, &want)) {
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
