/*
 * fracgpu mock driver: MIG profiles, ids, capability minors, UUIDs and the shared state (see mock_mig.h).
 * Written from scratch for fracgpu.
 */
#define _GNU_SOURCE
#include "mock_mig.h"
#include "mock_mps.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

/* Placement starts as bit masks. */
#define STARTS_0_6 0x7Fu
#define STARTS_EVEN 0x55u /* 0, 2, 4, 6 */
#define STARTS_0_2_4 0x15u
#define STARTS_0_4 0x11u
#define STARTS_0 0x01u

/* NVML_GPU_INSTANCE_PROFILE_* indices. */
enum { GI_1 = 0, GI_2 = 1, GI_3 = 2, GI_4 = 3, GI_7 = 4, GI_1_ME = 7, GI_1_DOUBLE = 9 };

/* The tables: `nvidia-smi mig -lgip` of each product (memory in MiB = the GiB it prints * 1024). The H200's
 * 4-slice size is not in the listings at hand and is taken between its 2- and 8-slice sizes. */
static const mock_mig_profile h100_80gb[] = {
    {GI_1, 19, "1g.10gb", 1, 1, 9984, 16, 7, STARTS_0_6, 1, 1, 0, 1, 0},
    {GI_1_ME, 20, "1g.10gb+me", 1, 1, 9984, 16, 1, STARTS_0_6, 1, 1, 0, 1, 1},
    {GI_1_DOUBLE, 15, "1g.20gb", 1, 2, 20096, 26, 4, STARTS_EVEN, 1, 1, 0, 1, 0},
    {GI_2, 14, "2g.20gb", 2, 2, 20096, 32, 3, STARTS_0_2_4, 2, 2, 0, 2, 0},
    {GI_3, 9, "3g.40gb", 3, 4, 40448, 60, 2, STARTS_0_4, 3, 3, 0, 3, 0},
    {GI_4, 5, "4g.40gb", 4, 4, 40448, 64, 1, STARTS_0, 4, 4, 0, 4, 0},
    {GI_7, 0, "7g.80gb", 7, 8, 81152, 132, 1, STARTS_0, 8, 7, 0, 7, 1},
};
static const mock_mig_profile h200_141gb[] = {
    {GI_1, 19, "1g.18gb", 1, 1, 16384, 16, 7, STARTS_0_6, 1, 1, 0, 1, 0},
    {GI_1_ME, 20, "1g.18gb+me", 1, 1, 16384, 16, 1, STARTS_0_6, 1, 1, 0, 1, 1},
    {GI_1_DOUBLE, 15, "1g.35gb", 1, 2, 33280, 26, 4, STARTS_EVEN, 1, 1, 0, 1, 0},
    {GI_2, 14, "2g.35gb", 2, 2, 33280, 32, 3, STARTS_0_2_4, 2, 2, 0, 2, 0},
    {GI_3, 9, "3g.71gb", 3, 4, 66816, 60, 2, STARTS_0_4, 3, 3, 0, 3, 0},
    {GI_4, 5, "4g.71gb", 4, 4, 66816, 64, 1, STARTS_0, 4, 4, 0, 4, 0},
    {GI_7, 0, "7g.141gb", 7, 8, 143360, 132, 1, STARTS_0, 8, 7, 0, 7, 1},
};
static const mock_mig_profile a100_80gb[] = {
    {GI_1, 19, "1g.10gb", 1, 1, 9728, 14, 7, STARTS_0_6, 1, 0, 0, 0, 0},
    {GI_1_ME, 20, "1g.10gb+me", 1, 1, 9728, 14, 1, STARTS_0_6, 1, 1, 0, 1, 1},
    {GI_1_DOUBLE, 15, "1g.20gb", 1, 2, 19968, 14, 4, STARTS_EVEN, 1, 1, 0, 0, 0},
    {GI_2, 14, "2g.20gb", 2, 2, 19968, 28, 3, STARTS_0_2_4, 2, 1, 0, 0, 0},
    {GI_3, 9, "3g.40gb", 3, 4, 40192, 42, 2, STARTS_0_4, 3, 2, 0, 0, 0},
    {GI_4, 5, "4g.40gb", 4, 4, 40192, 56, 1, STARTS_0, 4, 2, 0, 0, 0},
    {GI_7, 0, "7g.80gb", 7, 8, 80896, 98, 1, STARTS_0, 7, 5, 0, 1, 1},
};
static const mock_mig_profile a100_40gb[] = {
    {GI_1, 19, "1g.5gb", 1, 1, 4864, 14, 7, STARTS_0_6, 1, 0, 0, 0, 0},
    {GI_1_ME, 20, "1g.5gb+me", 1, 1, 4864, 14, 1, STARTS_0_6, 1, 1, 0, 1, 1},
    {GI_1_DOUBLE, 15, "1g.10gb", 1, 2, 9984, 14, 4, STARTS_EVEN, 1, 1, 0, 0, 0},
    {GI_2, 14, "2g.10gb", 2, 2, 9984, 28, 3, STARTS_0_2_4, 2, 1, 0, 0, 0},
    {GI_3, 9, "3g.20gb", 3, 4, 20096, 42, 2, STARTS_0_4, 3, 2, 0, 0, 0},
    {GI_4, 5, "4g.20gb", 4, 4, 20096, 56, 1, STARTS_0, 4, 2, 0, 0, 0},
    {GI_7, 0, "7g.40gb", 7, 8, 40448, 98, 1, STARTS_0, 7, 5, 0, 1, 1},
};
#define TABLE(product, rows, sms) {product, rows, sizeof(rows) / sizeof(rows[0]), sms}
static const mock_mig_table tables[] = {
    TABLE("H100 80GB", h100_80gb, 16),
    TABLE("H200 141GB", h200_141gb, 16),
    TABLE("A100 80GB", a100_80gb, 14),
    TABLE("A100 40GB", a100_40gb, 14),
};

