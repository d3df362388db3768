/*
 * fracgpu mock CUDA MPS: stand-ins for nvidia-cuda-mps-control and nvidia-cuda-mps-server, following the
 * behaviour NVIDIA's MPS documentation describes. Written from scratch for fracgpu; one program, the server
 * when started as `nvidia-cuda-mps-server` (argv[0]'s base name), the control program otherwise.
 *
 *   nvidia-cuda-mps-control -f [-multiuser-server]   control daemon in the foreground, until `quit` or SIGTERM
 *   nvidia-cuda-mps-control -d [-multiuser-server]   the same, daemonized (the parent exits 0 once listening)
 *   nvidia-cuda-mps-control                          control client: one command per stdin line, each reply
 *                                                    to stdout; exit 0, or 1 when no daemon answers
 *
 * Daemon: listens on <CUDA_MPS_PIPE_DIRECTORY, default /tmp/nvidia-mps>/control (directory created 0755,
 * socket 0777; a stale socket is replaced, a live daemon there is an error, exit 1) and appends to
 * <CUDA_MPS_LOG_DIRECTORY, default /var/log/nvidia-mps>/control.log: start, each connection (pid, uid), each
 * server start and exit, quit. It serves the profile's GPUs (mock_profile.h) named by CUDA_VISIBLE_DEVICES
 * (UUIDs or indices, comma-separated, read up to the first one that matches nothing; unset: all); device
 * ordinals in commands are 0..n-1 in that order. Protocol with libcuda: mock_mps.h.
 *
 * Commands (a set prints nothing on success; any error prints one line starting "Error:", the daemon goes on,
 * and the control client still exits 0: a caller must read the reply, not only the exit status):
 *   quit                                            the daemon stops its server, removes its socket, exits
 *   get_server_list                                 the server's pid (one per line; nothing without one)
 *   get_server_status <server pid>                  ACTIVE, or FAULT (see below)
 *   get_client_list <server pid>                    pids of the clients attached to that server
 *   set_default_device_pinned_mem_limit <dev> <v>   v: <n>M or <n>G, as NVIDIA documents (nothing else)
 *   get_default_device_pinned_mem_limit <dev>       e.g. 10240M; 0 when unset (no limit)
 *   set_default_active_thread_percentage <pct>      0 < pct <= 100
 *   get_default_active_thread_percentage            e.g. 30.0; 100.0 when unset
 *   set_device_pinned_mem_limit <pid> <dev> <v>     for the server <pid>: clients attaching later
 *   get_device_pinned_mem_limit <pid> <dev>         that server's own value, printed as the get_default_* do
 *   set_active_thread_percentage <pid> <pct>
 *   get_active_thread_percentage <pid>
 * As NVIDIA documents, the defaults reach only servers started after they are set: a server starts with the
 * defaults of that moment, and only the per-server commands change it afterwards. A client's effective limit
 * is the lower of its server's value and its own environment's: the client can only lower it. Nobody is asked
 * who they are: whoever can connect to the socket commands the daemon (NVIDIA documents no access check).
 *
 * Client cap: a server takes at most 48 clients (16 when a GPU it serves is older than Volta, compute
 * capability below 7.0; FRACGPU_MOCK_MPS_MAX_CLIENTS in the daemon's environment lowers it for tests); the
 * next client gets CUDA_ERROR_MPS_MAX_CLIENTS_REACHED (808) from cuInit.
 * Fault: a client reporting a fatal fault (mock libcuda, FRACGPU_MOCK_CUDA_FAULT) puts its server in FAULT:
 * the other clients attached then are terminated (CUDA_ERROR_MPS_CLIENT_TERMINATED, 809, on their next
 * call) and new clients get CUDA_ERROR_MPS_SERVER_NOT_READY (807) until the faulting client has exited;
 * then the server is ACTIVE again, as NVIDIA documents for Volta MPS.
 *
 * Servers: one at a time. The first client makes the daemon start one (the server runs as root under
 * -multiuser-server, as NVIDIA documents: every client then appears as root to it; otherwise as the client's
 * UID when the daemon is root, else as the daemon's; it records itself in <state dir>/mps_server.<uuid> for each
 * GPU served, see mock_mps.h). The server stays up when its clients leave; it is replaced only for a client
 * of another UID. Without -multiuser-server a client whose UID differs from the server's is queued (its
 * cuInit blocks) until the server has no clients; the daemon then stops that server and starts one for the
 * queued UID (clients of the server's own UID keep being admitted meanwhile). With -multiuser-server one
 * server takes clients of every UID. A server that dies (say SIGKILL) is logged and all its clients'
 * connections are closed; the next client gets a new server. The server process itself only waits for
 * SIGTERM (it is also sent one when the daemon dies).
 *
 * Build: harness/mocknvml/build.sh [outdir]
 */
