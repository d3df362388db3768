/*
 * fracgpu mock NVML, part 3: GPU health: the event API, lost GPUs and the recovery action. Written from
 * scratch for fracgpu; signatures, constants and semantics as NVIDIA's nvml.h documents them:
 *
 *   nvmlEventSetCreate(nvmlEventSet_t *set)
 *   nvmlDeviceGetSupportedEventTypes(nvmlDevice_t, unsigned long long *eventTypes)
 *   nvmlDeviceRegisterEvents(nvmlDevice_t, unsigned long long eventTypes, nvmlEventSet_t set)
 *   nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)  (and nvmlEventSetWait)
 *   nvmlEventSetFree(nvmlEventSet_t set)
 *   nvmlDeviceGetFieldValues(nvmlDevice_t, int count, nvmlFieldValue_t *values)  (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)
 *
 * What happens to the GPUs comes from the control file named by FRACGPU_MOCK_NVML_EVENTS, which tests append
 * lines to; '#' comments and blank lines are ignored, a malformed line is skipped with one stderr line:
 *
 *   <gpu> xid <n> [<action>]   an XID critical error n on that GPU (an nvmlEventTypeXidCriticalError event,
 *                              eventData = n); <action> sets the GPU's recovery action: none, gpu_reset,
 *                              node_reboot, drain_p2p, drain_and_reset (NVML_GPU_RECOVERY_ACTION_*)
 *   <gpu> lost                 the GPU fell off the bus: its device calls return NVML_ERROR_GPU_IS_LOST and a
 *                              wait on an event set it is registered in returns NVML_ERROR_GPU_IS_LOST (once)
 *   <gpu> action <action>      the driver now reports that recovery action for the GPU (no event): e.g.
 *                              gpu_reset after an XID that came with none, and none once the reset is done
 *   <gpu> reset                the GPU was reset: usable again, recovery action none
 *
 * <gpu> is an NVML index or a UUID, for an xid optionally followed by /gi<id>: an XID on that GPU instance (MIG),
 * whose event carries gpuInstanceId <id> (computeInstanceId 0xFFFFFFFF: the whole GPU instance); without it both
 * are 0xFFFFFFFF (the whole GPU). The file is the GPUs' history: a process that initialises NVML replays it
 * (a GPU lost before stays lost) but, as the driver does, an event set receives only events that occur after
 * its registration. Lines are read when a set is waited on or registered, and on nvmlInit.
 *
 * Semantics kept: one event per successful wait, in order; a wait with events ready returns at once, else it
 * sleeps until one arrives but at most timeoutms, then NVML_ERROR_TIMEOUT (on an inotify watch of the control
 * file's directory, as the driver's wait sleeps in the kernel: no CPU while nothing happens); registering a type
 * the device does not support (only XID critical errors are supported here) is NVML_ERROR_NOT_SUPPORTED with
 * nothing registered; gpuInstanceId / computeInstanceId are 0xFFFFFFFF unless the line names a GPU instance. A
 * set holds at most MOCK_QUEUE events; later ones are dropped (as a full driver queue drops them) and counted on
 * stderr at nvmlEventSetFree.
 */
#include "mock_profile.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <libgen.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>
#include <time.h>

typedef int mock_return;
enum {
    EV_SUCCESS = 0,
    EV_ERROR_UNINITIALIZED = 1,
    EV_ERROR_INVALID_ARGUMENT = 2,
    EV_ERROR_NOT_SUPPORTED = 3,
    EV_ERROR_TIMEOUT = 10,
    EV_ERROR_GPU_IS_LOST = 15
};