const mock_mig_table *mock_mig_table_of(const mock_device *d) {
    if (strstr(d->name, "H200") != NULL) {
        return &tables[1];
    }
    if (strstr(d->name, "H100") != NULL && d->memory_mib >= 70000 && d->memory_mib <= 90000) {
        return &tables[0];
    }
    if (strstr(d->name, "A100") != NULL) {
        return d->memory_mib > 50000 ? &tables[2] : &tables[3];
    }
    return NULL; /* L4, T4, ... and H100 variants of other sizes: no MIG here */
}

const mock_mig_profile *mock_mig_profile_by_id(const mock_mig_table *t, unsigned int id) {
    for (unsigned int i = 0; t != NULL && i < t->count; i++) {
        if (t->profiles[i].id == id) {
            return &t->profiles[i];
        }
    }
    return NULL;
}

const mock_mig_profile *mock_mig_profile_by_index(const mock_mig_table *t, unsigned int index) {
    for (unsigned int i = 0; t != NULL && i < t->count; i++) {
        if (t->profiles[i].index == index) {
            return &t->profiles[i];
        }
    }
    return NULL;
}

int mock_mig_gi_id(unsigned int start, unsigned int size) {
    if ((size != 1 && size != 2 && size != 4 && size != 8) || start % size != 0 || start + size > 8) {
        return -1;
    }
    unsigned int blocks = MOCK_MIG_MEMORY_SLICES / size, block = start / size, half = blocks / 2;
    if (blocks == 1) {
        return 0;
    }
    return (int)(blocks - 1 + (block >= half ? block - half : block + half));
}

unsigned int mock_mig_cap_minor(unsigned int gpu_minor, unsigned int gi, int ci) {
    return 3u + 135u * gpu_minor + 9u * gi + (ci < 0 ? 0u : 1u + (unsigned int)ci);
}

int mock_mig_cap_openable(unsigned int cap_minor) {
    const char *root = getenv(MOCK_DEV_ROOT_ENV);
#ifdef MOCK_EMBEDDED_PROFILE_H
    if (root == NULL || *root == '\0') {
        root = "/";
    }
#endif
    if (root == NULL || *root == '\0') {
        return 1;
    }
    char path[4096];
    size_t len = strlen(root);
    while (len > 1 && root[len - 1] == '/') {
        len--;
    }
    snprintf(path, sizeof(path), "%.*s/dev/nvidia-caps/nvidia-cap%u", (int)len,
             len == 1 && root[0] == '/' ? "" : root, cap_minor);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd >= 0) {
        close(fd);
        return 1;
    }
    return errno == ENXIO;
}