#define _GNU_SOURCE
#include "mock_mps.h"
#include "mock_profile.h"

#include <fcntl.h>
#include <grp.h>
#include <libgen.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#define MAX_CONNS 128
#define SERVER_NAME "nvidia-cuda-mps-server"
enum { C_FREE, C_NEW, C_CLIENT, C_QUEUED };

typedef struct {
    int fd, kind;
    uid_t uid;
    pid_t pid;
    char buf[MOCK_MPS_LINE];
    size_t len;
    double pct;                                   /* the client's own percentage; 0: unset */
    unsigned long long env_limit[MOCK_MAX_GPUS];  /* the client's own limits by daemon ordinal; 0: unset */
    unsigned long long used[MOCK_MAX_GPUS];       /* its live allocations */
    unsigned long seq;                            /* queue order */
    int terminated;                               /* ended by another client's fault (809 from now on) */
} conn;

static mock_state g_profile;
static unsigned int g_dev[MOCK_MAX_GPUS], g_ndev; /* daemon ordinal -> profile GPU */
static conn g_conns[MAX_CONNS];
static int g_listen = -1, g_signals[2] = {-1, -1}, g_multiuser, g_quit, g_max_clients;
static char g_socket[sizeof(((struct sockaddr_un *)0)->sun_path)];
static char g_log[PATH_MAX];
static unsigned long long g_default_limit[MOCK_MAX_GPUS]; /* 0: unset */
static double g_default_pct;                              /* 0: unset */
static struct {
    pid_t pid;
    uid_t uid;
    unsigned long long limit[MOCK_MAX_GPUS]; /* copied from the defaults when the server starts */
    double pct;
    pid_t fault; /* the client whose fault put the server in FAULT; 0: ACTIVE */
} g_server;
static unsigned long g_seq;

__attribute__((format(printf, 1, 2))) static void logf_(const char *fmt, ...) {
    FILE *f = fopen(g_log, "ae");
    if (f == NULL) {
        return;
    }
    char stamp[32];
    time_t now = time(NULL);
    struct tm tm;
    strftime(stamp, sizeof(stamp), "%Y-%m-%d %H:%M:%S", localtime_r(&now, &tm));
    fprintf(f, "[%s Control %ld] ", stamp, (long)getpid());
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fputc('\n', f);
    fclose(f);
}

static int mkdir_p(const char *path, mode_t mode) {
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof(buf), "%s", path) >= (int)sizeof(buf)) {
        return 0;
    }
    for (char *p = buf + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            mkdir(buf, mode);
            *p = '/';
        }
    }
    return mkdir(buf, mode) == 0 || errno == EEXIST;
}

static unsigned long long lowest(unsigned long long a, unsigned long long b) {
    return a == 0 ? b : b == 0 ? a : a < b ? a : b;
}

static double lowest_pct(double a, double b) {
    return a == 0 ? b : b == 0 ? a : a < b ? a : b;
}

static int find_uuid(const char *uuid, size_t len) {
    for (unsigned int d = 0; d < g_ndev; d++) {
        const char *mine = g_profile.gpus[g_dev[d]].uuid;
        if (strlen(mine) == len && strncmp(mine, uuid, len) == 0) {
            return (int)d;
        }
    }
    return -1;
}

