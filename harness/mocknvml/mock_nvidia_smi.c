/*
 * fracgpu mock nvidia-smi: the few nvidia-smi outputs tests look at, answered from NVML.
 *
 * Written from scratch for fracgpu. Like the real tool it dlopens libnvidia-ml.so.1 through the normal
 * loader search (LD_LIBRARY_PATH, ld.so.cache, system directories), so what it prints is whatever the
 * NVML it finds enumerates: with the mock NVML, the profile's GPUs whose /dev/nvidia<minor> this process
 * can open. It links only libc. Supported:
 *
 *   nvidia-smi                    a short table: driver and CUDA version, one row per GPU with memory
 *   nvidia-smi -L | --list-gpus   GPU <i>: <name> (UUID: GPU-...), then the GPU's MIG devices NVML lets this
 *                                 process see, as the real tool prints them:
 *                                   MIG 1g.10gb     Device  0: (UUID: MIG-...)
 *   nvidia-smi --query-gpu=<fields> --format=csv[,noheader][,nounits]
 *       fields: index name uuid memory.total memory.used memory.free driver_version pci.bus_id count
 *
 * Exit codes follow the real tool: 0 on success, the NVML error code otherwise (9 when NVML cannot be
 * initialised, 6 when no GPU is visible, 12 when libnvidia-ml.so.1 is not found), 2 for bad arguments.
 *
 * Build: harness/mocknvml/build.sh [outdir]
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int nvml_return;
typedef void *nvml_device;
typedef struct {
    unsigned long long total, free, used;
} nvml_memory; /* nvmlMemory_t */
typedef struct {
    char bus_id_legacy[16];
    unsigned int domain, bus, device, pci_device_id, pci_subsystem_id;
    char bus_id[32];
} nvml_pci; /* nvmlPciInfo_t */

static struct {
    nvml_return (*init)(void);
    nvml_return (*shutdown)(void);
    const char *(*error_string)(nvml_return);
    nvml_return (*driver_version)(char *, unsigned int);
    nvml_return (*cuda_version)(int *);
    nvml_return (*count)(unsigned int *);
    nvml_return (*by_index)(unsigned int, nvml_device *);
    nvml_return (*name)(nvml_device, char *, unsigned int);
    nvml_return (*uuid)(nvml_device, char *, unsigned int);
    nvml_return (*memory)(nvml_device, nvml_memory *);
    nvml_return (*pci)(nvml_device, nvml_pci *);
    /* MIG; optional: a driver without them lists no MIG devices */
    nvml_return (*max_mig)(nvml_device, unsigned int *);
    nvml_return (*mig_by_index)(nvml_device, unsigned int, nvml_device *);
} nvml;

typedef struct {
    char name[96], uuid[96], bus_id[32];
    unsigned long long total_mib, used_mib, free_mib;
} gpu_info;

enum { EXIT_ARGS = 2, EXIT_NOT_FOUND = 6, EXIT_DRIVER = 9, EXIT_NO_LIBRARY = 12 };

static int load_nvml(void) {
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (lib == NULL) {
        fprintf(stderr, "NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please make sure "
                        "that the NVIDIA Display Driver is properly installed and present in your system.\n"
                        "Please also try adding directory that contains libnvidia-ml.so to your system PATH.\n");
        return 0;
    }
    struct {
        void **slot;
        const char *symbol;
    } table[] = {
        {(void **)&nvml.init, "nvmlInit_v2"},
        {(void **)&nvml.shutdown, "nvmlShutdown"},
        {(void **)&nvml.error_string, "nvmlErrorString"},
        {(void **)&nvml.driver_version, "nvmlSystemGetDriverVersion"},
        {(void **)&nvml.cuda_version, "nvmlSystemGetCudaDriverVersion"},
        {(void **)&nvml.count, "nvmlDeviceGetCount_v2"},
        {(void **)&nvml.by_index, "nvmlDeviceGetHandleByIndex_v2"},
        {(void **)&nvml.name, "nvmlDeviceGetName"},
        {(void **)&nvml.uuid, "nvmlDeviceGetUUID"},
        {(void **)&nvml.memory, "nvmlDeviceGetMemoryInfo"},
        {(void **)&nvml.pci, "nvmlDeviceGetPciInfo_v3"},
    };
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++) {
        *table[i].slot = dlsym(lib, table[i].symbol);
        if (*table[i].slot == NULL) {
            fprintf(stderr, "NVIDIA-SMI: libnvidia-ml.so.1 lacks %s\n", table[i].symbol);
            return 0;
        }
    }
    *(void **)&nvml.max_mig = dlsym(lib, "nvmlDeviceGetMaxMigDeviceCount");
    *(void **)&nvml.mig_by_index = dlsym(lib, "nvmlDeviceGetMigDeviceHandleByIndex");
    return 1;
}


