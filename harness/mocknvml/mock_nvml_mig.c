/*
 * fracgpu mock NVML, part 4: MIG management (nvml.h's "Multi Instance GPU Management" group), on the model and
 * the shared state of mock_mig.h. Written from scratch for fracgpu; signatures, struct layouts, constants and
 * return codes as NVIDIA's nvml.h documents them and nvidia-ml-py (pynvml) passes them through ctypes.
 *
 * Semantics kept from the driver:
 *   - nvmlDeviceGetMigMode: NOT_SUPPORTED on a GPU that cannot do MIG; every GPU- and compute-instance call
 *     answers NOT_SUPPORTED while the GPU's current mode is disabled;
 *   - managing instances (create, destroy, set the mode) needs the MIG "config" capability: the process must be
 *     able to open /dev/nvidia-caps/nvidia-cap1 under the device root (mock_profile.h; always without one),
 *     else NO_PERMISSION;
 *   - nvmlDeviceCreateGpuInstanceWithPlacement: INVALID_ARGUMENT for an unknown profile or a placement the
 *     profile does not have; INSUFFICIENT_RESOURCES when the memory slices are taken, the compute slices would
 *     exceed 7 or the profile has no instance left; nvmlDeviceCreateGpuInstance takes the first free placement,
 *     from the top of the GPU down;
 *   - nvmlGpuInstanceDestroy: IN_USE while the GI holds compute instances; nvmlComputeInstanceDestroy: IN_USE
 *     while a process runs on its MIG device (a line `<MIG UUID> <pid> <bytes>` in FRACGPU_MOCK_NVML_PROCESSES,
 *     see mock_nvml.c);
 *   - nvmlGpuInstanceGetComputeInstanceProfileInfo[V] / CreateComputeInstance: NOT_SUPPORTED for a CI profile
 *     that does not exist in that GI (mock_mig_ci_profile_valid), INVALID_ARGUMENT for an index past
 *     NVML_COMPUTE_INSTANCE_PROFILE_COUNT or an engine profile other than SHARED;
 *   - a handle of a destroyed instance is INVALID_ARGUMENT (a later instance with the same id is another one);
 *   - MIG device handles (nvmlDeviceGetMigDeviceHandleByIndex): only CIs whose GI and CI capability nodes the
 *     process can open, as a container given one partition sees only it; nvmlDeviceGetUUID, nvmlDeviceGetName
 *     ("<GPU name> MIG <profile>") and nvmlDeviceGetMemoryInfo answer for them too (mock_nvml.c asks here).
 */
#include "mock_mig.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

typedef int mock_return;
enum {
    MIG_SUCCESS = 0,
    MIG_ERROR_UNINITIALIZED = 1,
    MIG_ERROR_INVALID_ARGUMENT = 2,
    MIG_ERROR_NOT_SUPPORTED = 3,
    MIG_ERROR_NO_PERMISSION = 4,
    MIG_ERROR_NOT_FOUND = 6,
    MIG_ERROR_INSUFFICIENT_SIZE = 7,
    MIG_ERROR_IN_USE = 19,
    MIG_ERROR_INSUFFICIENT_RESOURCES = 23,
    MIG_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    MIG_ERROR_UNKNOWN = 999
};
#define GI_INFO_V2_VERSION 0x02000098u /* nvmlGpuInstanceProfileInfo_v2 */
#define CI_INFO_V2_VERSION 0x02000088u /* nvmlComputeInstanceProfileInfo_v2 */
#define CI_PROFILE_COUNT 9u            /* NVML_COMPUTE_INSTANCE_PROFILE_COUNT */
#define GI_PROFILE_COUNT 18u           /* NVML_GPU_INSTANCE_PROFILE_COUNT */
#define NAME_SIZE 96                   /* NVML_DEVICE_NAME_V2_BUFFER_SIZE */

/* From mock_nvml.c. */
MOCK_HIDDEN mock_return mock_nvml_check_device(const mock_device *device, const void *out);
MOCK_HIDDEN const mock_state *mock_nvml_state(void);
MOCK_HIDDEN unsigned int mock_nvml_processes_on(const char *uuid);

/* ---- structs (layouts as in nvml.h / pynvml) ---- */
typedef struct {
    unsigned int start, size;
} mig_placement; /* nvmlGpuInstancePlacement_t, nvmlComputeInstancePlacement_t */

typedef struct {
    unsigned int id, is_p2p_supported, slice_count, instance_count, multiprocessor_count, copy_engine_count,
        decoder_count, encoder_count, jpeg_count, ofa_count;
    unsigned long long memory_size_mb;
} gi_profile_v1;

typedef struct {
    unsigned int version, id, is_p2p_supported, slice_count, instance_count, multiprocessor_count,
        copy_engine_count, decoder_count, encoder_count, jpeg_count, ofa_count;
    unsigned long long memory_size_mb;
    char name[NAME_SIZE];
} gi_profile_v2;