#define EVENT_XID_CRITICAL 0x8ull      /* nvmlEventTypeXidCriticalError */
#define EVENT_ALL 0xFFFFull            /* the types nvml.h defines (nvmlEventTypeAll) */
#define FI_GPU_RECOVERY_ACTION 230     /* NVML_FI_DEV_GET_GPU_RECOVERY_ACTION */
#define VALUE_TYPE_UNSIGNED_INT 1      /* NVML_VALUE_TYPE_UNSIGNED_INT */
#define MOCK_QUEUE 65536
#define MOCK_EVENTS_ENV "FRACGPU_MOCK_NVML_EVENTS"
#define WAKE_MS 500u                   /* the longest sleep of a wait between two looks */
#define NO_INSTANCE 0xFFFFFFFFu

typedef struct {
    void *device; /* nvmlDevice_t */
    unsigned long long event_type;
    unsigned long long event_data;
    unsigned int gpu_instance_id;
    unsigned int compute_instance_id;
} mock_event_data; /* nvmlEventData_t */

typedef struct {
    unsigned int field_id;
    unsigned int scope_id;
    long long timestamp;
    long long latency_usec;
    int value_type;
    int nvml_return;
    unsigned long long value; /* nvmlValue_t: a union of 8 bytes */
} mock_field_value; /* nvmlFieldValue_t */

typedef struct mock_event_set {
    unsigned long long registered[MOCK_MAX_GPUS]; /* event types per visible GPU */
    int lost_reported[MOCK_MAX_GPUS];             /* GPU_IS_LOST already returned for that GPU */
    mock_event_data *queue;
    unsigned int head, count;
    unsigned long long dropped;
    struct mock_event_set *next;
} mock_event_set;

/* mock_nvml.c: the library's checks and its devices */
MOCK_HIDDEN mock_return mock_nvml_check_device(const mock_device *device, const void *out);
MOCK_HIDDEN const mock_device *mock_nvml_device(unsigned int index);
MOCK_HIDDEN unsigned int mock_nvml_device_count(void);
MOCK_HIDDEN int mock_nvml_initialized(void);

static pthread_mutex_t g_ev_lock = PTHREAD_MUTEX_INITIALIZER;
static mock_event_set *g_sets;
static long g_offset;                  /* bytes of the control file applied */
static int g_lost[MOCK_MAX_GPUS];      /* per visible GPU */
static unsigned int g_action[MOCK_MAX_GPUS];

/* Index of the visible GPU `who` names (index or UUID), or -1. */
static int find_gpu(const char *who) {
    unsigned int n = mock_nvml_device_count();
    char *end;
    unsigned long index = strtoul(who, &end, 10);
    if (*who != '\0' && *end == '\0') {
        return index < n ? (int)index : -1;
    }
    for (unsigned int i = 0; i < n; i++) {
        if (strcmp(mock_nvml_device(i)->uuid, who) == 0) {
            return (int)i;
        }
    }
    return -1;
}

static int parse_action(const char *name, unsigned int *action) {
    static const char *names[] = {"none", "gpu_reset", "node_reboot", "drain_p2p", "drain_and_reset"};
    for (unsigned int i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (strcmp(name, names[i]) == 0) {
            *action = i;
            return 1;
        }
    }
    return 0;
}

static void deliver(int gpu, unsigned long long type, unsigned long long data, unsigned int gpu_instance) {
    for (mock_event_set *set = g_sets; set != NULL; set = set->next) {
        if (!(set->registered[gpu] & type)) {
            continue;
        }
        if (set->count == MOCK_QUEUE) {
            set->dropped++;
            continue;
        }
        mock_event_data *e = &set->queue[(set->head + set->count) % MOCK_QUEUE];
        e->device = (void *)mock_nvml_device((unsigned int)gpu);
        e->event_type = type;
        e->event_data = data;
        e->gpu_instance_id = gpu_instance;
        e->compute_instance_id = NO_INSTANCE;
        set->count++;
    }
}