static int fail(nvml_return ret, const char *what) {
    fprintf(stderr, "%s: %s\n", what, nvml.error_string(ret));
    return ret;
}

/* The MIG devices of GPU `dev` this process may see, one line each; returns an NVML error or 0. */
static int list_mig(nvml_device dev) {
    unsigned int max = 0;
    if (nvml.max_mig == NULL || nvml.mig_by_index == NULL || nvml.max_mig(dev, &max) != 0) {
        return 0; /* no MIG on this GPU or driver */
    }
    for (unsigned int i = 0; i < max; i++) {
        nvml_device mig;
        char name[96], uuid[96];
        nvml_return ret = nvml.mig_by_index(dev, i, &mig);
        if (ret == 6 /* NVML_ERROR_NOT_FOUND: no more */ || ret == 3 /* NOT_SUPPORTED: MIG mode off */) {
            return 0;
        }
        if (ret != 0 || (ret = nvml.name(mig, name, sizeof(name))) != 0 ||
            (ret = nvml.uuid(mig, uuid, sizeof(uuid))) != 0) {
            return fail(ret, "Unable to query MIG device");
        }
        const char *profile = strstr(name, " MIG ");
        printf("  MIG %-12s Device %2u: (UUID: %s)\n", profile != NULL ? profile + 5 : name, i, uuid);
    }
    return 0;
}

static int gpu(unsigned int index, gpu_info *out) {
    nvml_device dev;
    nvml_memory mem;
    nvml_pci pci;
    nvml_return ret;
    if ((ret = nvml.by_index(index, &dev)) != 0 || (ret = nvml.name(dev, out->name, sizeof(out->name))) != 0 ||
        (ret = nvml.uuid(dev, out->uuid, sizeof(out->uuid))) != 0 || (ret = nvml.memory(dev, &mem)) != 0 ||
        (ret = nvml.pci(dev, &pci)) != 0) {
        return fail(ret, "Unable to query GPU");
    }
    out->total_mib = mem.total / 1048576ull;
    out->used_mib = mem.used / 1048576ull;
    out->free_mib = mem.free / 1048576ull;
    snprintf(out->bus_id, sizeof(out->bus_id), "%s", pci.bus_id);
    return 0;
}

static int list(unsigned int count) {
    for (unsigned int i = 0; i < count; i++) {
        gpu_info g;
        int ret = gpu(i, &g);
        if (ret != 0) {
            return ret;
        }
        printf("GPU %u: %s (UUID: %s)\n", i, g.name, g.uuid);
        nvml_device dev;
        if ((ret = nvml.by_index(i, &dev)) != 0 || (ret = list_mig(dev)) != 0) {
            return ret;
        }
    }
    return 0;
}

static int table(unsigned int count) {
    char driver[80];
    int cuda = 0;
    nvml_return ret = nvml.driver_version(driver, sizeof(driver));
    if (ret != 0 || (ret = nvml.cuda_version(&cuda)) != 0) {
        return fail(ret, "Unable to query the driver");
    }
    time_t now = time(NULL);
    char stamp[64];
    strftime(stamp, sizeof(stamp), "%a %b %e %H:%M:%S %Y", localtime(&now));
    const char *rule =
        "+-----------------------------------------+------------------------+----------------------+";
    printf("%s\n%s\n", stamp, rule);
    char head[256];
    snprintf(head, sizeof(head), "NVIDIA-SMI %s       Driver Version: %s       CUDA Version: %d.%d", driver,
             driver, cuda / 1000, cuda % 1000 / 10);
    printf("| %-87s |\n%s\n", head, rule);
    printf("| %-39s | %-22s | %20s |\n", "GPU  Name", "Bus-Id", "Memory-Usage");
    printf("|=========================================+========================+======================|\n");
    for (unsigned int i = 0; i < count; i++) {
        gpu_info g;
        if ((ret = gpu(i, &g)) != 0) {
            return ret;
        }
        char usage[64];
        snprintf(usage, sizeof(usage), "%lluMiB / %lluMiB", g.used_mib, g.total_mib);
        printf("| %3u  %-34.34s | %-22s | %20s |\n", i, g.name, g.bus_id, usage);
        printf("%s\n", rule);
    }
    if (count == 0) {
        printf("|  No devices were found%67s|\n%s\n", "", rule);
    }
    return 0;
}

static const char *const k_fields[] = {"index",       "name",        "uuid",           "memory.total",
                                       "memory.used", "memory.free", "driver_version", "pci.bus_id",
                                       "count"};
enum { F_INDEX, F_NAME, F_UUID, F_TOTAL, F_USED, F_FREE, F_DRIVER, F_BUS, F_COUNT, F_NFIELDS };

/* Index of a --query-gpu field in k_fields, or -1. */
static int field_id(const char *name) {
    for (int i = 0; i < F_NFIELDS; i++) {
        if (strcmp(name, k_fields[i]) == 0) {
            return i;
        }
    }
    return -1;
}