typedef struct {
    unsigned int id, slice_count, instance_count, multiprocessor_count, shared_copy_engine_count,
        shared_decoder_count, shared_encoder_count, shared_jpeg_count, shared_ofa_count;
} ci_profile_v1;

typedef struct {
    unsigned int version, id, slice_count, instance_count, multiprocessor_count, shared_copy_engine_count,
        shared_decoder_count, shared_encoder_count, shared_jpeg_count, shared_ofa_count;
    char name[NAME_SIZE];
} ci_profile_v2;

/* Handles: one slot per (GPU, GI id) and (GPU, GI id, CI id), stamped with the GI's serial when handed out. */
typedef struct {
    unsigned int gpu, gi, serial;
} gi_handle;
typedef struct {
    unsigned int gpu, gi, ci, serial;
} ci_handle;
typedef struct {
    unsigned int magic, gpu, gi, ci, serial;
} mig_device;
#define MIG_DEVICE_MAGIC 0x4d494744u

static gi_handle g_gi[MOCK_MAX_GPUS][MOCK_MIG_GI_IDS];
static ci_handle g_ci[MOCK_MAX_GPUS][MOCK_MIG_GI_IDS][MOCK_MIG_CI_IDS];
static mig_device g_mig[MOCK_MAX_GPUS][MOCK_MIG_GI_IDS][MOCK_MIG_CI_IDS];
static pthread_mutex_t g_handle_lock = PTHREAD_MUTEX_INITIALIZER;
/* Whether pointer p points into the array a (any dimensions). */
#define IN_ARRAY(p, a) ((const char *)(p) >= (const char *)(a) && (const char *)(p) < (const char *)(a) + sizeof(a))

static const mock_state *st(void) {
    return mock_nvml_state();
}

static unsigned int gpu_index(const mock_device *d) {
    return (unsigned int)(d - &st()->gpus[0]);
}

static gi_handle *gi_handle_of(unsigned int gpu, unsigned int gi, unsigned int serial) {
    pthread_mutex_lock(&g_handle_lock);
    gi_handle *h = &g_gi[gpu][gi];
    *h = (gi_handle){gpu, gi, serial};
    pthread_mutex_unlock(&g_handle_lock);
    return h;
}

static ci_handle *ci_handle_of(unsigned int gpu, unsigned int gi, unsigned int ci, unsigned int serial) {
    pthread_mutex_lock(&g_handle_lock);
    ci_handle *h = &g_ci[gpu][gi][ci];
    *h = (ci_handle){gpu, gi, ci, serial};
    pthread_mutex_unlock(&g_handle_lock);
    return h;
}

/* The GPU's table and state after the common checks; `need_enabled`: MIG mode must be on. */
static mock_return mig_gpu(mock_device *dev, const void *out, int need_enabled, const mock_mig_table **table,
                           mock_mig_state *state) {
    mock_return ret = mock_nvml_check_device(dev, out);
    if (ret != MIG_SUCCESS) {
        return ret;
    }
    *table = mock_mig_table_of(dev);
    if (*table == NULL) {
        return MIG_ERROR_NOT_SUPPORTED;
    }
    if (!mock_mig_load(st(), dev, state)) {
        return MIG_ERROR_UNKNOWN;
    }
    return need_enabled && state->current != 1 ? MIG_ERROR_NOT_SUPPORTED : MIG_SUCCESS;
}

/* The GI a handle stands for, checked to be alive; fills device, table, state. */
static mock_return live_gi(const gi_handle *h, const void *out, mock_device **dev, const mock_mig_table **table,
                           mock_mig_state *state) {
    if (h == NULL || out == NULL || !IN_ARRAY(h, g_gi) ||
        h->gpu >= st()->count) {
        return MIG_ERROR_INVALID_ARGUMENT;
    }
    *dev = (mock_device *)&st()->gpus[h->gpu];
    mock_return ret = mig_gpu(*dev, out, 1, table, state);
    if (ret == MIG_SUCCESS && (!state->gi[h->gi].used || state->gi[h->gi].serial != h->serial)) {
        ret = MIG_ERROR_INVALID_ARGUMENT;
    }
    return ret;
}

static int may_configure(void) {
    return mock_mig_cap_openable(1); /* the MIG "config" capability */
}

/* ---- MIG mode ---- */

mock_return nvmlDeviceGetMigMode(mock_device *dev, unsigned int *current, unsigned int *pending) {
    const mock_mig_table *t;
    mock_mig_state s;
    mock_return ret = mig_gpu(dev, current, 0, &t, &s);
    if (ret == MIG_SUCCESS && pending == NULL) {
        ret = MIG_ERROR_INVALID_ARGUMENT;
    }
    if (ret == MIG_SUCCESS) {
        *current = s.current;
        *pending = s.pending;
    }
    return ret;
}

static int set_mode(mock_mig_state *s, void *arg) {
    for (unsigned int g = 0; g < MOCK_MIG_GI_IDS; g++) {
        if (s->gi[g].used) {
            return MIG_ERROR_IN_USE;
        }
    }
    s->current = s->pending = *(unsigned int *)arg;
    return MIG_SUCCESS;
}

