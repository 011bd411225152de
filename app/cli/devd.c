/*
 * kbcl devd — starts, queries or stops a device server (cl/devd/kb_devd.h): a process that
 * keeps an OpenCL device set up (context, built program) so that `kbcl run`, sweeps and every
 * other kbcl process on this machine with --device gpu/cpu/auto use it without their own
 * set-up. Limits: one server per device name and socket folder; the server runs the
 * OpenCL backend only (ref needs no set-up).
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kb_cli.h"
#include "kb_devd.h"
#include "kb_opencl.h"
#include "kb_remote.h"

static volatile sig_atomic_t devd_stop;

static void on_signal(int sig)
{
    (void)sig;
    devd_stop = 1;
}

static void usage_devd(FILE *f)
{
    fputs("usage: kbcl devd [--device gpu|cpu|auto] [--detach] [--idle-exit SECONDS]\n"
          "       kbcl devd --status | --stop [--device gpu|cpu|auto]\n"
          "\n"
          "  Runs a device server: it sets the OpenCL device up once (context, program) and\n"
          "  lends it to every kbcl process of this user that asks for the same device, so\n"
          "  they skip the driver's set-up (docs/phase2.md, \"Device server\").\n"
          "\n"
          "  --device D        the device to serve (default gpu)\n"
          "  --detach          run in the background; returns once the server listens. Its\n"
          "                    lines (refused connections, closed malformed ones) go to\n"
          "                    D.sock.log beside the socket (0600, restarted past 1 MiB)\n"
          "  --idle-exit S     exit after S seconds without sessions (default: never in the\n"
          "                    foreground, 1800 with --detach; 0 = never)\n"
          "  --status          say whether a server for D runs, and what it serves\n"
          "  --stop            ask the server for D to exit (after its open sessions)\n"
          "\n"
          "  Socket: $KBCL_DEVD_DIR/D.sock, else $XDG_RUNTIME_DIR/kbcl/D.sock, else\n"
          "  /tmp/kbcl-devd-$UID/D.sock. KBCL_DEVD=off keeps clients from using a server.\n"
          "  The folder is made 0700; one that is not this user's own directory with no\n"
          "  group or other permission is refused (exit 2, saying which check failed and\n"
          "  the fix), by clients too. The server closes connections of other users'\n"
          "  processes (one line on its stderr with their pid and uid).\n",
          f);
}

typedef struct devd_master {
    kb_backend be;
    const char *log_path; /* detached: the server's log (its stderr is /dev/null); NULL: stderr */
} devd_master;

/* A detached server's log starts over past this size, so a flood of refused connections
 * cannot fill the disk. */
#define DEVD_LOG_MAX ((off_t)1 << 20)

/* The server's lines (refused peers, closed connections): on its stderr in the foreground;
 * detached, appended to log_path (0600, next to the socket in its private folder) with the
 * time, opened per line so that a removed log is made again. */