static void apply_line(const char *path, const char *line) {
    char who[MOCK_UUID_SIZE], what[16], arg[32], action_name[32];
    const char *p = line;
    while (*p == ' ' || *p == '\t') {
        p++;
    }
    if (*p == '#' || *p == '\n' || *p == '\0') {
        return;
    }
    int fields = sscanf(p, "%95s %15s %31s %31s", who, what, arg, action_name);
    unsigned int gpu_instance = NO_INSTANCE;
    char *slash = fields >= 2 ? strchr(who, '/') : NULL;
    if (slash != NULL) { /* <gpu>/gi<id> */
        char *end_gi = NULL;
        unsigned long gi = strncmp(slash, "/gi", 3) == 0 ? strtoul(slash + 3, &end_gi, 10) : 0;
        if (end_gi == NULL || end_gi == slash + 3 || *end_gi != '\0' || gi > 14) {
            fprintf(stderr, "fracgpu mock NVML: %s: skipping line with a bad GPU instance: %s", path, line);
            return;
        }
        gpu_instance = (unsigned int)gi;
        *slash = '\0';
    }
    int gpu = fields >= 2 ? find_gpu(who) : -1;
    unsigned int action = 0;
    char *end = NULL;
    unsigned long xid = fields >= 3 ? strtoul(arg, &end, 10) : 0;
    if (gpu >= 0 && fields == 2 && strcmp(what, "lost") == 0) {
        g_lost[gpu] = 1;
        for (mock_event_set *set = g_sets; set != NULL; set = set->next) {
            set->lost_reported[gpu] = 0;
        }
    } else if (gpu >= 0 && fields == 3 && gpu_instance == NO_INSTANCE && strcmp(what, "action") == 0 &&
               parse_action(arg, &action)) {
        g_action[gpu] = action;
    } else if (gpu >= 0 && fields == 2 && strcmp(what, "reset") == 0) {
        g_lost[gpu] = 0;
        g_action[gpu] = 0;
    } else if (gpu >= 0 && fields >= 3 && strcmp(what, "xid") == 0 && end != NULL && *end == '\0' &&
               (fields == 3 || parse_action(action_name, &action))) {
        if (fields == 4) {
            g_action[gpu] = action;
        }
        deliver(gpu, EVENT_XID_CRITICAL, xid, gpu_instance);
    } else {
        fprintf(stderr, "fracgpu mock NVML: %s: skipping malformed or unknown-GPU line: %s", path, line);
    }
}

/* Applies the control file's lines appended since the last read (all of them after a truncation). */
static void read_control(void) {
    const char *path = getenv(MOCK_EVENTS_ENV);
    struct stat st;
    if (path == NULL || *path == '\0' || stat(path, &st) != 0) {
        return;
    }
    if (st.st_size < g_offset) {
        g_offset = 0;
    }
    if (st.st_size == g_offset) {
        return;
    }
    FILE *f = fopen(path, "r");
    if (f == NULL || fseek(f, g_offset, SEEK_SET) != 0) {
        if (f != NULL) {
            fclose(f);
        }
        return;
    }
    char line[MOCK_LINE_SIZE];
    while (fgets(line, sizeof(line), f) != NULL) {
        size_t len = strlen(line);
        if (len == 0 || line[len - 1] != '\n') {
            break; /* a line still being written: read it whole next time */
        }
        g_offset += (long)len;
        apply_line(path, line);
    }
    fclose(f);
}

/* ---- for mock_nvml.c ---- */

/* nvmlInit: replay the history (no sets exist yet, so no events). Called with the library initialised. */
MOCK_HIDDEN void mock_events_init(void) {
    pthread_mutex_lock(&g_ev_lock);
    if (g_sets == NULL) {
        g_offset = 0;
        memset(g_lost, 0, sizeof(g_lost));
        memset(g_action, 0, sizeof(g_action));
    }
    read_control();
    pthread_mutex_unlock(&g_ev_lock);
}

MOCK_HIDDEN int mock_events_lost(unsigned int index) {
    pthread_mutex_lock(&g_ev_lock);
    read_control();
    int lost = index < MOCK_MAX_GPUS && g_lost[index];
    pthread_mutex_unlock(&g_ev_lock);
    return lost;
}