mock_return nvmlDeviceSetMigMode(mock_device *dev, unsigned int mode, mock_return *activation) {
    const mock_mig_table *t;
    mock_mig_state s;
    mock_return ret = mig_gpu(dev, activation, 0, &t, &s);
    if (ret != MIG_SUCCESS) {
        return ret;
    }
    if (mode > 1) {
        return MIG_ERROR_INVALID_ARGUMENT;
    }
    if (!may_configure()) {
        return MIG_ERROR_NO_PERMISSION;
    }
    ret = mock_mig_update(st(), dev, set_mode, &mode);
    *activation = ret;
    return ret;
}

/* ---- GPU-instance profiles and placements ---- */

static void fill_gi_profile(const mock_mig_profile *p, gi_profile_v2 *out) {
    out->id = p->id;
    out->is_p2p_supported = 0;
    out->slice_count = p->compute;
    out->instance_count = p->instances;
    out->multiprocessor_count = p->multiprocessors;
    out->copy_engine_count = p->copy_engines;
    out->decoder_count = p->decoders;
    out->encoder_count = p->encoders;
    out->jpeg_count = p->jpegs;
    out->ofa_count = p->ofas;
    out->memory_size_mb = p->memory_mib;
    snprintf(out->name, sizeof(out->name), "MIG %s", p->name);
}

static mock_return gi_profile(mock_device *dev, unsigned int index, const void *out, const mock_mig_profile **p) {
    const mock_mig_table *t;
    mock_mig_state s;
    mock_return ret = mig_gpu(dev, out, 1, &t, &s);
    if (ret != MIG_SUCCESS) {
        return ret;
    }
    if (index >= GI_PROFILE_COUNT) {
        return MIG_ERROR_INVALID_ARGUMENT;
    }
    *p = mock_mig_profile_by_index(t, index);
    return *p == NULL ? MIG_ERROR_NOT_SUPPORTED : MIG_SUCCESS;
}

mock_return nvmlDeviceGetGpuInstanceProfileInfoV(mock_device *dev, unsigned int index, gi_profile_v2 *info) {
    const mock_mig_profile *p;
    mock_return ret = gi_profile(dev, index, info, &p);
    if (ret == MIG_SUCCESS && info->version != GI_INFO_V2_VERSION) {
        ret = MIG_ERROR_ARGUMENT_VERSION_MISMATCH;
    }
    if (ret == MIG_SUCCESS) {
        fill_gi_profile(p, info);
    }
    return ret;
}

mock_return nvmlDeviceGetGpuInstanceProfileInfo(mock_device *dev, unsigned int index, gi_profile_v1 *info) {
    const mock_mig_profile *p;
    gi_profile_v2 full = {.version = GI_INFO_V2_VERSION};
    mock_return ret = gi_profile(dev, index, info, &p);
    if (ret == MIG_SUCCESS) {
        fill_gi_profile(p, &full);
        memcpy(info, &full.id, sizeof(*info)); /* v1 is v2 without version and name */
    }
    return ret;
}

/* The profile of a profile ID on an enabled GPU. */
static mock_return profile_of_id(mock_device *dev, unsigned int id, const void *out, const mock_mig_table **t,
                                 mock_mig_state *s, const mock_mig_profile **p) {
    mock_return ret = mig_gpu(dev, out, 1, t, s);
    if (ret == MIG_SUCCESS && (*p = mock_mig_profile_by_id(*t, id)) == NULL) {
        ret = MIG_ERROR_INVALID_ARGUMENT;
    }
    return ret;
}

mock_return nvmlDeviceGetGpuInstancePossiblePlacements_v2(mock_device *dev, unsigned int id, mig_placement *placements,
                                                          unsigned int *count) {
    const mock_mig_table *t;
    const mock_mig_profile *p;
    mock_mig_state s;
    mock_return ret = profile_of_id(dev, id, count, &t, &s, &p);
    if (ret != MIG_SUCCESS) {
        return ret;
    }
    unsigned int n = 0;
    for (unsigned int start = 0; start < MOCK_MIG_MEMORY_SLICES; start++) {
        n += (p->starts >> start) & 1u;
    }
    if (placements == NULL) {
        *count = n;
        return MIG_SUCCESS;
    }
    if (*count < n) {
        *count = n;
        return MIG_ERROR_INSUFFICIENT_SIZE;
    }
    n = 0;
    for (unsigned int start = 0; start < MOCK_MIG_MEMORY_SLICES; start++) {
        if ((p->starts >> start) & 1u) {
            placements[n++] = (mig_placement){start, p->memory_slices};
        }
    }
    *count = n;
    return MIG_SUCCESS;
}