static void log_line(void *arg, const char *line)
{
    const devd_master *m = arg;
    char stamp[32] = "", buf[512];
    struct stat st;
    struct tm tm;
    time_t now;
    int fd, n;

    if (!m->log_path) {
        fprintf(stderr, "kbcl devd: %s\n", line);
        return;
    }
    fd = open(m->log_path, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return;
    if (fstat(fd, &st) == 0 && st.st_size > DEVD_LOG_MAX)
        (void)!ftruncate(fd, 0);
    now = time(NULL);
    if (localtime_r(&now, &tm))
        strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", &tm);
    n = snprintf(buf, sizeof buf, "%s kbcl devd[%d]: %s\n", stamp, (int)getpid(), line);
    if (n > 0)
        (void)!write(fd, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
    close(fd);
}

static int clone_session(void *arg, kb_backend *out, char *desc, size_t desc_n, kb_errbuf *eb)
{
    devd_master *m = arg;
    return kb_opencl_backend_clone(&m->be, out, desc, desc_n, eb);
}

static int trim_session(void *arg, kb_backend *be)
{
    (void)arg;
    return kb_opencl_backend_trim(be);
}

static int want_of(const char *dev, kb_cl_want *w)
{
    if (!strcmp(dev, "gpu"))
        *w = KB_CL_GPU;
    else if (!strcmp(dev, "cpu"))
        *w = KB_CL_CPU;
    else if (!strcmp(dev, "auto"))
        *w = KB_CL_ANY;
    else
        return -1;
    return 0;
}

/* Sets the device up and serves; `ready` (or -1) hears one byte once listening, or the
 * error text. Returns an exit code. */
static int serve(const char *dev, const char *path, const char *log_path, double idle,
                 int ready)
{
    devd_master m;
    kb_errbuf eb = { { 0 } };
    kb_opencl_setup su;
    char desc[200] = "";
    kb_cl_want w = KB_CL_GPU;
    struct sigaction sa;
    int rc;

    (void)want_of(dev, &w);
    memset(&m, 0, sizeof m);
    m.log_path = log_path;
    kb_opencl_env();
    if ((rc = kb_opencl_backend_create(w, &m.be, desc, sizeof desc, &eb)) != 0)
        goto fail;
    if (kb_opencl_setup_of(&m.be, &su) != 0)
        memset(&su, 0, sizeof su);
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (ready < 0) {
        printf("kbcl devd: serving %s (%s, set-up %.1f ms, program cache %s) at %s, pid %d\n",
               dev, desc, su.total_ms, kb_cl_cache_state_name(su.cache), path, (int)getpid());
        fflush(stdout);
    }
    kb_devd_opts o = { path, dev, desc, &su, clone_session, &m, trim_session, idle, &devd_stop,
                       ready, 0, 0, 0, log_line };
    rc = kb_devd_serve(&o, &eb);
    m.be.ops->destroy(m.be.self);
    if (rc)
        goto fail;
    return 0;
fail:
    if (ready >= 0) {
        (void)!write(ready, eb.msg, strnlen(eb.msg, sizeof eb.msg));
        close(ready);
    } else {
        fprintf(stderr, "kbcl devd: %s\n", eb.msg);
    }
    return rc == KB_ERR_DEVICE ? KBCL_EXIT_DEVICE : KBCL_EXIT_USAGE;
}

/* The options of `kbcl devd`. */
typedef struct devd_args {
    const char *dev;
    int detach, status, stop;
    double idle;          /* --idle-exit seconds; -1 = the default */
} devd_args;

/* Parses the command line into *a. Returns -1 to go on, else the exit code (after --help or
 * a usage error). */
static int parse_args(int argc, char **argv, devd_args *a)
{
    kb_cl_want w;

    for (int i = 0; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "--help") || !strcmp(s, "-h")) {
            usage_devd(stdout);
            return 0;
        } else if (!strcmp(s, "--device") && i + 1 < argc) {
            a->dev = argv[++i];
        } else if (!strcmp(s, "--idle-exit") && i + 1 < argc) {
            char *end;
            a->idle = strtod(argv[++i], &end);
            if (*end || a->idle < 0) {
                fprintf(stderr, "kbcl devd: --idle-exit wants seconds >= 0, got '%s'\n", argv[i]);
                return KBCL_EXIT_USAGE;
            }
        } else if (!strcmp(s, "--detach")) {
            a->detach = 1;
        } else if (!strcmp(s, "--status")) {
            a->status = 1;
        } else if (!strcmp(s, "--stop")) {
            a->stop = 1;
        } else {
            fprintf(stderr, "kbcl devd: unknown option '%s'\n", s);
            usage_devd(stderr);
            return KBCL_EXIT_USAGE;
        }
    }
    if (want_of(a->dev, &w) != 0) {
        fprintf(stderr, "kbcl devd: --device %s: a server serves gpu, cpu or auto\n", a->dev);
        return KBCL_EXIT_USAGE;
    }
    return -1;
}

/* --status (exit 1 when no server runs) or --stop of the server at path. Returns the exit
 * code. */
