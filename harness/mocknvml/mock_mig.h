/*
 * fracgpu mock driver: MIG (Multi-Instance GPU), shared by the mock NVML (mock_nvml_mig.c), the mock libcuda
 * (mock_cuda.c) and, through NVML, the mock nvidia-smi. Written from scratch for fracgpu; the profiles are the
 * figures `nvidia-smi mig -lgip` prints for each product (NVIDIA's MIG user guide tables), nothing else of
 * NVIDIA's is used.
 *
 * The model, as the driver behaves:
 *   - a MIG-capable GPU (A100 40GB/80GB, H100 80GB, H200 141GB, told by its name and memory) has 8 memory slices
 *     and 7 compute slices; a GPU instance (GI) of a profile takes `memory_slices` consecutive memory slices at
 *     one of the profile's placement starts and `compute` compute slices; GIs never overlap in memory slices,
 *     their compute slices never exceed 7, and no profile has more live instances than its instance count;
 *   - a GI holds compute instances (CIs); a CI profile is valid in a GI when its slice count is one of 1, 2, 3,
 *     4, 7 and at most the GI's compute slices (not 3 in a 4-slice GI); CIs in a GI never exceed its slices;
 *   - GI ids: one id per possible (start, size) block of memory slices, the upper half of the GPU first, as the
 *     driver's listings show (size 8 -> 0; size 4 -> 1, 2; size 2 -> 3..6; size 1 -> 7..14); CI ids: the CI's
 *     start in the GI's compute slices (the full CI of a GI is CI 0);
 *   - capability minors, as /proc/driver/nvidia-caps/mig-minors lists them: gpu<minor>/gi<g>/access is
 *     3 + 135 * minor + 9 * g, its ci<c>/access one more plus c; the nodes are /dev/nvidia-caps/nvidia-cap<minor>;
 *   - a MIG device (a CI) has the UUID MIG-<hex> derived from its GPU's UUID, GI and CI ids and a serial number
 *     that grows with every GI created on that GPU (a re-created instance is another device).
 *
 * State (MIG mode, GIs, CIs) is the driver's "kernel" state: kept in <state dir>/mig.<GPU UUID> (mock_mps.h says
 * where the state dir is), under an flock of <state dir>/mig.<GPU UUID>.lock, so every process that has the
 * state dir sees the same instances; without a state dir it lives in the process (NVML only). A GPU's MIG mode
 * starts as its profile key gpu.<i>.mig_mode says (disabled, enabled, pending-enable; default disabled).
 */
#ifndef FRACGPU_MOCK_MIG_H
#define FRACGPU_MOCK_MIG_H

#include "mock_profile.h"

#define MOCK_MIG_GI_IDS 15     /* gi0..gi14 */
#define MOCK_MIG_CI_IDS 8      /* ci0..ci7 */
#define MOCK_MIG_MEMORY_SLICES 8
#define MOCK_MIG_COMPUTE_SLICES 7
#define MOCK_MIG_UUID_SIZE 48  /* "MIG-" + 36 + NUL, rounded up */

/* One GPU-instance profile of a product: what nvmlDeviceGetGpuInstanceProfileInfoV reports. */
typedef struct {
    unsigned int index;          /* NVML_GPU_INSTANCE_PROFILE_* passed to GetGpuInstanceProfileInfo */
    unsigned int id;             /* the profile ID (info.id, what CreateGpuInstance takes) */
    const char *name;            /* "1g.10gb" */
    unsigned int compute;        /* compute slices (info.sliceCount) */
    unsigned int memory_slices;  /* the placement size */
    unsigned long long memory_mib;
    unsigned int multiprocessors;
    unsigned int instances;      /* info.instanceCount */
    unsigned int starts;         /* possible placement starts, one bit each */
    unsigned int copy_engines, decoders, encoders, jpegs, ofas;
} mock_mig_profile;