/* ---- exported NVML API ---- */

mock_return nvmlEventSetCreate(mock_event_set **set) {
    if (!mock_nvml_initialized()) {
        return EV_ERROR_UNINITIALIZED;
    }
    if (set == NULL) {
        return EV_ERROR_INVALID_ARGUMENT;
    }
    mock_event_set *s = calloc(1, sizeof(*s));
    if (s != NULL) {
        s->queue = malloc(sizeof(mock_event_data) * MOCK_QUEUE);
    }
    if (s == NULL || s->queue == NULL) {
        free(s);
        return 999; /* NVML_ERROR_UNKNOWN */
    }
    pthread_mutex_lock(&g_ev_lock);
    s->next = g_sets;
    g_sets = s;
    pthread_mutex_unlock(&g_ev_lock);
    *set = s;
    return EV_SUCCESS;
}

mock_return nvmlDeviceGetSupportedEventTypes(const mock_device *device, unsigned long long *types) {
    mock_return ret = mock_nvml_check_device(device, types);
    if (ret == EV_SUCCESS) {
        *types = EVENT_XID_CRITICAL;
    }
    return ret;
}

static int known_set(const mock_event_set *set) {
    for (const mock_event_set *s = g_sets; s != NULL; s = s->next) {
        if (s == set) {
            return 1;
        }
    }
    return 0;
}

mock_return nvmlDeviceRegisterEvents(const mock_device *device, unsigned long long types, mock_event_set *set) {
    mock_return ret = mock_nvml_check_device(device, &types);
    if (ret != EV_SUCCESS) {
        return ret;
    }
    pthread_mutex_lock(&g_ev_lock);
    if (set == NULL || !known_set(set) || types == 0 || (types & ~EVENT_ALL)) {
        ret = EV_ERROR_INVALID_ARGUMENT;
    } else if (types & ~EVENT_XID_CRITICAL) {
        ret = EV_ERROR_NOT_SUPPORTED;
    } else {
        read_control(); /* earlier events are not recorded */
        unsigned int gpu = 0;
        while (mock_nvml_device(gpu) != device) {
            gpu++;
        }
        set->registered[gpu] |= types;
    }
    pthread_mutex_unlock(&g_ev_lock);
    return ret;
}

