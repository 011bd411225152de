/*
 * sweep_run — runs the points of `kbcl sweep` on this machine. Each point runs in a forked
 * worker process (--jobs N at a time) that sends its outcome back over a pipe, so a crashing
 * point becomes an error row instead of ending the sweep; points on an OpenCL device go to
 * device workers instead, which stay and keep their Phase-2 backend (context, program) from
 * point to point, reading point numbers from a command pipe. SIGINT, SIGTERM and SIGHUP are
 * read from a signalfd in the poll loop and stop the sweep (128+N). It also keeps the
 * progress line and its ETA, and turns each outcome into a row (sweep_out.c) the moment it
 * arrives. Limits: an outcome is one atomic pipe write (under PIPE_BUF); a point interrupted
 * by a signal leaves no row and runs again on --resume.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kb_sweep_int.h"
#include "kb_devd.h"

/* ---------------------------------------------------------------- running a point ----- */

/* Runs one point; be (may be NULL) is a backend kept across points, desc its name. */
static void run_point_on(const sw_plan *p, int point, sw_outcome *o, const kb_backend *be,
                         const char *desc)
{
    kbcl_job job;
    kbcl_result *res = calloc(1, sizeof *res);
    kb_errbuf eb = { { 0 } };
    int rc;

    memset(o, 0, sizeof *o);
    o->point = point;
    o->verified = -1;
    if (!res) {
        o->rc = KB_ERR_NOMEM;
        snprintf(o->msg, sizeof o->msg, "out of memory");
        return;
    }
    kbcl_sweep_point_job(p, point, &job);
    job.backend = be;
    job.backend_desc = desc;
    rc = kbcl_job_run(&job, res, &eb);
    o->rc = rc;
    if (rc) {
        snprintf(o->msg, sizeof o->msg, "%s", eb.msg[0] ? eb.msg : kb_strerror(rc));
    } else {
        const kb_run_report *rep = &res->rep;
        o->verified = rep->res.verified;
        o->sim_time_ns = rep->sim_time_ns;
        o->events = (unsigned long long)rep->events;
        o->wall_ms = rep->wall_ms;
        for (int i = 0; i < rep->res.nextras; i++) {
            if (!strcmp(rep->res.extras[i].name, "size_bytes"))
                o->have_size = 1, o->size_bytes = rep->res.extras[i].value;
            if (!strcmp(rep->res.extras[i].name, "algbw_gbps"))
                o->have_algbw = 1, o->algbw = rep->res.extras[i].value;
            if (!strcmp(rep->res.extras[i].name, "busbw_gbps"))
                o->have_busbw = 1, o->busbw = rep->res.extras[i].value;
            for (int k = 0; k < SW_NSPLIT; k++)
                if (!strcmp(rep->res.extras[i].name, kbcl_sweep_split_cols[k]))
                    o->have_split = 1, o->split[k] = rep->res.extras[i].value;
        }
        /* the same test and numbers as `kbcl run --json` (kb_cli.c): a bound exactly when it
         * names its resource */
        if (rep->res.bound_resource[0]) {
            o->have_bound = 1;
            o->bound_ns = rep->res.bound_ns;
            o->efficiency = kb_bench_efficiency(&rep->res);
            snprintf(o->bound_resource, sizeof o->bound_resource, "%s",
                     rep->res.bound_resource);
        }
        if (rep->res.have_roofline) {
            o->have_roofline = 1;
            o->roofline_ns = rep->res.roofline.ns;
            o->roofline_efficiency = kb_bench_roofline_efficiency(&rep->res);
            snprintf(o->roofline_bound, sizeof o->roofline_bound, "%s",
                     kb_roofline_bound_name(rep->res.roofline.bound));
        }
        if (rep->res.verified == 0)
            snprintf(o->msg, sizeof o->msg, "%s", rep->res.detail);
    }
    for (char *c = o->msg; *c; c++) /* rows are single lines */
        if (*c == '\n' || *c == '\r' || *c == '\t')
            *c = ' ';
    for (char *c = o->bound_resource; *c; c++)
        if (*c == '\n' || *c == '\r' || *c == '\t')
            *c = ' ';
    kbcl_result_fini(res);
    free(res);
}

static void run_point(const sw_plan *p, int point, sw_outcome *o)
{
    run_point_on(p, point, o, NULL, NULL);
}

void kbcl_sweep_run_point_cb(void *ctx, int point, void *outcome)
{
    run_point(((sw_ctx *)ctx)->plan, point, outcome);
}