/* Why a GI of profile p cannot be created at start now (MIG_SUCCESS: it can). */
static mock_return gi_fits(const mock_mig_state *s, const mock_mig_table *t, const mock_mig_profile *p,
                           unsigned int start) {
    unsigned int live = 0;
    for (unsigned int g = 0; g < MOCK_MIG_GI_IDS; g++) {
        live += s->gi[g].used && s->gi[g].profile_id == p->id;
    }
    if (live >= p->instances || mock_mig_overlaps(s, t, start, p->memory_slices) ||
        mock_mig_compute_used(s, t) + p->compute > MOCK_MIG_COMPUTE_SLICES) {
        return MIG_ERROR_INSUFFICIENT_RESOURCES;
    }
    return MIG_SUCCESS;
}

mock_return nvmlDeviceGetGpuInstanceRemainingCapacity(mock_device *dev, unsigned int id, unsigned int *count) {
    const mock_mig_table *t;
    const mock_mig_profile *p;
    mock_mig_state s;
    mock_return ret = profile_of_id(dev, id, count, &t, &s, &p);
    if (ret != MIG_SUCCESS) {
        return ret;
    }
    unsigned int n = 0; /* how many more fit, created one after the other from the top down */
    for (int start = MOCK_MIG_MEMORY_SLICES - 1; start >= 0; start--) {
        if (((p->starts >> start) & 1u) && gi_fits(&s, t, p, (unsigned int)start) == MIG_SUCCESS) {
            int id_of = mock_mig_gi_id((unsigned int)start, p->memory_slices);
            s.gi[id_of] = (mock_mig_gi){.used = 1, .profile_id = p->id, .start = (unsigned int)start};
            n++;
        }
    }
    *count = n;
    return MIG_SUCCESS;
}

typedef struct {
    const mock_mig_table *table;
    const mock_mig_profile *profile;
    int start; /* -1: the first free placement from the top */
    unsigned int gi, serial;
} create_gi_args;

static int create_gi(mock_mig_state *s, void *arg) {
    create_gi_args *a = arg;
    const mock_mig_profile *p = a->profile;
    if (s->current != 1) {
        return MIG_ERROR_NOT_SUPPORTED;
    }
    int start = a->start;
    for (int candidate = MOCK_MIG_MEMORY_SLICES - 1; start < 0 && candidate >= 0; candidate--) {
        if (((p->starts >> candidate) & 1u) && gi_fits(s, a->table, p, (unsigned int)candidate) == MIG_SUCCESS) {
            start = candidate;
        }
    }
    if (start < 0) {
        return MIG_ERROR_INSUFFICIENT_RESOURCES;
    }
    mock_return ret = gi_fits(s, a->table, p, (unsigned int)start);
    if (ret != MIG_SUCCESS) {
        return ret;
    }
    int id = mock_mig_gi_id((unsigned int)start, p->memory_slices);
    s->serial++;
    s->gi[id] = (mock_mig_gi){.used = 1, .profile_id = p->id, .start = (unsigned int)start, .serial = s->serial};
    a->gi = (unsigned int)id;
    a->serial = s->serial;
    return MIG_SUCCESS;
}

static mock_return create(mock_device *dev, unsigned int id, int start, unsigned int size, gi_handle **out) {
    create_gi_args a = {.start = start};
    mock_mig_state s;
    mock_return ret = profile_of_id(dev, id, out, &a.table, &s, &a.profile);
    if (ret != MIG_SUCCESS) {
        return ret;
    }
    if (start >= 0 && (start >= MOCK_MIG_MEMORY_SLICES || !((a.profile->starts >> start) & 1u) ||
                       size != a.profile->memory_slices)) {
        return MIG_ERROR_INVALID_ARGUMENT;
    }
    if (!may_configure()) {
        return MIG_ERROR_NO_PERMISSION;
    }
    ret = mock_mig_update(st(), dev, create_gi, &a);
    if (ret == MIG_SUCCESS) {
        *out = gi_handle_of(gpu_index(dev), a.gi, a.serial);
    }
    return ret;
}

mock_return nvmlDeviceCreateGpuInstance(mock_device *dev, unsigned int id, gi_handle **gi) {
    return create(dev, id, -1, 0, gi);
}

mock_return nvmlDeviceCreateGpuInstanceWithPlacement(mock_device *dev, unsigned int id,
                                                     const mig_placement *placement, gi_handle **gi) {
    if (placement == NULL) {
        return MIG_ERROR_INVALID_ARGUMENT;
    }
    return create(dev, id, (int)placement->start, placement->size, gi);
}

typedef struct {
    unsigned int gi, serial;
} instance_args;

static int destroy_gi(mock_mig_state *s, void *arg) {
    instance_args *a = arg;
    mock_mig_gi *gi = &s->gi[a->gi];
    if (!gi->used || gi->serial != a->serial) {
        return MIG_ERROR_INVALID_ARGUMENT;
    }
    for (unsigned int c = 0; c < MOCK_MIG_CI_IDS; c++) {
        if (gi->ci[c].used) {
            return MIG_ERROR_IN_USE;
        }
    }
    memset(gi, 0, sizeof(*gi));
    return MIG_SUCCESS;
}