/* The GPUs of CUDA_VISIBLE_DEVICES, in its order. */
static void select_devices(void) {
    const char *visible = getenv("CUDA_VISIBLE_DEVICES");
    if (visible == NULL) {
        for (g_ndev = 0; g_ndev < g_profile.count; g_ndev++) {
            g_dev[g_ndev] = g_ndev;
        }
        return;
    }
    char list[MOCK_LINE_SIZE], *save = NULL;
    snprintf(list, sizeof(list), "%s", visible);
    for (char *item = strtok_r(list, ",", &save); item != NULL; item = strtok_r(NULL, ",", &save)) {
        char *end;
        unsigned long index = strtoul(item, &end, 10);
        int found = -1;
        for (unsigned int i = 0; i < g_profile.count && found < 0; i++) {
            if (strcmp(item, g_profile.gpus[i].uuid) == 0 || (end != item && *end == '\0' && index == i)) {
                found = (int)i;
            }
        }
        if (found < 0) {
            break; /* like CUDA: the list ends at the first entry that matches no GPU */
        }
        g_dev[g_ndev++] = (unsigned int)found;
    }
}

static void state_files(pid_t pid) {
    char path[MOCK_LINE_SIZE + MOCK_UUID_SIZE + 32];
    for (unsigned int d = 0; d < g_ndev; d++) {
        if (!mock_state_file(path, sizeof(path), &g_profile, "mps_server", g_profile.gpus[g_dev[d]].uuid)) {
            return;
        }
        FILE *f = pid > 0 ? fopen(path, "we") : NULL;
        if (f != NULL) {
            fprintf(f, "%ld\n", (long)pid);
            fclose(f);
        } else if (pid == 0) {
            unlink(path);
        }
    }
}

static void drop(conn *c) {
    if (c->kind == C_CLIENT || c->kind == C_QUEUED) {
        logf_("Client %ld (uid %u) disconnected", (long)c->pid, (unsigned)c->uid);
    }
    if (c->kind == C_CLIENT && g_server.fault != 0 && c->pid == g_server.fault) {
        g_server.fault = 0;
        logf_("Server %ld: the faulting client exited; ACTIVE again", (long)g_server.pid);
    }
    close(c->fd);
    c->kind = C_FREE;
}

static void reply(conn *c, const char *text) {
    if (!mock_mps_send(c->fd, text)) {
        drop(c);
    }
}

static int server_clients(void) {
    int n = 0;
    for (int i = 0; i < MAX_CONNS; i++) {
        n += g_conns[i].kind == C_CLIENT;
    }
    return n;
}

/* The server has exited: its record goes, and so do its clients' connections. */
static void server_gone(int status) {
    if (WIFSIGNALED(status)) {
        logf_("Server %ld exited on signal %d", (long)g_server.pid, WTERMSIG(status));
    } else {
        logf_("Server %ld exited with status %d", (long)g_server.pid, WEXITSTATUS(status));
    }
    state_files(0);
    memset(&g_server, 0, sizeof(g_server));
    for (int i = 0; i < MAX_CONNS; i++) {
        if (g_conns[i].kind == C_CLIENT) {
            drop(&g_conns[i]);
        }
    }
}

static void stop_server(void) {
    int status = 0;
    kill(g_server.pid, SIGTERM);
    while (waitpid(g_server.pid, &status, 0) < 0 && errno == EINTR) {
    }
    server_gone(status);
}

static int start_server(uid_t client_uid) {
    uid_t uid = g_multiuser ? 0 : client_uid;
    char self[PATH_MAX], exe[PATH_MAX + 32], uid_text[32], parent[32];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    self[n > 0 ? n : 0] = '\0';
    snprintf(exe, sizeof(exe), "%s/" SERVER_NAME, dirname(self));
    snprintf(uid_text, sizeof(uid_text), "%u", (unsigned)(geteuid() == 0 ? uid : geteuid()));
    snprintf(parent, sizeof(parent), "%ld", (long)getpid());
    pid_t pid = fork();
    if (pid < 0) {
        return 0;
    }
    if (pid == 0) {
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGPIPE, SIG_DFL);
        execl(access(exe, X_OK) == 0 ? exe : "/proc/self/exe", SERVER_NAME, uid_text, parent, (char *)NULL);
        _exit(127);
    }
    memset(&g_server, 0, sizeof(g_server));
    g_server.pid = pid;
    g_server.uid = uid;
    memcpy(g_server.limit, g_default_limit, sizeof(g_server.limit)); /* the defaults reach new servers only */
    g_server.pct = g_default_pct;
    state_files(pid);
    logf_("Starting new server %ld for user %u", (long)pid, (unsigned)uid);
    return 1;
}

