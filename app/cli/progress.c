/*
 * kbcl run's live progress line: a thread that, from 1 s into the run on, redraws one line on
 * stderr four times a second from what the run publishes into a kb_progress (kb_progress.h),
 * and clears it when the run ends, before kbcl prints anything else.
 *
 * Why a thread: the run's own thread is inside the event loop, a blocking flush or
 * clBuildProgram for seconds at a time, and must not read a clock per event; the ticker reads
 * relaxed counters and costs the run nothing but those publications. Only the ticker writes
 * to the terminal while it runs, and kbcl_ticker_stop joins it, so the line never interleaves
 * with the results (stdout, --json and traces are not touched at all).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "kb_cli.h"
#include "kb_progress.h"

#define KBCL_TICK_MS 250

struct kbcl_ticker {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;              /* under mu */
    int shown;             /* a line is on the terminal (ticker thread only) */
    int fd;
    double t0, delay_s;    /* CLOCK_MONOTONIC seconds */
    kb_progress *p;
};

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void kbcl_fmt_dur(char *b, size_t n, double s)
{
    long t = s > 0 ? (long)(s + 0.5) : 0;
    if (t >= 3600)
        snprintf(b, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(b, n, "%ld:%02ld", t / 60, t % 60);
}

int kbcl_progress_wanted(int quiet, const char *env, int stderr_is_tty)
{
    if (quiet)
        return 0;
    if (env && !strcmp(env, "0"))
        return 0;
    if (env && !strcmp(env, "1"))
        return 1;
    return stderr_is_tty != 0;
}

/* Simulated time with a unit that keeps 4-7 significant digits. */
static void fmt_sim(char *b, size_t n, int64_t ps)
{
    double t = (double)ps;
    if (t < 1e6)
        snprintf(b, n, "%.3f ns", t / 1e3);
    else if (t < 1e9)
        snprintf(b, n, "%.3f us", t / 1e6);
    else if (t < 1e12)
        snprintf(b, n, "%.3f ms", t / 1e9);
    else
        snprintf(b, n, "%.3f s", t / 1e12);
}

static void fmt_count(char *b, size_t n, uint64_t v)
{
    if (v < 10000)
        snprintf(b, n, "%llu", (unsigned long long)v);
    else if (v < 999950) /* what would print as 1000.0 k prints as 1.0 M */
        snprintf(b, n, "%.1f k", (double)v / 1e3);
    else if (v < UINT64_C(999950000))
        snprintf(b, n, "%.1f M", (double)v / 1e6);
    else
        snprintf(b, n, "%.1f G", (double)v / 1e9);
}

static const char *device_stage(int d)
{
    switch (d) {
    case KB_PROGRESS_DEV_SETUP: return "setting up the OpenCL device";
    case KB_PROGRESS_DEV_BUILD: return "building OpenCL program";
    case KB_PROGRESS_DEV_LOAD: return "loading the cached OpenCL program";
    default: return NULL;
    }
}

size_t kbcl_progress_format(char *buf, size_t n, kb_progress *p, double elapsed_s)
{
    char el[32], a[32], b[32];
    int phase = atomic_load_explicit(&p->phase, memory_order_relaxed);
    const char *dev = device_stage(atomic_load_explicit(&p->device, memory_order_relaxed));
    int len;

    if (!n)
        return 0;
    kbcl_fmt_dur(el, sizeof el, elapsed_s);
    len = snprintf(buf, n, "kbcl run [%s] ", el);
    if (len < 0 || (size_t)len >= n)
        return strlen(buf);
    char *s = buf + len;
    size_t m = n - (size_t)len;
    switch (phase) {
    case KB_PROGRESS_PHASE1:
        fmt_sim(a, sizeof a, atomic_load_explicit(&p->sim_now, memory_order_relaxed));
        fmt_count(b, sizeof b, atomic_load_explicit(&p->events, memory_order_relaxed));
        /* the device set-up overlaps the simulation: say so while it lasts */
        snprintf(s, m, "phase 1: %s simulated, %s events%s%s", a, b, dev ? "; " : "",
                 dev ? dev : "");
        break;
    case KB_PROGRESS_DEVICE_WAIT:
        snprintf(s, m, "waiting for the Phase-2 device: %s", dev ? dev : "setting it up");
        break;
    case KB_PROGRESS_REPLAY: {
        uint64_t f = atomic_load_explicit(&p->flushes, memory_order_relaxed);
        uint64_t r = atomic_load_explicit(&p->flush_records, memory_order_relaxed);
        uint64_t nb = atomic_load_explicit(&p->batches, memory_order_relaxed);
        uint64_t done = atomic_load_explicit(&p->batches_done, memory_order_relaxed);
        fmt_count(a, sizeof a, r);
        if (!nb)
            snprintf(s, m, "phase 2: replay flush %llu (%s records): planning",
                     (unsigned long long)f, a);
        else if (done < nb)
            snprintf(s, m, "phase 2: replay flush %llu (%s records): batch %llu/%llu",
                     (unsigned long long)f, a, (unsigned long long)done + 1,
                     (unsigned long long)nb);
        else
            snprintf(s, m, "phase 2: replay flush %llu (%s records): finishing",
                     (unsigned long long)f, a);
        break;
    }
    case KB_PROGRESS_VERIFY:
        snprintf(s, m, "verifying the outputs");
        break;
    default:
        snprintf(s, m, "setting up the run%s%s", dev ? "; " : "", dev ? dev : "");
        break;
    }
    return strlen(buf);
}

/* One redraw: carriage return, the line cut to the terminal's width (a wrapped line would
 * leave a copy behind at every redraw), clear to the end of the line. */
static void draw(struct kbcl_ticker *t)
{
    char line[512], out[600];
    struct winsize ws;
    size_t cols = 80, len;

    if (ioctl(t->fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 1)
        cols = ws.ws_col;
    len = kbcl_progress_format(line, sizeof line, t->p, mono_s() - t->t0);
    if (len > cols - 1)
        len = cols - 1;
    int w = snprintf(out, sizeof out, "\r%.*s\033[K", (int)len, line);
    if (w > 0 && kbcl_write_all(t->fd, out, (size_t)w) == 0)
        t->shown = 1;
}

/* CLOCK_MONOTONIC now + s, for pthread_cond_timedwait. */
static struct timespec deadline_in(double s)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    long ns = ts.tv_nsec + (long)((s - (double)(time_t)s) * 1e9);
    ts.tv_sec += (time_t)s + ns / 1000000000L;
    ts.tv_nsec = ns % 1000000000L;
    return ts;
}

static void *ticker_main(void *arg)
{
    struct kbcl_ticker *t = arg;
    struct timespec due = deadline_in(t->delay_s);

    pthread_mutex_lock(&t->mu);
    while (!t->stop) {
        int rc = pthread_cond_timedwait(&t->cv, &t->mu, &due);
        if (t->stop)
            break;
        if (rc != ETIMEDOUT)
            continue; /* spurious: the same deadline */
        pthread_mutex_unlock(&t->mu);
        draw(t);
        /* from now, not from the last deadline: a descheduled ticker does not catch up */
        due = deadline_in(KBCL_TICK_MS / 1000.0);
        pthread_mutex_lock(&t->mu);
    }
    pthread_mutex_unlock(&t->mu);
    if (t->shown) {
        static const char clear[] = "\r\033[K";
        (void)kbcl_write_all(t->fd, clear, sizeof clear - 1);
    }
    return NULL;
}

int kbcl_ticker_start(kbcl_ticker **out, kb_progress *p, int fd, double delay_s)
{
    struct kbcl_ticker *t = calloc(1, sizeof *t);
    pthread_condattr_t ca;

    *out = NULL;
    if (!t)
        return KB_ERR_NOMEM;
    t->p = p;
    t->fd = fd;
    t->delay_s = delay_s > 0 ? delay_s : 0;
    t->t0 = mono_s();
    if (pthread_condattr_init(&ca) != 0) {
        free(t);
        return KB_ERR_NOMEM;
    }
    /* deadlines on the monotonic clock: a change of the wall clock must not stall the line */
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int ok = pthread_cond_init(&t->cv, &ca) == 0;
    pthread_condattr_destroy(&ca);
    if (!ok) {
        free(t);
        return KB_ERR_NOMEM;
    }
    pthread_mutex_init(&t->mu, NULL);
    if (pthread_create(&t->th, NULL, ticker_main, t) != 0) {
        pthread_cond_destroy(&t->cv);
        pthread_mutex_destroy(&t->mu);
        free(t);
        return KB_ERR_NOMEM;
    }
    *out = t;
    return 0;
}

void kbcl_ticker_stop(kbcl_ticker *t)
{
    if (!t)
        return;
    pthread_mutex_lock(&t->mu);
    t->stop = 1;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
    pthread_join(t->th, NULL);
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
    free(t);
}