/* ---------------------------------------------------------------- progress ------------ */

double kbcl_sweep_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double kbcl_sweep_eta(int not_started, int jobs, int nmeasured, double measured_s,
                      const double *running_s, int nrunning)
{
    double mean, work, longest = 0.0, eta;
    if (nmeasured <= 0)
        return -1.0;
    mean = measured_s / nmeasured;
    work = not_started > 0 ? not_started * mean : 0.0;
    for (int i = 0; i < nrunning; i++) {
        double left = mean - running_s[i];
        if (left > 0) {
            work += left;
            if (left > longest)
                longest = left;
        }
    }
    if (not_started <= 0 && nrunning > 0 && longest <= 0)
        return -1.0;
    eta = work / (jobs > 0 ? jobs : 1);
    if (longest > eta)
        eta = longest;
    if (not_started > 0 && mean > eta) /* a waiting point takes a mean of its own */
        eta = mean;
    return eta;
}

static void sweep_worker_times(const sw_ctx *c, double now, double *running, int *n,
                               double *longest);

void kbcl_sweep_progress_bar(sw_ctx *c)
{
    int total = c->plan->npoints, done = c->ndone_before + c->nfinished, width = 30;
    int fill = total ? (int)((long long)done * width / total) : width;
    double now = kbcl_sweep_now_s(), el = now - c->t0, longest = 0.0, eta;
    double running[SW_MAX_JOBS];
    int nrunning = 0, left = c->npending - c->nfinished;
    char bar[64], e1[32], e2[64], e3[32];
    for (int i = 0; i < width; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[width] = 0;
    kbcl_fmt_dur(e1, sizeof e1, el);
    sweep_worker_times(c, now, running, &nrunning, &longest);
    eta = kbcl_sweep_eta(left - nrunning, c->slots, c->nmeasured, c->measured_s, running,
                         nrunning);
    /* rounded up: a point still running never shows 0:00 */
    if (eta >= 0 && left > 0 && eta < 1.0)
        eta = 1.0;
    if (eta >= 0) {
        kbcl_fmt_dur(e2, sizeof e2, eta);
    } else if (nrunning > 0) {
        kbcl_fmt_dur(e3, sizeof e3, longest);
        snprintf(e2, sizeof e2, "? (a point running for %s)", e3);
    } else {
        snprintf(e2, sizeof e2, "?");
    }
    fprintf(stderr, "\r\033[K[%s] %d/%d %3d%%  elapsed %s  ETA %s", bar, done, total,
            total ? done * 100 / total : 100, e1, e2);
    fflush(stderr);
    c->bar_shown = 1;
}

void kbcl_sweep_progress_clear(sw_ctx *c)
{
    if (c->bar_shown) {
        fputs("\r\033[K", stderr);
        c->bar_shown = 0;
    }
}

static void describe_point(const sw_ctx *c, int point, char *b, size_t n)
{
    size_t len = 0;
    b[0] = 0;
    for (int a = 0; a < c->plan->nax && len < n; a++)
        len += (size_t)snprintf(b + len, n - len, "%s%s=%s", a ? " " : "", c->plan->ax[a].name,
                                kbcl_sweep_point_val(c->plan, point, a));
}

static void progress_point(sw_ctx *c, const sw_outcome *o)
{
    char what[512];
    int failed = o->rc != 0 || o->verified == 0;
    if (c->quiet)
        return;
    describe_point(c, o->point, what, sizeof what);
    if (c->tty && !failed) {
        kbcl_sweep_progress_bar(c);
        return;
    }
    kbcl_sweep_progress_clear(c);
    if (o->rc)
        fprintf(stderr, "[%d/%d] point %d %s: %s: %s\n", c->ndone_before + c->nfinished,
                c->plan->npoints, o->point, what, kbcl_sweep_status_name(o->rc), o->msg);
    else
        fprintf(stderr, "[%d/%d] point %d %s: %s %.6g ns (%.2f s)\n",
                c->ndone_before + c->nfinished, c->plan->npoints, o->point, what,
                o->verified == 1 ? "verified" : o->verified == 0 ? "VERIFICATION FAILED"
                                                                 : "ok",
                o->sim_time_ns, o->wall_ms / 1000.0);
    if (c->tty)
        kbcl_sweep_progress_bar(c);
}

/* Records one finished point: its row goes to the output at once. */
int kbcl_sweep_finish_point(void *ctx, const void *outcome)
{
    sw_ctx *c = ctx;
    const sw_outcome *o = outcome;
    char *row;

    assert(o->point >= 0 && o->point < c->plan->npoints);
    c->nfinished++;
    if (o->wall_ms > 0) { /* a crashed worker's point has no time of its own */
        c->nmeasured++;
        c->measured_s += o->wall_ms / 1000.0;
    }
    if (o->rc == KB_ERR_NOFIT)
        c->n_nofit++;
    else if (o->rc)
        c->n_err++;
    else if (o->verified == 0)
        c->n_verify_fail++;
    else
        c->n_ok++;
    row = kbcl_sweep_format_row(c->plan, o, c->jsonl);
    if (c->tty && c->fd == STDOUT_FILENO)
        kbcl_sweep_progress_clear(c);
    if (!row || kbcl_write_all(c->fd, row, strlen(row)) != 0) {
        if (!c->write_failed)
            kb_err_set(&c->werr, KB_ERR_IO, "%s: cannot append a row: %s",
                       c->out_path ? c->out_path : "stdout", row ? strerror(errno)
                                                                 : "out of memory");
        c->write_failed = 1;
    }
    free(row);
    c->done[o->point] = 1;
    progress_point(c, o);
    return c->write_failed ? KB_ERR_IO : 0;
}

/* ---------------------------------------------------------------- local workers ------- */

typedef struct sw_worker {
    pid_t pid;
    int fd, point;
    int cmd;     /* a device worker's command pipe (it reads point numbers); -1: one point */
    int busy;    /* a device worker is running a point (one-point workers always are) */
    double t0;   /* when it was handed its point (kbcl_sweep_now_s) */
    size_t got;
    sw_outcome o;
} sw_worker;

/* The running points' times so far, and the longest of them. */
static void sweep_worker_times(const sw_ctx *c, double now, double *running, int *n,
                               double *longest)
{
    *n = 0;
    *longest = 0.0;
    for (int i = 0; c->workers && i < c->nworkers; i++)
        if (c->workers[i].pid && c->workers[i].busy) {
            running[*n] = now - c->workers[i].t0;
            if (running[*n] > *longest)
                *longest = running[*n];
            ++*n;
        }
}

static void crash_outcome(sw_outcome *o, int point, int status)
{
    memset(o, 0, sizeof *o);
    o->point = point;
    o->rc = SW_CRASH;
    o->verified = -1;
    if (WIFSIGNALED(status))
        snprintf(o->msg, sizeof o->msg, "the worker was killed by signal %d (%s)",
                 WTERMSIG(status), strsignal(WTERMSIG(status)));
    else
        snprintf(o->msg, sizeof o->msg, "the worker exited with status %d without a result",
                 WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

/* In a new worker: the other workers' pipe ends are not its own (a device worker must see
 * its command pipe close when the sweep closes it). */
static void close_others(const sw_worker *all, int jobs, const sw_worker *self)
{
    for (int i = 0; i < jobs; i++) {
        if (&all[i] == self || !all[i].pid)
            continue;
        close(all[i].fd);
        if (all[i].cmd >= 0)
            close(all[i].cmd);
    }
}

static int spawn(sw_ctx *c, sw_worker *w, int point, const sigset_t *oldmask, int sfd,
                 const sw_worker *all, int jobs, kb_errbuf *eb)
{
    int pfd[2];
    pid_t parent = getpid();
    if (pipe2(pfd, O_CLOEXEC) != 0)
        return kb_err_set(eb, KB_ERR_IO, "pipe: %s", strerror(errno));
    fflush(stdout);
    fflush(stderr);
    w->pid = fork();
    if (w->pid < 0) {
        close(pfd[0]);
        close(pfd[1]);
        return kb_err_set(eb, KB_ERR_IO, "fork: %s", strerror(errno));
    }
    if (w->pid == 0) {
        sw_outcome o;
        /* a worker dies with the sweep (kill -9 included) and takes default signals */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(1);
        sigprocmask(SIG_SETMASK, oldmask, NULL);
        close(sfd);
        close(pfd[0]);
        close_others(all, jobs, w);
        if (c->fd != STDOUT_FILENO)
            close(c->fd);
        run_point(c->plan, point, &o);
        _exit(kbcl_write_all(pfd[1], (const char *)&o, sizeof o) ? 1 : 0);
    }
    close(pfd[1]);
    w->fd = pfd[0];
    w->cmd = -1;
    w->busy = 1;
    w->t0 = kbcl_sweep_now_s();
    w->point = point;
    w->got = 0;
    return 0;
}

/*
 * A device worker: reads point numbers until its command pipe closes and answers each with an
 * outcome, keeping one Phase-2 backend (its OpenCL context, queue and built program) for all
 * of them; it is made again only when a point needs another device, a failed flush left it
 * unusable or a point ended with a device error.
 */
static void device_worker(const sw_plan *p, int cmd, int out)
{
    kb_backend be = { NULL, NULL };
    int be_dev = -1, point;
    char desc[160], note[256];

    while (kb_devd_read_full(cmd, &point, sizeof point) == 0) { /* whole reads, any fd */
        sw_outcome o;
        int dev = kb_device_from_name(kbcl_sweep_point_device(p, point));
        kb_resident *res = be.ops && be.ops->resident ? be.ops->resident(be.self) : NULL;
        if (be.ops && (dev != be_dev || (res && kb_resident_broken(res)))) {
            be.ops->destroy(be.self);
            be.ops = NULL;
        }
        if (!be.ops) {
            kb_errbuf eb = { { 0 } };
            int rc = kb_backend_for_device((kb_device_kind)dev, &be, desc, sizeof desc, note,
                                           sizeof note, &eb);
            if (rc) {
                be.ops = NULL;
                memset(&o, 0, sizeof o);
                o.point = point;
                o.rc = rc;
                o.verified = -1;
                snprintf(o.msg, sizeof o.msg, "%s", eb.msg[0] ? eb.msg : kb_strerror(rc));
                if (kbcl_write_all(out, (const char *)&o, sizeof o) != 0)
                    break;
                continue;
            }
            be_dev = dev;
        }
        run_point_on(p, point, &o, &be, desc);
        /* A device error may leave the backend failing every later request (a remote one
         * serves no data after a failed replay; a driver may keep a buffer it could not
         * back): the next point gets a new one. A nofit point never touched the device. */
        if (o.rc == KB_ERR_DEVICE && be.ops) {
            be.ops->destroy(be.self);
            be.ops = NULL;
        }
        if (kbcl_write_all(out, (const char *)&o, sizeof o) != 0)
            break;
    }
    if (be.ops)
        be.ops->destroy(be.self);
}

/* Starts a device worker in slot w (idle: no point yet). */
static int spawn_device(sw_ctx *c, sw_worker *w, const sigset_t *oldmask, int sfd,
                        const sw_worker *all, int jobs, kb_errbuf *eb)
{
    int pfd[2], cfd[2];
    pid_t parent = getpid();
    if (pipe2(pfd, O_CLOEXEC) != 0)
        return kb_err_set(eb, KB_ERR_IO, "pipe: %s", strerror(errno));
    if (pipe2(cfd, O_CLOEXEC) != 0) {
        close(pfd[0]);
        close(pfd[1]);
        return kb_err_set(eb, KB_ERR_IO, "pipe: %s", strerror(errno));
    }
    fflush(stdout);
    fflush(stderr);
    w->pid = fork();
    if (w->pid < 0) {
        close(pfd[0]);
        close(pfd[1]);
        close(cfd[0]);
        close(cfd[1]);
        return kb_err_set(eb, KB_ERR_IO, "fork: %s", strerror(errno));
    }
    if (w->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(1);
        sigprocmask(SIG_SETMASK, oldmask, NULL);
        close(sfd);
        close(pfd[0]);
        close(cfd[1]);
        close_others(all, jobs, w);
        if (c->fd != STDOUT_FILENO)
            close(c->fd);
        device_worker(c->plan, cfd[0], pfd[1]);
        _exit(0);
    }
    close(pfd[1]);
    close(cfd[0]);
    w->fd = pfd[0];
    w->cmd = cfd[1];
    w->busy = 0;
    w->got = 0;
    return 0;
}

/* Hands point to the idle device worker w; -1 if the worker is gone. */
static int assign(sw_worker *w, int point)
{
    if (kbcl_write_all(w->cmd, (const char *)&point, sizeof point) != 0)
        return -1;
    w->point = point;
    w->busy = 1;
    w->t0 = kbcl_sweep_now_s();
    w->got = 0;
    return 0;
}

/* Ends slot w's worker (a device worker exits when its command pipe closes). */
static void retire(sw_worker *w, int kill_it)
{
    int status;
    if (!w->pid)
        return;
    if (kill_it)
        kill(w->pid, SIGTERM);
    if (w->cmd >= 0)
        close(w->cmd);
    close(w->fd);
    while (waitpid(w->pid, &status, 0) < 0 && errno == EINTR)
        ;
    w->pid = 0;
    w->cmd = -1;
    w->busy = 0;
}

/* The state of kbcl_sweep_run_local's loop over its workers. */
typedef struct sw_pool {
    sw_ctx *c;
    sw_worker *w;          /* jobs slots; pid 0 = free */
    int jobs;
    const int *pending;
    int npending, next;    /* pending[next] is the next point to hand out */
    int running;           /* points handed out and not finished */
    int stop;              /* 0, -1 (an error: no new points) or the signal that stops the sweep */
    int sfd;               /* the signalfd of SIGINT, SIGTERM, SIGHUP */
    sigset_t old;          /* the signal mask before them */
    kb_errbuf *eb;
    int rc;
} sw_pool;

/* Asks every running worker to stop. */
static void pool_kill_all(const sw_pool *pl)
{
    for (int i = 0; i < pl->jobs; i++)
        if (pl->w[i].pid)
            kill(pl->w[i].pid, SIGTERM);
}

/* Hands out points: an OpenCL point to an idle device worker (started in a free slot if there
 * is none), any other to a one-point worker in a free slot (an idle device worker gives its
 * slot up for it). */
static void pool_hand_out(sw_pool *pl)
{
    sw_ctx *c = pl->c;
    sw_worker *w = pl->w;
    int jobs = pl->jobs;

    while (pl->next < pl->npending && !pl->stop && !c->write_failed) {
        int point = pl->pending[pl->next], ocl = kbcl_sweep_point_uses_opencl(c->plan, point);
        int pick = -1;
        for (int i = 0; i < jobs && pick < 0; i++)
            if (ocl && w[i].pid && w[i].cmd >= 0 && !w[i].busy)
                pick = i;
        for (int i = 0; i < jobs && pick < 0; i++)
            if (!w[i].pid)
                pick = i;
        for (int i = 0; i < jobs && pick < 0 && !ocl; i++)
            if (w[i].pid && w[i].cmd >= 0 && !w[i].busy) {
                retire(&w[i], 0);
                pick = i;
            }
        if (pick < 0)
            break;
        if (ocl) {
            if (!w[pick].pid &&
                (pl->rc = spawn_device(c, &w[pick], &pl->old, pl->sfd, w, jobs, pl->eb)) != 0) {
                pl->stop = -1;
                break;
            }
            if (assign(&w[pick], point) != 0) { /* died idle: start another */
                retire(&w[pick], 1);
                continue;
            }
        } else if ((pl->rc = spawn(c, &w[pick], point, &pl->old, pl->sfd, w, jobs, pl->eb)) !=
                   0) {
            pl->stop = -1;
            break;
        }
        pl->next++;
        pl->running++;
    }
}

/* Reads what worker x has sent; a whole outcome becomes a row, an end without one a crash
 * row (or, for a worker someone interrupted, the stop of the sweep). */
static void pool_read(sw_pool *pl, sw_worker *x)
{
    ssize_t r;
    int status = 0, was_busy;

    r = read(x->fd, (char *)&x->o + x->got, sizeof x->o - x->got);
    if (r < 0 && errno == EINTR)
        return;
    if (r > 0) {
        x->got += (size_t)r;
        if (x->got < sizeof x->o)
            return;
        if (x->cmd >= 0) { /* a device worker's outcome: it stays, idle */
            x->busy = 0;
            x->got = 0;
            pl->running--;
            if (kbcl_sweep_finish_point(pl->c, &x->o) != 0 && pl->stop == 0)
                pl->stop = -1;
            return;
        }
    }
    /* a whole outcome or EOF: the worker is done */
    was_busy = x->busy;
    if (x->cmd >= 0)
        close(x->cmd);
    x->cmd = -1;
    close(x->fd);
    while (waitpid(x->pid, &status, 0) < 0 && errno == EINTR)
        ;
    x->pid = 0;
    x->busy = 0;
    if (!was_busy)
        return; /* an idle device worker ended */
    pl->running--;
    if (x->got == sizeof x->o) {
        if (kbcl_sweep_finish_point(pl->c, &x->o) != 0 && pl->stop == 0)
            pl->stop = -1;
        return;
    }
    if (WIFSIGNALED(status) && (WTERMSIG(status) == SIGINT || WTERMSIG(status) == SIGTERM ||
                                WTERMSIG(status) == SIGHUP)) {
        if (pl->stop == 0) { /* someone interrupted the worker: the sweep stops too */
            pl->stop = WTERMSIG(status);
            pool_kill_all(pl);
        }
        return;
    }
    if (pl->stop > 0)
        return; /* interrupted: the point runs again on --resume */
    crash_outcome(&x->o, x->point, status);
    if (kbcl_sweep_finish_point(pl->c, &x->o) != 0 && pl->stop == 0)
        pl->stop = -1;
}

/* Waits for a signal or a worker's outcome (at most a second on a terminal, for the progress
 * bar) and takes what came. Returns 0, 1 when poll was interrupted (nothing read), -1 on a
 * poll error (in pl->rc). */
static int pool_wait(sw_pool *pl, struct pollfd *pfd)
{
    sw_ctx *c = pl->c;
    int np = 0, slot[SW_MAX_JOBS + 1];

    pfd[np].fd = pl->sfd;
    pfd[np].events = POLLIN;
    slot[np++] = -1;
    for (int i = 0; i < pl->jobs; i++)
        if (pl->w[i].pid) { /* idle device workers too: an EOF says one died */
            pfd[np].fd = pl->w[i].fd;
            pfd[np].events = POLLIN;
            slot[np++] = i;
        }
    if (poll(pfd, (nfds_t)np, c->tty && !c->quiet ? 1000 : -1) < 0) {
        if (errno == EINTR)
            return 1;
        pl->rc = kb_err_set(pl->eb, KB_ERR_IO, "poll: %s", strerror(errno));
        pl->stop = -1;
        return -1;
    }
    if (pfd[0].revents & POLLIN) {
        struct signalfd_siginfo si;
        if (read(pl->sfd, &si, sizeof si) == (ssize_t)sizeof si && pl->stop <= 0) {
            pl->stop = (int)si.ssi_signo;
            pool_kill_all(pl);
        }
    }
    for (int k = 1; k < np; k++)
        if (pfd[k].revents & (POLLIN | POLLHUP | POLLERR))
            pool_read(pl, &pl->w[slot[k]]);
    return 0;
}

/* Runs the pending points in up to `jobs` forked workers. Returns 0, or 128+signal. */
int kbcl_sweep_run_local(sw_ctx *c, const int *pending, int npending, int jobs, kb_errbuf *eb)
{
    struct pollfd *pfd = calloc((size_t)jobs + 1, sizeof *pfd);
    sigset_t block;
    sw_pool pl;

    memset(&pl, 0, sizeof pl);
    pl.c = c;
    pl.w = calloc((size_t)jobs, sizeof *pl.w);
    pl.jobs = jobs;
    pl.pending = pending;
    pl.npending = npending;
    pl.sfd = -1;
    pl.eb = eb;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGHUP);
    if (!pl.w || !pfd) {
        pl.rc = kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < jobs; i++)
        pl.w[i].cmd = -1;
    c->workers = pl.w;
    c->nworkers = jobs;
    /* signals arrive as readable data in the poll loop: no handler, no global flag */
    sigprocmask(SIG_BLOCK, &block, &pl.old);
    if ((pl.sfd = signalfd(-1, &block, SFD_CLOEXEC)) < 0) {
        pl.rc = kb_err_set(eb, KB_ERR_IO, "signalfd: %s", strerror(errno));
        goto out;
    }
    /* SIGPIPE from a device worker that died between points: seen as a failed write */
    signal(SIGPIPE, SIG_IGN);
    while (pl.running > 0 || (pl.next < npending && !pl.stop)) {
        int r;
        pool_hand_out(&pl);
        if (c->write_failed)
            pl.stop = pl.stop ? pl.stop : -1;
        if (pl.running == 0)
            break;
        if ((r = pool_wait(&pl, pfd)) < 0)
            break;
        if (r > 0)
            continue;
        if (c->tty && !c->quiet && pl.stop == 0)
            kbcl_sweep_progress_bar(c);
    }
    if (pl.stop > 0)
        pl.rc = 128 + pl.stop;
out:
    c->workers = NULL;
    for (int i = 0; pl.w && i < jobs; i++) /* idle device workers; any other means a stop */
        retire(&pl.w[i], pl.w[i].busy || pl.w[i].cmd < 0);
    if (pl.sfd >= 0) {
        close(pl.sfd);
        sigprocmask(SIG_SETMASK, &pl.old, NULL);
    }
    free(pl.w);
    free(pfd);
    return pl.rc;
}