static void admit(conn *c) {
    char text[MOCK_MPS_LINE];
    if (g_server.fault != 0) {
        logf_("Client %ld (uid %u) refused: server %ld is in FAULT", (long)c->pid, (unsigned)c->uid,
              (long)g_server.pid);
        reply(c, "err 807 the MPS server is in FAULT\n");
        drop(c);
        return;
    }
    if (server_clients() >= g_max_clients) {
        logf_("Client %ld (uid %u) refused: server %ld has %d clients, the most it takes", (long)c->pid,
              (unsigned)c->uid, (long)g_server.pid, g_max_clients);
        reply(c, "err 808 the MPS server has as many clients as it takes\n");
        drop(c);
        return;
    }
    double pct = lowest_pct(g_server.pct, c->pct);
    size_t len = (size_t)snprintf(text, sizeof(text), "ok %ld %g", (long)g_server.pid, pct == 0 ? 100.0 : pct);
    for (unsigned int d = 0; d < g_ndev && len < sizeof(text); d++) {
        unsigned long long limit = lowest(g_server.limit[d], c->env_limit[d]);
        len += (size_t)snprintf(text + len, sizeof(text) - len, " %s=%llu", g_profile.gpus[g_dev[d]].uuid, limit);
    }
    len = len < sizeof(text) - 1 ? len : sizeof(text) - 2; /* never with 64 GPUs */
    snprintf(text + len, sizeof(text) - len, "\n");
    c->kind = C_CLIENT;
    logf_("Client %ld (uid %u) attached to server %ld", (long)c->pid, (unsigned)c->uid, (long)g_server.pid);
    reply(c, text);
}

/* Admits the queued clients the server can take; replaces an idle server for a queued client of another UID. */
static void schedule(void) {
    for (;;) {
        conn *first = NULL;
        for (int i = 0; i < MAX_CONNS; i++) {
            conn *c = &g_conns[i];
            if (c->kind == C_QUEUED && g_server.pid != 0 && (g_multiuser || c->uid == g_server.uid)) {
                admit(c);
            } else if (c->kind == C_QUEUED && (first == NULL || c->seq < first->seq)) {
                first = c;
            }
        }
        if (first == NULL || (g_server.pid != 0 && server_clients() > 0)) {
            return;
        }
        if (g_server.pid != 0) {
            logf_("Replacing idle server %ld (uid %u) for user %u", (long)g_server.pid, (unsigned)g_server.uid,
                  (unsigned)first->uid);
            stop_server();
        }
        if (!start_server(first->uid)) {
            logf_("Cannot start a server: %s", strerror(errno));
            for (int i = 0; i < MAX_CONNS; i++) {
                if (g_conns[i].kind == C_QUEUED) {
                    reply(&g_conns[i], "err 805 cannot start an MPS server\n");
                    drop(&g_conns[i]);
                }
            }
            return;
        }
    }
}

static void hello(conn *c, char *args) {
    char *save = NULL, *item = strtok_r(args, " ", &save);
    if (item == NULL || strcmp(item, "-") == 0 || !mock_mps_parse_pct(item, &c->pct)) {
        c->pct = 0;
    }
    while ((item = strtok_r(NULL, " ", &save)) != NULL) {
        char *eq = strchr(item, '=');
        int d = eq != NULL ? find_uuid(item, (size_t)(eq - item)) : -1;
        if (d >= 0) {
            c->env_limit[d] = strtoull(eq + 1, NULL, 10);
        }
    }
    logf_("New client %ld (uid %u) connected", (long)c->pid, (unsigned)c->uid);
    if (g_ndev == 0) {
        reply(c, "err 805 no GPU to serve\n");
        drop(c);
        return;
    }
    c->kind = C_QUEUED;
    c->seq = ++g_seq;
    schedule();
}