mock_return nvmlGpuInstanceDestroy(gi_handle *h) {
    mock_device *dev;
    const mock_mig_table *t;
    mock_mig_state s;
    mock_return ret = live_gi(h, h, &dev, &t, &s);
    if (ret != MIG_SUCCESS) {
        return ret;
    }
    if (!may_configure()) {
        return MIG_ERROR_NO_PERMISSION;
    }
    instance_args a = {h->gi, h->serial};
    return mock_mig_update(st(), dev, destroy_gi, &a);
}

/* The buffer must hold the profile's instance count (nvml.h); `count` says how many were returned. */
mock_return nvmlDeviceGetGpuInstances(mock_device *dev, unsigned int id, gi_handle **out, unsigned int *count) {
    const mock_mig_table *t;
    const mock_mig_profile *p;
    mock_mig_state s;
    mock_return ret = profile_of_id(dev, id, count, &t, &s, &p);
    if (ret != MIG_SUCCESS) {
        return ret;
    }
    if (out == NULL) {
        return MIG_ERROR_INVALID_ARGUMENT;
    }
    unsigned int n = 0;
    for (unsigned int g = 0; g < MOCK_MIG_GI_IDS; g++) {
        if (s.gi[g].used && s.gi[g].profile_id == id) {
            out[n++] = gi_handle_of(gpu_index(dev), g, s.gi[g].serial);
        }
    }
    *count = n;
    return MIG_SUCCESS;
}

mock_return nvmlDeviceGetGpuInstanceById(mock_device *dev, unsigned int id, gi_handle **out) {
    const mock_mig_table *t;
    mock_mig_state s;
    mock_return ret = mig_gpu(dev, out, 1, &t, &s);
    if (ret != MIG_SUCCESS) {
        return ret;
    }
    if (id >= MOCK_MIG_GI_IDS) {
        return MIG_ERROR_INVALID_ARGUMENT;
    }
    if (!s.gi[id].used) {
        return MIG_ERROR_NOT_FOUND;
    }
    *out = gi_handle_of(gpu_index(dev), id, s.gi[id].serial);
    return MIG_SUCCESS;
}

typedef struct {
    mock_device *device;
    unsigned int id, profile_id;
    mig_placement placement;
} gi_info_t; /* nvmlGpuInstanceInfo_t */

mock_return nvmlGpuInstanceGetInfo(gi_handle *h, gi_info_t *info) {
    mock_device *dev;
    const mock_mig_table *t;
    mock_mig_state s;
    mock_return ret = live_gi(h, info, &dev, &t, &s);
    if (ret != MIG_SUCCESS) {
        return ret;
    }
    const mock_mig_profile *p = mock_mig_profile_by_id(t, s.gi[h->gi].profile_id);
    info->device = dev;
    info->id = h->gi;
    info->profile_id = s.gi[h->gi].profile_id;
    info->placement = (mig_placement){s.gi[h->gi].start, p != NULL ? p->memory_slices : 0};
    return MIG_SUCCESS;
}

/* ---- compute instances ---- */

static const char *ci_names[] = {"1c", "2c", "3c", "4c", "7c"};

static mock_return ci_profile(gi_handle *h, unsigned int index, unsigned int engine, const void *out,
                              ci_profile_v2 *info) {
    mock_device *dev;
    const mock_mig_table *t;
    mock_mig_state s;
    mock_return ret = live_gi(h, out, &dev, &t, &s);
    if (ret != MIG_SUCCESS) {
        return ret;
    }
    if (index >= CI_PROFILE_COUNT || engine != 0) {
        return MIG_ERROR_INVALID_ARGUMENT;
    }
    const mock_mig_profile *gi = mock_mig_profile_by_id(t, s.gi[h->gi].profile_id);
    unsigned int slices;
    if (gi == NULL || !mock_mig_ci_profile_valid(index, gi->compute, &slices)) {
        return MIG_ERROR_NOT_SUPPORTED;
    }
    info->id = index;
    info->slice_count = slices;
    info->instance_count = gi->compute / slices;
    info->multiprocessor_count = mock_mig_ci_multiprocessors(t, gi, slices);
    info->shared_copy_engine_count = gi->copy_engines;
    info->shared_decoder_count = gi->decoders;
    info->shared_encoder_count = gi->encoders;
    info->shared_jpeg_count = gi->jpegs;
    info->shared_ofa_count = gi->ofas;
    if (slices == gi->compute) {
        snprintf(info->name, sizeof(info->name), "MIG %s", gi->name);
    } else {
        snprintf(info->name, sizeof(info->name), "MIG %s.%s", ci_names[index], gi->name);
    }
    return MIG_SUCCESS;
}

mock_return nvmlGpuInstanceGetComputeInstanceProfileInfoV(gi_handle *h, unsigned int index, unsigned int engine,
                                                          ci_profile_v2 *info) {
    if (info != NULL && info->version != CI_INFO_V2_VERSION) {
        return MIG_ERROR_ARGUMENT_VERSION_MISMATCH;
    }
    return ci_profile(h, index, engine, info, info);
}