typedef struct {
    const char *product;               /* "H100 80GB" */
    const mock_mig_profile *profiles;
    unsigned int count;
    unsigned int sms_per_slice;        /* a one-slice compute instance's multiprocessors */
} mock_mig_table;

typedef struct {
    int used;
    unsigned int profile; /* NVML_COMPUTE_INSTANCE_PROFILE_* index (= its id) */
    unsigned int slices;
    unsigned int start;
} mock_mig_ci;

typedef struct {
    int used;
    unsigned int profile_id; /* GI profile ID */
    unsigned int start;
    unsigned int serial;
    mock_mig_ci ci[MOCK_MIG_CI_IDS];
} mock_mig_gi;

typedef struct {
    unsigned int current, pending; /* NVML_DEVICE_MIG_DISABLE 0 / ENABLE 1 */
    unsigned int serial;           /* the last GI serial handed out */
    mock_mig_gi gi[MOCK_MIG_GI_IDS];
} mock_mig_state;

/* The MIG table of a GPU, or NULL when the product cannot do MIG. */
MOCK_HIDDEN const mock_mig_table *mock_mig_table_of(const mock_device *d);
MOCK_HIDDEN const mock_mig_profile *mock_mig_profile_by_id(const mock_mig_table *t, unsigned int id);
MOCK_HIDDEN const mock_mig_profile *mock_mig_profile_by_index(const mock_mig_table *t, unsigned int index);

/* The GI id of a (start, size) block (size 1, 2, 4 or 8), or -1 when the block is not aligned. */
MOCK_HIDDEN int mock_mig_gi_id(unsigned int start, unsigned int size);

/* The capability minor of gpu<minor>/gi<gi>/access (ci < 0) or of gpu<minor>/gi<gi>/ci<ci>/access. */
MOCK_HIDDEN unsigned int mock_mig_cap_minor(unsigned int gpu_minor, unsigned int gi, int ci);

/* Whether /dev/nvidia-caps/nvidia-cap<minor> under the device root opens (always, without a device root). */
MOCK_HIDDEN int mock_mig_cap_openable(unsigned int cap_minor);

/* The MIG UUID of a compute instance into out (MOCK_MIG_UUID_SIZE bytes). */
MOCK_HIDDEN void mock_mig_uuid(const char *gpu_uuid, unsigned int gi, unsigned int ci, unsigned int serial, char *out);

/* The SMs of a CI of `slices` in a GI of `profile` (the GI's own for its full CI). */
MOCK_HIDDEN unsigned int mock_mig_ci_multiprocessors(const mock_mig_table *t, const mock_mig_profile *gi,
                                                     unsigned int slices);

/* Whether CI profile `index` (NVML_COMPUTE_INSTANCE_PROFILE_*) exists in a GI of `gi_compute` slices; its slices. */
MOCK_HIDDEN int mock_mig_ci_profile_valid(unsigned int index, unsigned int gi_compute, unsigned int *slices);

/*
 * Reads the GPU's MIG state into *out: the state file when a state dir is configured (a missing file: the
 * profile's initial mode, no instances), else the process's copy. Returns 0 when the file exists but cannot
 * be read or parsed.
 */
MOCK_HIDDEN int mock_mig_load(const mock_state *st, const mock_device *d, mock_mig_state *out);

/*
 * Read-modify-write: takes the GPU's lock, loads the state, calls change(state, arg) and, when it returns
 * 0 (NVML_SUCCESS), writes the state back (atomically). Returns change's result, or 999 (unknown) when the
 * state cannot be read or written.
 */
MOCK_HIDDEN int mock_mig_update(const mock_state *st, const mock_device *d, int (*change)(mock_mig_state *, void *),
                                void *arg);

/* Whether some live GI's memory slices overlap [start, start + size), and the compute slices in use. */
MOCK_HIDDEN int mock_mig_overlaps(const mock_mig_state *s, const mock_mig_table *t, unsigned int start,
                                  unsigned int size);
MOCK_HIDDEN unsigned int mock_mig_compute_used(const mock_mig_state *s, const mock_mig_table *t);

#endif