/* A request of an attached client (mock_mps.h). */
static void request(conn *c, char *line) {
    char uuid[MOCK_UUID_SIZE], text[64] = "err unknown request\n";
    unsigned long long bytes = 0, all = 0;
    int d = -1;
    if (sscanf(line, "%*s %95s", uuid) == 1) {
        d = find_uuid(uuid, strlen(uuid));
    }
    for (int i = 0; d >= 0 && i < MAX_CONNS; i++) {
        all += g_conns[i].kind == C_CLIENT ? g_conns[i].used[d] : 0;
    }
    if (c->terminated) {
        snprintf(text, sizeof(text), "terminated\n");
    } else if (strcmp(line, "ping") == 0) {
        snprintf(text, sizeof(text), "ok\n");
    } else if (strncmp(line, "fault ", 6) == 0) {
        g_server.fault = c->pid;
        logf_("Server %ld: client %ld (uid %u) faulted; server in FAULT until it exits", (long)g_server.pid,
              (long)c->pid, (unsigned)c->uid);
        for (int i = 0; i < MAX_CONNS; i++) {
            if (g_conns[i].kind == C_CLIENT && &g_conns[i] != c) {
                g_conns[i].terminated = 1;
            }
        }
        snprintf(text, sizeof(text), "ok\n");
    } else if (sscanf(line, "alloc %*s %llu", &bytes) == 1) {
        int fits = d < 0 || all + bytes <= g_profile.gpus[g_dev[d]].memory_mib << 20;
        if (fits && d >= 0) {
            c->used[d] += bytes;
        }
        snprintf(text, sizeof(text), fits ? "ok\n" : "oom\n");
    } else if (sscanf(line, "free %*s %llu", &bytes) == 1) {
        if (d >= 0) {
            c->used[d] -= bytes < c->used[d] ? bytes : c->used[d];
        }
        snprintf(text, sizeof(text), "ok\n");
    } else if (strncmp(line, "info ", 5) == 0) {
        snprintf(text, sizeof(text), "ok %llu\n", all);
    }
    reply(c, text);
}

static void print_limit(char *out, size_t size, unsigned long long bytes) {
    if (bytes == 0) {
        snprintf(out, size, "0\n");
    } else {
        snprintf(out, size, "%lluM\n", bytes >> 20);
    }
}