mock_return nvmlGpuInstanceGetComputeInstanceProfileInfo(gi_handle *h, unsigned int index, unsigned int engine,
                                                         ci_profile_v1 *info) {
    ci_profile_v2 full = {.version = CI_INFO_V2_VERSION};
    mock_return ret = ci_profile(h, index, engine, info, &full);
    if (ret == MIG_SUCCESS) {
        memcpy(info, &full.id, sizeof(*info));
    }
    return ret;
}

/* The first start in a GI of `compute` slices where `slices` more fit; -1 when none. */
static int ci_start(const mock_mig_gi *gi, unsigned int compute, unsigned int slices) {
    for (unsigned int start = 0; start + slices <= compute; start += slices) {
        int free_here = 1;
        for (unsigned int c = 0; c < MOCK_MIG_CI_IDS; c++) {
            const mock_mig_ci *ci = &gi->ci[c];
            if (ci->used && ci->start < start + slices && start < ci->start + ci->slices) {
                free_here = 0;
            }
        }
        if (free_here) {
            return (int)start;
        }
    }
    return -1;
}

mock_return nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gi_handle *h, unsigned int index,
                                                               unsigned int *count) {
    ci_profile_v2 info = {.version = CI_INFO_V2_VERSION};
    mock_return ret = ci_profile(h, index, 0, count, &info);
    if (ret != MIG_SUCCESS) {
        return ret;
    }
    mock_device *dev;
    const mock_mig_table *t;
    mock_mig_state s;
    live_gi(h, count, &dev, &t, &s);
    const mock_mig_profile *profile = mock_mig_profile_by_id(t, s.gi[h->gi].profile_id);
    mock_mig_gi gi = s.gi[h->gi]; /* how many more fit, created one after the other */
    unsigned int n = 0;
    for (int start; (start = ci_start(&gi, profile->compute, info.slice_count)) >= 0; n++) {
        gi.ci[start] = (mock_mig_ci){1, index, info.slice_count, (unsigned int)start};
    }
    *count = n;
    return MIG_SUCCESS;
}

typedef struct {
    unsigned int gi, serial, index, slices, compute, ci;
} create_ci_args;

static int create_ci(mock_mig_state *s, void *arg) {
    create_ci_args *a = arg;
    mock_mig_gi *gi = &s->gi[a->gi];
    if (!gi->used || gi->serial != a->serial) {
        return MIG_ERROR_INVALID_ARGUMENT;
    }
    int start = ci_start(gi, a->compute, a->slices);
    if (start < 0 || gi->ci[start].used) {
        return MIG_ERROR_INSUFFICIENT_RESOURCES;
    }
    gi->ci[start] = (mock_mig_ci){1, a->index, a->slices, (unsigned int)start};
    a->ci = (unsigned int)start; /* the CI id is its start in the GI */
    return MIG_SUCCESS;
}

mock_return nvmlGpuInstanceCreateComputeInstance(gi_handle *h, unsigned int index, ci_handle **out) {
    ci_profile_v2 info = {.version = CI_INFO_V2_VERSION};
    mock_return ret = ci_profile(h, index, 0, out, &info);
    if (ret != MIG_SUCCESS) {
        return ret;
    }
    if (!may_configure()) {
        return MIG_ERROR_NO_PERMISSION;
    }
    mock_device *dev;
    const mock_mig_table *t;
    mock_mig_state s;
    live_gi(h, out, &dev, &t, &s);
    const mock_mig_profile *gi = mock_mig_profile_by_id(t, s.gi[h->gi].profile_id);
    create_ci_args a = {h->gi, h->serial, index, info.slice_count, gi->compute, 0};
    ret = mock_mig_update(st(), dev, create_ci, &a);
    if (ret == MIG_SUCCESS) {
        *out = ci_handle_of(h->gpu, h->gi, a.ci, h->serial);
    }
    return ret;
}

/* The CI a handle stands for, checked to be alive. */
static mock_return live_ci(const ci_handle *h, const void *out, mock_device **dev, const mock_mig_table **t,
                           mock_mig_state *s) {
    if (h == NULL || out == NULL || !IN_ARRAY(h, g_ci) ||
        h->gpu >= st()->count) {
        return MIG_ERROR_INVALID_ARGUMENT;
    }
    *dev = (mock_device *)&st()->gpus[h->gpu];
    mock_return ret = mig_gpu(*dev, out, 1, t, s);
    if (ret == MIG_SUCCESS && (!s->gi[h->gi].used || s->gi[h->gi].serial != h->serial ||
                               !s->gi[h->gi].ci[h->ci].used)) {
        ret = MIG_ERROR_INVALID_ARGUMENT;
    }
    return ret;
}

typedef struct {
    unsigned int gi, serial, ci;
} destroy_ci_args;