/* 64-bit FNV-1a over a string and some numbers. */
static unsigned long long fnv(const char *s, unsigned int a, unsigned int b, unsigned int c, unsigned long long seed) {
    unsigned long long h = 1469598103934665603ull ^ seed;
    for (; *s; s++) {
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    }
    unsigned int extra[3] = {a, b, c};
    for (int i = 0; i < 3; i++) {
        for (int k = 0; k < 4; k++) {
            h = (h ^ ((extra[i] >> (8 * k)) & 0xffu)) * 1099511628211ull;
        }
    }
    return h;
}

void mock_mig_uuid(const char *gpu_uuid, unsigned int gi, unsigned int ci, unsigned int serial, char *out) {
    unsigned long long hi = fnv(gpu_uuid, gi, ci, serial, 0), lo = fnv(gpu_uuid, gi, ci, serial, 0x9e3779b97f4a7c15ull);
    snprintf(out, MOCK_MIG_UUID_SIZE, "MIG-%08llx-%04llx-%04llx-%04llx-%012llx", hi >> 32, (hi >> 16) & 0xffffull,
             (hi & 0x0fffull) | 0x5000ull, ((lo >> 48) & 0x3fffull) | 0x8000ull, lo & 0xffffffffffffull);
}

unsigned int mock_mig_ci_multiprocessors(const mock_mig_table *t, const mock_mig_profile *gi, unsigned int slices) {
    return slices >= gi->compute ? gi->multiprocessors : t->sms_per_slice * slices;
}

int mock_mig_ci_profile_valid(unsigned int index, unsigned int gi_compute, unsigned int *slices) {
    static const unsigned int by_index[] = {1, 2, 3, 4, 7}; /* NVML_COMPUTE_INSTANCE_PROFILE_{1,2,3,4,7}_SLICE */
    if (index >= sizeof(by_index) / sizeof(by_index[0])) {
        return 0; /* 8_SLICE, 6_SLICE, 1_SLICE_REV1, 7_SLICE_NVL: no such CI on these products */
    }
    unsigned int n = by_index[index];
    if (n > gi_compute || (n == 3 && gi_compute == 4)) {
        return 0;
    }
    *slices = n;
    return 1;
}

int mock_mig_overlaps(const mock_mig_state *s, const mock_mig_table *t, unsigned int start, unsigned int size) {
    for (unsigned int g = 0; g < MOCK_MIG_GI_IDS; g++) {
        const mock_mig_profile *p = s->gi[g].used ? mock_mig_profile_by_id(t, s->gi[g].profile_id) : NULL;
        if (p != NULL && s->gi[g].start < start + size && start < s->gi[g].start + p->memory_slices) {
            return 1;
        }
    }
    return 0;
}

unsigned int mock_mig_compute_used(const mock_mig_state *s, const mock_mig_table *t) {
    unsigned int used = 0;
    for (unsigned int g = 0; g < MOCK_MIG_GI_IDS; g++) {
        const mock_mig_profile *p = s->gi[g].used ? mock_mig_profile_by_id(t, s->gi[g].profile_id) : NULL;
        used += p != NULL ? p->compute : 0;
    }
    return used;
}

/* ---- state: a file per GPU in the state dir, else the process's copy ---- */

static pthread_mutex_t g_mig_lock = PTHREAD_MUTEX_INITIALIZER;
static mock_mig_state g_local[MOCK_MAX_GPUS];
static int g_local_set[MOCK_MAX_GPUS];

static void initial(const mock_device *d, mock_mig_state *out) {
    memset(out, 0, sizeof(*out));
    out->current = d->mig_mode == 1 ? 1u : 0u;
    out->pending = d->mig_mode != 0 ? 1u : 0u; /* pending-enable: current off, pending on */
}