/* A control command; the reply goes into out (empty: nothing to print). */
static void command(char *line, char *out, size_t size) {
    char *argv[5] = {0}, *save = NULL;
    int argc = 0;
    for (char *t = strtok_r(line, " \t", &save); t != NULL; t = strtok_r(NULL, " \t", &save)) {
        if (argc == 5) {
            snprintf(out, size, "Error: too many arguments\n");
            return;
        }
        argv[argc++] = t;
    }
    out[0] = '\0';
    if (argc == 0) {
        return;
    }
    const char *cmd = argv[0];
    char *end = NULL;
    long pid = argc > 1 ? strtol(argv[1], &end, 10) : 0;
    static const char *const server_commands[] = {"get_client_list", "get_server_status", "set_device_pinned_mem_limit",
                                                  "get_device_pinned_mem_limit", "set_active_thread_percentage",
                                                  "get_active_thread_percentage"};
    int per_server = 0;
    for (size_t i = 0; i < sizeof(server_commands) / sizeof(server_commands[0]); i++) {
        per_server |= strcmp(cmd, server_commands[i]) == 0;
    }
    int first = per_server ? 2 : 1; /* index of the first argument after the server pid */
    unsigned long dev = 0;
    unsigned long long bytes = 0;
    double pct = 0;
    int dev_ok = argc > first && sscanf(argv[first], "%lu", &dev) == 1 && dev < g_ndev;
    if (per_server && (argc < 2 || *end != '\0' || pid <= 0 || pid != (long)g_server.pid)) {
        snprintf(out, size, "Error: no server with pid %s\n", argc > 1 ? argv[1] : "(missing)");
    } else if (strcmp(cmd, "quit") == 0 && argc == 1) {
        g_quit = 1;
    } else if (strcmp(cmd, "get_server_list") == 0 && argc == 1) {
        if (g_server.pid != 0) {
            snprintf(out, size, "%ld\n", (long)g_server.pid);
        }
    } else if (strcmp(cmd, "get_server_status") == 0 && argc == 2) {
        snprintf(out, size, "%s\n", g_server.fault != 0 ? "FAULT" : "ACTIVE");
    } else if (strcmp(cmd, "get_client_list") == 0 && argc == 2) {
        size_t len = 0;
        for (int i = 0; i < MAX_CONNS && len < size; i++) {
            if (g_conns[i].kind == C_CLIENT) {
                len += (size_t)snprintf(out + len, size - len, "%ld\n", (long)g_conns[i].pid);
            }
        }
    } else if (strcmp(cmd, "set_default_device_pinned_mem_limit") == 0 && argc == 3 && dev_ok &&
               mock_mps_parse_bytes(argv[2], &bytes)) {
        g_default_limit[dev] = bytes;
    } else if (strcmp(cmd, "get_default_device_pinned_mem_limit") == 0 && argc == 2 && dev_ok) {
        print_limit(out, size, g_default_limit[dev]);
    } else if (strcmp(cmd, "set_device_pinned_mem_limit") == 0 && argc == 4 && dev_ok &&
               mock_mps_parse_bytes(argv[3], &bytes)) {
        g_server.limit[dev] = bytes;
    } else if (strcmp(cmd, "get_device_pinned_mem_limit") == 0 && argc == 3 && dev_ok) {
        print_limit(out, size, g_server.limit[dev]);
    } else if (strcmp(cmd, "set_default_active_thread_percentage") == 0 && argc == 2 &&
               mock_mps_parse_pct(argv[1], &pct)) {
        g_default_pct = pct;
    } else if (strcmp(cmd, "get_default_active_thread_percentage") == 0 && argc == 1) {
        snprintf(out, size, "%.1f\n", g_default_pct == 0 ? 100.0 : g_default_pct);
    } else if (strcmp(cmd, "set_active_thread_percentage") == 0 && argc == 3 && mock_mps_parse_pct(argv[2], &pct)) {
        g_server.pct = pct;
    } else if (strcmp(cmd, "get_active_thread_percentage") == 0 && argc == 2) {
        snprintf(out, size, "%.1f\n", g_server.pct == 0 ? 100.0 : g_server.pct);
    } else {
        snprintf(out, size, "Error: unknown command or bad arguments: %s\n", cmd);
    }
}

/* One line from a connection; returns 0 when the connection is gone. */
static int on_line(conn *c, char *line) {
    if (c->kind == C_CLIENT) {
        request(c, line);
    } else if (c->kind == C_NEW && strncmp(line, "hello ", 6) == 0) {
        hello(c, line + 6);
    } else if (c->kind == C_NEW) {
        static char out[MOCK_MPS_LINE];
        logf_("Control client %ld (uid %u): %s", (long)c->pid, (unsigned)c->uid, line);
        command(line, out, sizeof(out));
        mock_mps_send(c->fd, out);
        drop(c);
    }
    return c->kind != C_FREE;
}

static void on_readable(conn *c) {
    ssize_t n = read(c->fd, c->buf + c->len, sizeof(c->buf) - 1 - c->len);
    if (n <= 0) {
        if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
            int was_client = c->kind == C_CLIENT;
            drop(c);
            if (was_client) {
                schedule();
            }
        }
        return;
    }
    c->len += (size_t)n;
    char *nl;
    while (c->kind != C_FREE && (nl = memchr(c->buf, '\n', c->len)) != NULL) {
        *nl = '\0';
        char line[MOCK_MPS_LINE];
        snprintf(line, sizeof(line), "%s", c->buf);
        c->len -= (size_t)(nl + 1 - c->buf);
        memmove(c->buf, nl + 1, c->len);
        if (!on_line(c, line)) {
            return;
        }
    }
    if (c->len == sizeof(c->buf) - 1) {
        drop(c); /* a line too long for the protocol */
    }
}

static void on_accept(void) {
    int fd = accept4(g_listen, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
        return;
    }
    for (int i = 0; i < MAX_CONNS; i++) {
        conn *c = &g_conns[i];
        if (c->kind == C_FREE) {
            struct ucred cred = {0};
            socklen_t len = sizeof(cred);
            getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len);
            memset(c, 0, sizeof(*c));
            c->fd = fd;
            c->kind = C_NEW;
            c->uid = cred.uid;
            c->pid = cred.pid;
            return;
        }
    }
    close(fd); /* no room */
}