static int status_or_stop(const devd_args *a, const char *path)
{
    kb_errbuf eb = { { 0 } };
    kb_devd_hello h;
    int rc = kb_remote_hello(path, &h, &eb);

    if (rc == KB_ERR_NOTFOUND) {
        printf("kbcl devd: no server for %s at %s\n", a->dev, path);
        return a->status ? 1 : 0;
    }
    if (rc) {
        fprintf(stderr, "kbcl devd: %s\n", eb.msg);
        return KBCL_EXIT_DEVICE;
    }
    if (a->status) {
        printf("kbcl devd: serving %s (%s) at %s, pid %d, up %.0f s, %u session(s) open\n",
               h.device, h.desc, path, (int)h.pid, h.uptime_s, h.sessions);
        return 0;
    }
    if ((rc = kb_remote_shutdown(path, &eb)) != 0) {
        fprintf(stderr, "kbcl devd: %s\n", eb.msg);
        return KBCL_EXIT_DEVICE;
    }
    printf("kbcl devd: server for %s (pid %d) stops once its sessions end\n", a->dev,
           (int)h.pid);
    return 0;
}

/* That nothing answers at path yet, so a server may listen there. Returns -1 when so, else
 * the exit code, its message printed. */
static int path_free(const char *path)
{
    kb_errbuf eb = { { 0 } };
    kb_devd_hello h;
    int rc = kb_remote_hello(path, &h, &eb);

    if (rc == 0) {
        fprintf(stderr, "kbcl devd: a device server already listens at %s (pid %d; kbcl devd "
                "--stop ends it)\n", path, (int)h.pid);
        return KBCL_EXIT_USAGE;
    }
    if (rc != KB_ERR_NOTFOUND) { /* something else is there, or the path cannot be used */
        fprintf(stderr, "kbcl devd: cannot serve at %s: %s\n", path, eb.msg);
        return KBCL_EXIT_USAGE;
    }
    return -1;
}

/* In the forked child: becomes the detached server, a grandchild of the command (no zombie,
 * no controlling terminal) with /dev/null for stdin, stdout and stderr; ready is the pipe's
 * write end. Does not return. */
static _Noreturn void become_server(const devd_args *a, const char *path,
                                    const char *log_path, int ready)
{
    int nul;

    if (fork() != 0)
        _exit(0);
    setsid();
    nul = open("/dev/null", O_RDWR);
    if (nul >= 0) {
        dup2(nul, 0);
        dup2(nul, 1);
        dup2(nul, 2);
        if (nul > 2)
            close(nul);
    }
    _exit(serve(a->dev, path, log_path, a->idle < 0 ? 1800 : a->idle, ready));
}

/*
 * Starts the server of `a` at path in the background (a grandchild, become_server) and waits
 * until it listens or gives up. Returns 1 when it listens; else 0 with its reason in msg
 * (n bytes), "" when it died without one. log_path receives the server's log's path.
 */
static int start_detached(const devd_args *a, const char *path, char *log_path, size_t log_n,
                          char *msg, size_t n)
{
    ssize_t k, got = 0;
    pid_t pid;
    int p[2];

    snprintf(log_path, log_n, "%s.log", path);
    msg[0] = '\0';
    if (pipe(p) != 0) {
        snprintf(msg, n, "pipe: %s", strerror(errno));
        return 0;
    }
    fflush(stdout);
    fflush(stderr);
    if ((pid = fork()) < 0) {
        snprintf(msg, n, "fork: %s", strerror(errno));
        close(p[0]);
        close(p[1]);
        return 0;
    }
    if (pid == 0) {
        close(p[0]);
        become_server(a, path, log_path, p[1]);
    }
    close(p[1]);
    waitpid(pid, NULL, 0);
    /* one byte 1 once it listens; else its reason, or nothing when it died */
    while ((k = read(p[0], msg + got, n - 1 - (size_t)got)) > 0)
        got += k;
    close(p[0]);
    msg[got > 0 ? got : 0] = '\0';
    return got == 1 && msg[0] == 1;
}