static void print_field(int id, unsigned int index, unsigned int count, const gpu_info *g, const char *driver,
                        int units) {
    const char *mib = units ? " MiB" : "";
    switch (id) {
    case F_INDEX: printf("%u", index); break;
    case F_NAME: printf("%s", g->name); break;
    case F_UUID: printf("%s", g->uuid); break;
    case F_TOTAL: printf("%llu%s", g->total_mib, mib); break;
    case F_USED: printf("%llu%s", g->used_mib, mib); break;
    case F_FREE: printf("%llu%s", g->free_mib, mib); break;
    case F_DRIVER: printf("%s", driver); break;
    case F_BUS: printf("%s", g->bus_id); break;
    default: printf("%u", count); break;
    }
}

/* --query-gpu=<fields> --format=csv[,noheader][,nounits]: one CSV line per GPU. */
static int query(unsigned int count, const char *fields, const char *format) {
    int header = 1, units = 1;
    char buf[1024];
    char *save = NULL;
    snprintf(buf, sizeof(buf), "%s", format);
    const char *opt = strtok_r(buf, ",", &save);
    if (opt == NULL || strcmp(opt, "csv") != 0) {
        fprintf(stderr, "Invalid format '%s': use --format=csv[,noheader][,nounits]\n", format);
        return EXIT_ARGS;
    }
    while ((opt = strtok_r(NULL, ",", &save)) != NULL) {
        if (strcmp(opt, "noheader") == 0) {
            header = 0;
        } else if (strcmp(opt, "nounits") == 0) {
            units = 0;
        } else {
            fprintf(stderr, "Invalid format option '%s' (supported: noheader, nounits)\n", opt);
            return EXIT_ARGS;
        }
    }
    int ids[32];
    unsigned int n = 0;
    snprintf(buf, sizeof(buf), "%s", fields);
    for (char *f = strtok_r(buf, ",", &save); f != NULL; f = strtok_r(NULL, ",", &save)) {
        int id = field_id(f);
        if (id < 0 || n == sizeof(ids) / sizeof(ids[0])) {
            fprintf(stderr, "Field \"%s\" is not a valid field to query.\n", f);
            return EXIT_ARGS;
        }
        ids[n++] = id;
    }
    if (n == 0) {
        fprintf(stderr, "--query-gpu needs at least one field\n");
        return EXIT_ARGS;
    }
    char driver[80];
    nvml_return ret = nvml.driver_version(driver, sizeof(driver));
    if (ret != 0) {
        return fail(ret, "Unable to query the driver");
    }
    if (header) {
        for (unsigned int k = 0; k < n; k++) {
            int memory = ids[k] == F_TOTAL || ids[k] == F_USED || ids[k] == F_FREE;
            printf("%s%s%s", k ? ", " : "", k_fields[ids[k]], memory ? " [MiB]" : ""); /* nounits too */
        }
        printf("\n");
    }
    for (unsigned int i = 0; i < count; i++) {
        gpu_info g;
        if ((ret = gpu(i, &g)) != 0) {
            return ret;
        }
        for (unsigned int k = 0; k < n; k++) {
            printf("%s", k ? ", " : "");
            print_field(ids[k], i, count, &g, driver, units);
        }
        printf("\n");
    }
    return 0;
}

int main(int argc, char **argv) {
    enum { TABLE, LIST, QUERY } mode = TABLE;
    const char *fields = NULL, *format = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-L") == 0 || strcmp(argv[i], "--list-gpus") == 0) {
            mode = LIST;
        } else if (strncmp(argv[i], "--query-gpu=", 12) == 0) {
            mode = QUERY;
            fields = argv[i] + 12;
        } else if (strncmp(argv[i], "--format=", 9) == 0) {
            format = argv[i] + 9;
        } else {
            fprintf(stderr, "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n");
            return EXIT_ARGS;
        }
    }
    if (mode == QUERY && format == NULL) {
        fprintf(stderr, "--format is required with --query-gpu (e.g. --format=csv,noheader)\n");
        return EXIT_ARGS;
    }
    if (!load_nvml()) {
        return EXIT_NO_LIBRARY;
    }
    nvml_return ret = nvml.init();
    if (ret != 0) {
        fprintf(stderr, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                        "Make sure that the latest NVIDIA driver is installed and running.\n");
        return EXIT_DRIVER;
    }
    unsigned int count = 0;
    if ((ret = nvml.count(&count)) != 0) {
        return fail(ret, "Unable to count GPUs");
    }
    int status;
    if (mode == LIST && count == 0) {
        printf("No devices were found\n");
        status = EXIT_NOT_FOUND;
    } else if (mode == LIST) {
        status = list(count);
    } else if (mode == QUERY) {
        status = query(count, fields, format);
    } else {
        status = table(count);
    }
    nvml.shutdown();
    return status;
}