static void on_signal(int sig) {
    unsigned char byte = (unsigned char)sig;
    int saved = errno;
    if (write(g_signals[1], &byte, 1) < 0) {
        /* the pipe is full: a byte is already pending */
    }
    errno = saved;
}

static int daemon_main(int foreground) {
    if (mock_profile_load("fracgpu mock MPS control", &g_profile) != MOCK_PROFILE_OK) {
        return 1;
    }
    select_devices();
    g_max_clients = 48;
    for (unsigned int d = 0; d < g_ndev; d++) {
        if (g_profile.gpus[g_dev[d]].cc_major < 7) {
            g_max_clients = 16; /* pre-Volta */
        }
    }
    const char *cap = getenv("FRACGPU_MOCK_MPS_MAX_CLIENTS");
    if (cap != NULL && atoi(cap) > 0 && atoi(cap) < g_max_clients) {
        g_max_clients = atoi(cap);
    }
    const char *pipe_dir = mock_mps_pipe_dir();
    const char *log_dir = getenv("CUDA_MPS_LOG_DIRECTORY");
    log_dir = log_dir != NULL && *log_dir != '\0' ? log_dir : "/var/log/nvidia-mps";
    if (!mkdir_p(pipe_dir, 0755)) {
        fprintf(stderr, "nvidia-cuda-mps-control: cannot create pipe directory %s: %s\n", pipe_dir, strerror(errno));
        return 1;
    }
    if (!mkdir_p(log_dir, 0755)) {
        fprintf(stderr, "nvidia-cuda-mps-control: cannot create log directory %s: %s\n", log_dir, strerror(errno));
    }
    snprintf(g_log, sizeof(g_log), "%s/control.log", log_dir);
    int other = mock_mps_connect(pipe_dir);
    if (other >= 0) {
        close(other);
        fprintf(stderr, "nvidia-cuda-mps-control: an MPS control daemon is already running at %s/control\n", pipe_dir);
        return 1;
    }
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if ((size_t)snprintf(addr.sun_path, sizeof(addr.sun_path), "%s/control", pipe_dir) >= sizeof(addr.sun_path)) {
        fprintf(stderr, "nvidia-cuda-mps-control: pipe directory path too long: %s\n", pipe_dir);
        return 1;
    }
    snprintf(g_socket, sizeof(g_socket), "%s", addr.sun_path);
    unlink(g_socket); /* stale: nothing answered there */
    g_listen = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (g_listen < 0 || bind(g_listen, (struct sockaddr *)&addr, sizeof(addr)) != 0 || chmod(g_socket, 0777) != 0 ||
        listen(g_listen, 64) != 0) {
        fprintf(stderr, "nvidia-cuda-mps-control: cannot listen on %s: %s\n", g_socket, strerror(errno));
        return 1;
    }
    if (!foreground) {
        pid_t pid = fork();
        if (pid != 0) {
            return pid < 0 ? 1 : 0; /* the socket is listening */
        }
        setsid();
        int null = open("/dev/null", O_RDWR);
        for (int fd = 0; fd < 3 && null >= 0; fd++) {
            dup2(null, fd);
        }
        if (null > 2) {
            close(null);
        }
    }
    if (pipe2(g_signals, O_CLOEXEC | O_NONBLOCK) != 0) {
        return 1;
    }
    struct sigaction sa = {.sa_handler = on_signal, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGCHLD, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    logf_("Starting control daemon (%s), %u GPU(s), pipe directory %s", g_multiuser ? "multiuser" : "legacy",
          g_ndev, pipe_dir);
    while (!g_quit) {
        struct pollfd fds[MAX_CONNS + 2];
        int slot[MAX_CONNS + 2], n = 0;
        fds[n++] = (struct pollfd){.fd = g_signals[0], .events = POLLIN};
        fds[n++] = (struct pollfd){.fd = g_listen, .events = POLLIN};
        for (int i = 0; i < MAX_CONNS; i++) {
            if (g_conns[i].kind != C_FREE) {
                slot[n] = i;
                fds[n++] = (struct pollfd){.fd = g_conns[i].fd, .events = POLLIN};
            }
        }
        if (poll(fds, (nfds_t)n, -1) < 0) {
            continue;
        }
        if (fds[0].revents) {
            unsigned char sig;
            while (read(g_signals[0], &sig, 1) == 1) {
                g_quit |= sig == SIGTERM || sig == SIGINT;
            }
            int status;
            pid_t pid;
            while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
                if (pid == g_server.pid) {
                    server_gone(status);
                }
            }
        }
        for (int k = 2; k < n; k++) {
            if (fds[k].revents && g_conns[slot[k]].kind != C_FREE && g_conns[slot[k]].fd == fds[k].fd) {
                on_readable(&g_conns[slot[k]]);
            }
        }
        if (fds[1].revents) {
            on_accept();
        }
        schedule();
    }
    logf_("Quitting");
    if (g_server.pid != 0) {
        stop_server();
    }
    for (int i = 0; i < MAX_CONNS; i++) {
        if (g_conns[i].kind != C_FREE) {
            drop(&g_conns[i]);
        }
    }
    unlink(g_socket);
    close(g_listen);
    return 0;
}