/* --detach: starts the server in the background and returns once it listens (what it serves
 * and its log printed), or with the reason it did not start. Returns the exit code. */
static int detach_server(const devd_args *a, const char *path)
{
    kb_errbuf eb = { { 0 } };
    kb_devd_hello h;
    char log_path[600], msg[600];

    if (start_detached(a, path, log_path, sizeof log_path, msg, sizeof msg)) {
        if (kb_remote_hello(path, &h, &eb) == 0)
            printf("kbcl devd: serving %s (%s, program cache %s) at %s, pid %d; log %s\n",
                   a->dev, h.desc, kb_cl_cache_state_name(h.setup.cache), path, (int)h.pid,
                   log_path);
        else
            printf("kbcl devd: serving %s at %s; log %s\n", a->dev, path, log_path);
        return 0;
    }
    fprintf(stderr, "kbcl devd: %s\n", msg[0] ? msg : "the server exited before listening");
    return KBCL_EXIT_DEVICE;
}

/*
 * Starts a server for `dev` (gpu, cpu or auto) in the background when none listens, so that a
 * --device run, and every run after it, uses a device that is already set up (docs/phase2.md,
 * "Device server"): the server a `kbcl devd --detach` would start, quietly, exiting after
 * KBCL_DEVD_IDLE seconds without sessions (default 600). Returns once it listens, having paid
 * the device's set-up, or at once when one already does, when KBCL_DEVD is off or KBCL_DEVD_AUTO
 * is 0, or when it cannot start (the run then sets the device up itself, as it would have; the
 * reason is in the server's log). Call it before the process has set OpenCL up or started a
 * thread: the server is a forked child.
 */
void kbcl_devd_autostart(const char *dev)
{
    const char *auto_env = getenv("KBCL_DEVD_AUTO"), *idle_env = getenv("KBCL_DEVD_IDLE");
    kb_errbuf eb = { { 0 } };
    kb_devd_hello h;
    char path[200], log_path[600], msg[600];
    devd_args a = { dev, 1, 0, 0, 600 };

    if (!dev || (strcmp(dev, "gpu") && strcmp(dev, "cpu") && strcmp(dev, "auto")) ||
        !kb_devd_enabled() || (auto_env && !strcmp(auto_env, "0")))
        return;
    if (idle_env && *idle_env) {
        char *end;
        double v = strtod(idle_env, &end);
        if (!*end && v >= 0)
            a.idle = v;
    }
    if (kb_devd_socket_path(dev, path, sizeof path, &eb) != 0 ||
        kb_remote_hello(path, &h, &eb) != KB_ERR_NOTFOUND) /* one listens, or cannot here */
        return;
    /* a person at a terminal learns why this run waits: the server sets the device up first,
     * and a driver's first compile of the program on a machine can take a minute or more */
    if (isatty(STDERR_FILENO))
        fprintf(stderr, "kbcl: starting a device server for %s in the background (it sets the "
                "device up once; the first start on a machine compiles the OpenCL program, "
                "which can take a minute); KBCL_DEVD=off runs in this process\n", dev);
    (void)start_detached(&a, path, log_path, sizeof log_path, msg, sizeof msg);
}

int kbcl_cmd_devd(int argc, char **argv)
{
    devd_args a = { "gpu", 0, 0, 0, -1 };
    kb_errbuf eb = { { 0 } };
    char path[200];
    int code;

    if ((code = parse_args(argc, argv, &a)) >= 0)
        return code;
    if (kb_devd_socket_path(a.dev, path, sizeof path, &eb) != 0) {
        fprintf(stderr, "kbcl devd: %s\n", eb.msg);
        return KBCL_EXIT_USAGE;
    }
    if (a.status || a.stop)
        return status_or_stop(&a, path);
    if ((code = path_free(path)) >= 0)
        return code;
    if (!a.detach)
        return serve(a.dev, path, NULL, a.idle < 0 ? 0 : a.idle, -1);
    return detach_server(&a, path);
}