static void sleep_ms(unsigned int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* An inotify descriptor that becomes readable when anything in the control file's directory changes, or -1 when
 * there is no control file to watch. */
static int watch_control(void) {
    const char *path = getenv(MOCK_EVENTS_ENV);
    if (path == NULL || *path == '\0') {
        return -1;
    }
    char copy[MOCK_LINE_SIZE];
    if (strlen(path) >= sizeof(copy)) {
        return -1;
    }
    strcpy(copy, path); /* dirname may write into its argument */
    int fd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    if (fd >= 0 && inotify_add_watch(fd, dirname(copy), IN_MODIFY | IN_CLOSE_WRITE | IN_CREATE | IN_MOVED_TO) < 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* Sleep at most `ms` ms, less when `watch` (from watch_control, or -1) reports a change. */
static void sleep_until_change(int watch, unsigned int ms) {
    if (watch < 0) {
        sleep_ms(ms);
        return;
    }
    struct pollfd ready = {watch, POLLIN, 0};
    if (poll(&ready, 1, (int)ms) > 0) {
        char drained[4096];
        while (read(watch, drained, sizeof(drained)) > 0) {
        }
    }
}

static unsigned long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000ull + (unsigned long long)ts.tv_nsec / 1000000ull;
}

/* One step of a wait: an event or a lost GPU to report (returns 1 with *ret set), else 0. Under g_ev_lock. */
static int take(mock_event_set *set, mock_event_data *data, mock_return *ret) {
    read_control();
    for (unsigned int gpu = 0; gpu < mock_nvml_device_count(); gpu++) {
        if (set->registered[gpu] && g_lost[gpu] && !set->lost_reported[gpu]) {
            set->lost_reported[gpu] = 1;
            *ret = EV_ERROR_GPU_IS_LOST;
            return 1;
        }
    }
    if (set->count == 0) {
        return 0;
    }
    *data = set->queue[set->head];
    set->head = (set->head + 1) % MOCK_QUEUE;
    set->count--;
    *ret = EV_SUCCESS;
    return 1;
}

mock_return nvmlEventSetWait_v2(mock_event_set *set, mock_event_data *data, unsigned int timeoutms) {
    if (!mock_nvml_initialized()) {
        return EV_ERROR_UNINITIALIZED;
    }
    if (set == NULL || data == NULL) {
        return EV_ERROR_INVALID_ARGUMENT;
    }
    unsigned long long deadline = now_ms() + timeoutms;
    int watch = watch_control(); /* before the first look: a line written after it wakes the sleep below */
    for (;;) {
        mock_return ret = EV_ERROR_INVALID_ARGUMENT;
        pthread_mutex_lock(&g_ev_lock);
        int known = known_set(set);
        int got = known && take(set, data, &ret);
        pthread_mutex_unlock(&g_ev_lock);
        unsigned long long now = now_ms();
        if (!known || got || now >= deadline) {
            if (watch >= 0) {
                close(watch);
            }
            return !known || got ? ret : EV_ERROR_TIMEOUT;
        }
        /* as the driver's wait, no CPU while nothing happens; a set freed meanwhile is noticed within WAKE_MS */
        sleep_until_change(watch, deadline - now < WAKE_MS ? (unsigned int)(deadline - now) : WAKE_MS);
    }
}

mock_return nvmlEventSetWait(mock_event_set *set, mock_event_data *data, unsigned int timeoutms) {
    return nvmlEventSetWait_v2(set, data, timeoutms);
}

mock_return nvmlEventSetFree(mock_event_set *set) {
    if (!mock_nvml_initialized()) {
        return EV_ERROR_UNINITIALIZED;
    }
    pthread_mutex_lock(&g_ev_lock);
    mock_return ret = EV_ERROR_INVALID_ARGUMENT;
    for (mock_event_set **link = &g_sets; *link != NULL; link = &(*link)->next) {
        if (*link == set) {
            *link = set->next;
            ret = EV_SUCCESS;
            break;
        }
    }
    pthread_mutex_unlock(&g_ev_lock);
    if (ret == EV_SUCCESS) {
        if (set->dropped) {
            fprintf(stderr, "fracgpu mock NVML: an event set dropped %llu events (queue of %d full)\n", set->dropped,
                    MOCK_QUEUE);
        }
        free(set->queue);
        free(set);
    }
    return ret;
}

mock_return nvmlDeviceGetFieldValues(const mock_device *device, int count, mock_field_value *values) {
    mock_return ret = mock_nvml_check_device(device, values);
    if (ret != EV_SUCCESS) {
        return ret;
    }
    if (count < 0) {
        return EV_ERROR_INVALID_ARGUMENT;
    }
    unsigned int gpu = 0;
    while (mock_nvml_device(gpu) != device) {
        gpu++;
    }
    pthread_mutex_lock(&g_ev_lock);
    read_control();
    for (int i = 0; i < count; i++) {
        values[i].timestamp = (long long)now_ms() * 1000;
        values[i].latency_usec = 0;
        if (values[i].field_id == FI_GPU_RECOVERY_ACTION) {
            values[i].value_type = VALUE_TYPE_UNSIGNED_INT;
            values[i].value = g_action[gpu];
            values[i].nvml_return = EV_SUCCESS;
        } else {
            values[i].nvml_return = EV_ERROR_NOT_SUPPORTED;
        }
    }
    pthread_mutex_unlock(&g_ev_lock);
    return EV_SUCCESS;
}