/* The control client: each stdin line to the daemon, its reply to stdout. */
static int client_main(void) {
    const char *pipe_dir = mock_mps_pipe_dir();
    int fd = mock_mps_connect(pipe_dir); /* the first command's connection: fail early without a daemon */
    char line[MOCK_MPS_LINE], out[4096];
    if (fd < 0) {
        fprintf(stderr, "Cannot find MPS control daemon process (no answer at %s/control)\n", pipe_dir);
        return 1;
    }
    while (fgets(line, sizeof(line) - 1, stdin) != NULL) {
        line[strcspn(line, "\r\n")] = '\0';
        if (line[strspn(line, " \t")] == '\0') {
            continue;
        }
        if (fd < 0 && (fd = mock_mps_connect(pipe_dir)) < 0) {
            fprintf(stderr, "Cannot find MPS control daemon process (no answer at %s/control)\n", pipe_dir);
            return 1;
        }
        strcat(line, "\n");
        mock_mps_send(fd, line);
        shutdown(fd, SHUT_WR);
        ssize_t n;
        while ((n = read(fd, out, sizeof(out))) > 0 || (n < 0 && errno == EINTR)) {
            fwrite(out, 1, n > 0 ? (size_t)n : 0, stdout);
        }
        fflush(stdout);
        close(fd);
        fd = -1;
    }
    if (fd >= 0) {
        close(fd);
    }
    return 0;
}

/* The server: runs as the client's UID (argv[1], when started as root) until SIGTERM or its daemon's death. */
static int server_main(int argc, char **argv) {
    prctl(PR_SET_NAME, SERVER_NAME); /* comm keeps 15 characters, as for the real server */
    if (argc > 1 && geteuid() == 0) {
        uid_t uid = (uid_t)strtoul(argv[1], NULL, 10);
        if (setgroups(0, NULL) != 0 || setgid((gid_t)uid) != 0 || setuid(uid) != 0) {
            perror(SERVER_NAME ": cannot switch user");
            return 1;
        }
    }
    prctl(PR_SET_PDEATHSIG, SIGTERM); /* after setuid, which clears it */
    if (argc > 2 && getppid() != (pid_t)strtol(argv[2], NULL, 10)) {
        return 0; /* the daemon is already gone */
    }
    for (;;) {
        pause();
    }
}

int main(int argc, char **argv) {
    char name[PATH_MAX];
    snprintf(name, sizeof(name), "%s", argv[0]);
    if (strcmp(basename(name), SERVER_NAME) == 0) {
        return server_main(argc, argv);
    }
    int daemonize = 0, foreground = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-d") == 0) {
            daemonize = 1;
        } else if (strcmp(argv[i], "-f") == 0) {
            foreground = 1;
        } else if (strcmp(argv[i], "-multiuser-server") == 0) {
            g_multiuser = 1;
        } else {
            fprintf(stderr, "usage: %s [-d | -f] [-multiuser-server]   (no option: control client on stdin)\n",
                    argv[0]);
            return 2;
        }
    }
    if (daemonize || foreground) {
        return daemon_main(foreground);
    }
    return client_main();
}