static int destroy_ci(mock_mig_state *s, void *arg) {
    destroy_ci_args *a = arg;
    mock_mig_gi *gi = &s->gi[a->gi];
    if (!gi->used || gi->serial != a->serial || !gi->ci[a->ci].used) {
        return MIG_ERROR_INVALID_ARGUMENT;
    }
    memset(&gi->ci[a->ci], 0, sizeof(gi->ci[a->ci]));
    return MIG_SUCCESS;
}

mock_return nvmlComputeInstanceDestroy(ci_handle *h) {
    mock_device *dev;
    const mock_mig_table *t;
    mock_mig_state s;
    mock_return ret = live_ci(h, h, &dev, &t, &s);
    if (ret != MIG_SUCCESS) {
        return ret;
    }
    if (!may_configure()) {
        return MIG_ERROR_NO_PERMISSION;
    }
    char uuid[MOCK_MIG_UUID_SIZE];
    mock_mig_uuid(dev->uuid, h->gi, h->ci, h->serial, uuid);
    if (mock_nvml_processes_on(uuid) > 0) {
        return MIG_ERROR_IN_USE;
    }
    destroy_ci_args a = {h->gi, h->serial, h->ci};
    return mock_mig_update(st(), dev, destroy_ci, &a);
}

/* The buffer must hold the profile's instance count (nvml.h); `count` says how many were returned. */
mock_return nvmlGpuInstanceGetComputeInstances(gi_handle *h, unsigned int index, ci_handle **out,
                                               unsigned int *count) {
    mock_device *dev;
    const mock_mig_table *t;
    mock_mig_state s;
    mock_return ret = live_gi(h, count, &dev, &t, &s);
    if (ret != MIG_SUCCESS) {
        return ret;
    }
    if (index >= CI_PROFILE_COUNT || out == NULL) {
        return MIG_ERROR_INVALID_ARGUMENT;
    }
    unsigned int n = 0;
    for (unsigned int c = 0; c < MOCK_MIG_CI_IDS; c++) {
        if (s.gi[h->gi].ci[c].used && s.gi[h->gi].ci[c].profile == index) {
            out[n++] = ci_handle_of(h->gpu, h->gi, c, h->serial);
        }
    }
    *count = n;
    return MIG_SUCCESS;
}

mock_return nvmlGpuInstanceGetComputeInstanceById(gi_handle *h, unsigned int id, ci_handle **out) {
    mock_device *dev;
    const mock_mig_table *t;
    mock_mig_state s;
    mock_return ret = live_gi(h, out, &dev, &t, &s);
    if (ret != MIG_SUCCESS) {
        return ret;
    }
    if (id >= MOCK_MIG_CI_IDS) {
        return MIG_ERROR_INVALID_ARGUMENT;
    }
    if (!s.gi[h->gi].ci[id].used) {
        return MIG_ERROR_NOT_FOUND;
    }
    *out = ci_handle_of(h->gpu, h->gi, id, h->serial);
    return MIG_SUCCESS;
}

typedef struct {
    mock_device *device;
    gi_handle *gpu_instance;
    unsigned int id, profile_id;
    mig_placement placement;
} ci_info_t; /* nvmlComputeInstanceInfo_t */

mock_return nvmlComputeInstanceGetInfo_v2(ci_handle *h, ci_info_t *info) {
    mock_device *dev;
    const mock_mig_table *t;
    mock_mig_state s;
    mock_return ret = live_ci(h, info, &dev, &t, &s);
    if (ret != MIG_SUCCESS) {
        return ret;
    }
    const mock_mig_ci *ci = &s.gi[h->gi].ci[h->ci];
    info->device = dev;
    info->gpu_instance = gi_handle_of(h->gpu, h->gi, h->serial);
    info->id = h->ci;
    info->profile_id = ci->profile;
    info->placement = (mig_placement){ci->start, ci->slices};
    return MIG_SUCCESS;
}

/* ---- MIG devices ---- */

/* The n-th CI (by GI id, then CI id) the process may open; 0 when there are fewer. */
static int nth_visible(const mock_device *dev, const mock_mig_state *s, unsigned int n, unsigned int *gi,
                       unsigned int *ci) {
    for (unsigned int g = 0; g < MOCK_MIG_GI_IDS; g++) {
        for (unsigned int c = 0; s->gi[g].used && c < MOCK_MIG_CI_IDS; c++) {
            if (s->gi[g].ci[c].used && mock_mig_cap_openable(mock_mig_cap_minor(dev->minor, g, -1)) &&
                mock_mig_cap_openable(mock_mig_cap_minor(dev->minor, g, (int)c)) && n-- == 0) {
                *gi = g;
                *ci = c;
                return 1;
            }
        }
    }
    return 0;
}

mock_return nvmlDeviceGetMaxMigDeviceCount(mock_device *dev, unsigned int *count) {
    const mock_mig_table *t = NULL;
    mock_mig_state s;
    mock_return ret = mig_gpu(dev, count, 0, &t, &s);
    if (ret == MIG_ERROR_NOT_SUPPORTED && t == NULL) {
        *count = 0;
        return MIG_SUCCESS;
    }
    if (ret == MIG_SUCCESS) {
        *count = s.current == 1 ? MOCK_MIG_COMPUTE_SLICES : 0;
    }
    return ret;
}

