/*
 * fracgpu mock driver: what the mock NVML, the mock libcuda and the mock MPS control daemon
 * (mock_mps_control.c) share: the GPU state kept in files like a kernel driver's, and the MPS wire protocol.
 * Written from scratch for fracgpu; the protocol is the mock's own (the real one is not documented).
 *
 * State directory: FRACGPU_MOCK_NVML_STATE_DIR, else the profile's `state_dir = <path>`; none means no
 * state (compute mode DEFAULT, nvmlDeviceSetComputeMode NOT_SUPPORTED, no MPS server recorded).
 *   <dir>/compute_mode.<uuid>   the GPU's compute mode as a decimal (0 DEFAULT, 2 PROHIBITED,
 *                               3 EXCLUSIVE_PROCESS); missing or unreadable reads as DEFAULT.
 *   <dir>/mps_server.<uuid>     the pid of the MPS server holding the GPU, written by the control daemon
 *                               when it starts a server and removed when the server exits; a pid that
 *                               is not alive counts as no server.
 *
 * MPS protocol: one unix stream socket, <pipe dir>/control (pipe dir: CUDA_MPS_PIPE_DIRECTORY, default
 * /tmp/nvidia-mps); lines of text. The first line of a connection says what it is:
 *   - a control command (see mock_mps_control.c): the daemon writes the reply and closes the connection;
 *   - `hello <pct|-> [<uuid>=<bytes> ...]` from libcuda: the client's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE ('-':
 *     unset) and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT by GPU UUID (only those set). The daemon takes uid and pid
 *     from the socket (SO_PEERCRED) and answers, possibly much later (a queued client, see the daemon),
 *     `ok <server pid> <pct> <uuid>=<bytes> ...` (the effective percentage, and the effective pinned limit of
 *     every GPU it serves, 0 for none) or `err <CUresult> <reason>` (807 server in FAULT, 808 client cap,
 *     805 anything else). The connection then stays open for the process's life; requests and answers:
 *     `alloc <uuid> <bytes>` -> `ok` | `oom` (the GPU's memory across all clients would be exceeded),
 *     `free <uuid> <bytes>` -> `ok`, `info <uuid>` -> `ok <bytes used by all clients>`, `ping` -> `ok`,
 *     `fault <uuid>` -> `ok` (the client had a fatal fault: its server goes to FAULT); any request of a
 *     client that another's fault terminated -> `terminated`.
 *     The daemon closes it when the client's server dies or the daemon quits.
 */
#ifndef FRACGPU_MOCK_MPS_H
#define FRACGPU_MOCK_MPS_H

#include "mock_profile.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>
#include <unistd.h>

#define MOCK_STATE_DIR_ENV "FRACGPU_MOCK_NVML_STATE_DIR"
#define MOCK_MPS_LINE 8192
enum { MOCK_COMPUTE_DEFAULT = 0, MOCK_COMPUTE_EXCLUSIVE_THREAD = 1, MOCK_COMPUTE_PROHIBITED = 2,
       MOCK_COMPUTE_EXCLUSIVE_PROCESS = 3 };

static inline const char *mock_mps_pipe_dir(void) {
    const char *dir = getenv("CUDA_MPS_PIPE_DIRECTORY");
    return dir != NULL && *dir != '\0' ? dir : "/tmp/nvidia-mps";
}

/* The state directory, or NULL when none is configured. */
static inline const char *mock_state_dir(const mock_state *st) {
    const char *dir = getenv(MOCK_STATE_DIR_ENV);
    if (dir != NULL && *dir != '\0') {
        return dir;
    }
    return st->state_dir[0] != '\0' ? st->state_dir : NULL;
}

/* `<dir>/<kind>.<uuid>` into buf; returns 0 when there is no state directory. */
static inline int mock_state_file(char *buf, size_t size, const mock_state *st, const char *kind,
                                  const char *uuid) {
    const char *dir = mock_state_dir(st);
    return dir != NULL && (size_t)snprintf(buf, size, "%s/%s.%s", dir, kind, uuid) < size;
}

/* The decimal number in a state file; returns 0 when it is missing or unreadable. */
static inline int mock_state_read(const mock_state *st, const char *kind, const char *uuid, long *out) {
    char path[MOCK_LINE_SIZE + MOCK_UUID_SIZE + 32];
    if (!mock_state_file(path, sizeof(path), st, kind, uuid)) {
        return 0;
    }
    FILE *f = fopen(path, "re");
    if (f == NULL) {
        return 0;
    }
    int ok = fscanf(f, "%ld", out) == 1;
    fclose(f);
    return ok;
}

static inline int mock_compute_mode(const mock_state *st, const char *uuid) {
    long mode;
    return mock_state_read(st, "compute_mode", uuid, &mode) && mode >= 0 && mode <= 3 ? (int)mode
                                                                                       : MOCK_COMPUTE_DEFAULT;
}

/* Whether a live MPS server holds the GPU. */
static inline int mock_mps_server_holds(const mock_state *st, const char *uuid) {
    long pid;
    return mock_state_read(st, "mps_server", uuid, &pid) && pid > 0 &&
           (kill((pid_t)pid, 0) == 0 || errno == EPERM);
}

/* A connected socket to <pipe dir>/control, or -1. */
static inline int mock_mps_connect(const char *pipe_dir) {
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if ((size_t)snprintf(addr.sun_path, sizeof(addr.sun_path), "%s/control", pipe_dir) >= sizeof(addr.sun_path)) {
        return -1;
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&addr, sizeof(addr)) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* Sends all of s; returns 0 on failure. */
static inline int mock_mps_send(int fd, const char *s) {
    for (size_t len = strlen(s); len > 0;) {
        ssize_t n = send(fd, s, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            return 0;
        }
        s += n;
        len -= (size_t)n;
    }
    return 1;
}

/* Reads one line (without its '\n', blocking); returns 0 on EOF or error before a whole line. */
static inline int mock_mps_recv_line(int fd, char *buf, size_t size) {
    size_t len = 0;
    for (;;) {
        char c;
        ssize_t n = read(fd, &c, 1);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            return 0;
        }
        if (c == '\n') {
            buf[len] = '\0';
            return 1;
        }
        if (len + 1 < size) {
            buf[len++] = c;
        }
    }
}

/* Parses a pinned memory limit as NVIDIA documents it: "an integer followed by a qualifier, either G or M"
 * (nothing else: no MB, no lower case, no bare number). */
static inline int mock_mps_parse_bytes(const char *s, unsigned long long *out) {
    char *end;
    if (*s < '0' || *s > '9') {
        return 0;
    }
    errno = 0;
    unsigned long long n = strtoull(s, &end, 10);
    unsigned long long unit = strcmp(end, "M") == 0 ? 1ull << 20 : strcmp(end, "G") == 0 ? 1ull << 30 : 0;
    if (errno != 0 || unit == 0 || n == 0 || n > (1ull << 30)) {
        return 0;
    }
    *out = n * unit;
    return 1;
}

/* Parses an active thread percentage, 0 < pct <= 100. */
static inline int mock_mps_parse_pct(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !(v > 0.0 && v <= 100.0)) {
        return 0;
    }
    *out = v;
    return 1;
}

#endif