static int parse(FILE *f, mock_mig_state *out) {
    char line[256];
    while (fgets(line, sizeof(line), f) != NULL) {
        unsigned int a, b, c, d, e;
        if (sscanf(line, "mode %u %u", &a, &b) == 2 && a <= 1 && b <= 1) {
            out->current = a;
            out->pending = b;
        } else if (sscanf(line, "serial %u", &a) == 1) {
            out->serial = a;
        } else if (sscanf(line, "gi %u %u %u %u", &a, &b, &c, &d) == 4 && a < MOCK_MIG_GI_IDS) {
            out->gi[a].used = 1;
            out->gi[a].profile_id = b;
            out->gi[a].start = c;
            out->gi[a].serial = d;
        } else if (sscanf(line, "ci %u %u %u %u %u", &a, &b, &c, &d, &e) == 5 && a < MOCK_MIG_GI_IDS &&
                   b < MOCK_MIG_CI_IDS) {
            out->gi[a].ci[b] = (mock_mig_ci){1, c, d, e};
        } else if (line[0] != '\n' && line[0] != '#') {
            return 0;
        }
    }
    return !ferror(f);
}

static int state_path(const mock_state *st, const mock_device *d, const char *suffix, char *buf, size_t size) {
    char kind[16];
    snprintf(kind, sizeof(kind), "mig%s", suffix);
    return mock_state_file(buf, size, st, kind, d->uuid);
}

int mock_mig_load(const mock_state *st, const mock_device *d, mock_mig_state *out) {
    char path[MOCK_LINE_SIZE + MOCK_UUID_SIZE + 32];
    initial(d, out);
    if (!state_path(st, d, "", path, sizeof(path))) {
        unsigned int i = (unsigned int)(d - &st->gpus[0]);
        pthread_mutex_lock(&g_mig_lock);
        if (i < MOCK_MAX_GPUS && g_local_set[i]) {
            *out = g_local[i];
        }
        pthread_mutex_unlock(&g_mig_lock);
        return 1;
    }
    FILE *f = fopen(path, "re");
    if (f == NULL) {
        return errno == ENOENT;
    }
    int ok = parse(f, out);
    fclose(f);
    return ok;
}

static int save(const char *path, const mock_mig_state *s) {
    char tmp[MOCK_LINE_SIZE + MOCK_UUID_SIZE + 64];
    snprintf(tmp, sizeof(tmp), "%s.%ld.tmp", path, (long)getpid());
    FILE *f = fopen(tmp, "we");
    if (f == NULL) {
        return 0;
    }
    fprintf(f, "mode %u %u\nserial %u\n", s->current, s->pending, s->serial);
    for (unsigned int g = 0; g < MOCK_MIG_GI_IDS; g++) {
        if (!s->gi[g].used) {
            continue;
        }
        fprintf(f, "gi %u %u %u %u\n", g, s->gi[g].profile_id, s->gi[g].start, s->gi[g].serial);
        for (unsigned int c = 0; c < MOCK_MIG_CI_IDS; c++) {
            const mock_mig_ci *ci = &s->gi[g].ci[c];
            if (ci->used) {
                fprintf(f, "ci %u %u %u %u %u\n", g, c, ci->profile, ci->slices, ci->start);
            }
        }
    }
    int ok = fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = fclose(f) == 0 && ok && rename(tmp, path) == 0;
    if (!ok) {
        unlink(tmp);
    }
    return ok;
}

int mock_mig_update(const mock_state *st, const mock_device *d, int (*change)(mock_mig_state *, void *), void *arg) {
    char path[MOCK_LINE_SIZE + MOCK_UUID_SIZE + 32], lock[sizeof(path)];
    mock_mig_state s;
    if (!state_path(st, d, "", path, sizeof(path))) {
        unsigned int i = (unsigned int)(d - &st->gpus[0]);
        pthread_mutex_lock(&g_mig_lock);
        if (!g_local_set[i]) {
            initial(d, &g_local[i]);
            g_local_set[i] = 1;
        }
        s = g_local[i];
        int ret = change(&s, arg);
        if (ret == 0) {
            g_local[i] = s;
        }
        pthread_mutex_unlock(&g_mig_lock);
        return ret;
    }
    /* flock excludes every other open of the lock file, threads of this process included */
    state_path(st, d, ".lock", lock, sizeof(lock));
    int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    int ret = 999;
    if (fd >= 0 && flock(fd, LOCK_EX) == 0 && mock_mig_load(st, d, &s)) {
        ret = change(&s, arg);
        if (ret == 0 && !save(path, &s)) {
            ret = 999;
        }
    }
    if (fd >= 0) {
        close(fd); /* releases the flock */
    }
    return ret;
}