mock_return nvmlDeviceGetMigDeviceHandleByIndex(mock_device *dev, unsigned int index, mig_device **out) {
    const mock_mig_table *t;
    mock_mig_state s;
    mock_return ret = mig_gpu(dev, out, 1, &t, &s);
    unsigned int gi, ci;
    if (ret != MIG_SUCCESS) {
        return ret;
    }
    if (!nth_visible(dev, &s, index, &gi, &ci)) {
        return MIG_ERROR_NOT_FOUND;
    }
    unsigned int g = gpu_index(dev);
    pthread_mutex_lock(&g_handle_lock);
    g_mig[g][gi][ci] = (mig_device){MIG_DEVICE_MAGIC, g, gi, ci, s.gi[gi].serial};
    pthread_mutex_unlock(&g_handle_lock);
    *out = &g_mig[g][gi][ci];
    return MIG_SUCCESS;
}

/* Whether `handle` is a MIG device handle of this library. */
static int is_mig(const void *handle) {
    const mig_device *m = handle;
    return IN_ARRAY(m, g_mig) && m->magic == MIG_DEVICE_MAGIC;
}

/*
 * For mock_nvml.c: when `handle` is a MIG device handle, fills what its calls need and returns 1 with *ret set
 * (MIG_SUCCESS, or INVALID_ARGUMENT for a destroyed instance); returns 0 for any other handle.
 */
MOCK_HIDDEN int mock_nvml_mig_device(const void *handle, mock_return *ret, char *uuid, char *name,
                                     unsigned long long *memory_mib) {
    if (!is_mig(handle)) {
        return 0;
    }
    const mig_device *m = handle;
    const mock_mig_table *t;
    mock_mig_state s;
    mock_device *dev = (mock_device *)&st()->gpus[m->gpu];
    *ret = mig_gpu(dev, handle, 1, &t, &s);
    if (*ret == MIG_SUCCESS && (!s.gi[m->gi].used || s.gi[m->gi].serial != m->serial || !s.gi[m->gi].ci[m->ci].used)) {
        *ret = MIG_ERROR_INVALID_ARGUMENT;
    }
    if (*ret != MIG_SUCCESS) {
        return 1;
    }
    const mock_mig_profile *p = mock_mig_profile_by_id(t, s.gi[m->gi].profile_id);
    if (uuid != NULL) {
        mock_mig_uuid(dev->uuid, m->gi, m->ci, m->serial, uuid);
    }
    if (name != NULL) {
        snprintf(name, MOCK_NAME_SIZE, "%s MIG %s", dev->name, p != NULL ? p->name : "?");
    }
    if (memory_mib != NULL) {
        *memory_mib = p != NULL ? p->memory_mib : 0;
    }
    return 1;
}

mock_return nvmlDeviceIsMigDeviceHandle(const void *handle, unsigned int *is_mig_device) {
    if (is_mig_device == NULL) {
        return MIG_ERROR_INVALID_ARGUMENT;
    }
    if (is_mig(handle)) {
        *is_mig_device = 1;
        return MIG_SUCCESS;
    }
    mock_return ret = mock_nvml_check_device(handle, is_mig_device);
    if (ret == MIG_SUCCESS) {
        *is_mig_device = 0;
    }
    return ret;
}

static mock_return mig_ids(const void *handle, unsigned int *out, int want_ci) {
    mock_return ret;
    if (!mock_nvml_mig_device(handle, &ret, NULL, NULL, NULL)) {
        ret = mock_nvml_check_device(handle, out);
        return ret == MIG_SUCCESS ? MIG_ERROR_NOT_SUPPORTED : ret; /* a GPU handle has no instance ids */
    }
    if (ret == MIG_SUCCESS && out == NULL) {
        ret = MIG_ERROR_INVALID_ARGUMENT;
    }
    if (ret == MIG_SUCCESS) {
        *out = want_ci ? ((const mig_device *)handle)->ci : ((const mig_device *)handle)->gi;
    }
    return ret;
}

mock_return nvmlDeviceGetGpuInstanceId(const void *handle, unsigned int *id) {
    return mig_ids(handle, id, 0);
}

mock_return nvmlDeviceGetComputeInstanceId(const void *handle, unsigned int *id) {
    return mig_ids(handle, id, 1);
}

mock_return nvmlDeviceGetDeviceHandleFromMigDeviceHandle(const void *handle, mock_device **device) {
    mock_return ret;
    if (!mock_nvml_mig_device(handle, &ret, NULL, NULL, NULL)) {
        return MIG_ERROR_INVALID_ARGUMENT;
    }
    if (ret == MIG_SUCCESS && device == NULL) {
        ret = MIG_ERROR_INVALID_ARGUMENT;
    }
    if (ret == MIG_SUCCESS) {
        *device = (mock_device *)&st()->gpus[((const mig_device *)handle)->gpu];
    }
    return ret;
}
