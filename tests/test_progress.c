/*
 * kbcl run's progress line: the text of each phase (kbcl_progress_format, exact strings), when
 * it is shown (kbcl_progress_wanted), what the event engine publishes, and the real binary on
 * a pseudo-terminal (forkpty): a run longer than 1.5 s shows the line there and clears it
 * before the results; the same run with stderr in a file, and with --quiet on the terminal,
 * shows none. The run is sized by doubling until it lasts long enough on this machine, so the
 * test means the same on a fast and on a loaded one.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <pty.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include "kb_cli.h"
#include "kb_progress.h"
#include "kb_sim.h"
#include "kb_test_util.h"

static int setup(void **s)
{
    (void)s;
    return kbt_workdir_make("kbcl-progress");
}

static int teardown(void **s)
{
    (void)s;
    return kbt_workdir_remove();
}

static void check_line(kb_progress *p, double el, const char *want)
{
    char buf[256];
    size_t n = kbcl_progress_format(buf, sizeof buf, p, el);
    assert_string_equal(buf, want);
    assert_int_equal(n, strlen(want));
}

static void test_format(void **s)
{
    kb_progress p;
    (void)s;
    kb_progress_init(&p);
    check_line(&p, 0.2, "kbcl run [0:00] setting up the run");

    kb_progress_set_phase(&p, KB_PROGRESS_PHASE1);
    atomic_store(&p.sim_now, INT64_C(123456789));   /* ps */
    atomic_store(&p.events, UINT64_C(12345678));
    check_line(&p, 5.4, "kbcl run [0:05] phase 1: 123.457 us simulated, 12.3 M events");
    atomic_store(&p.sim_now, INT64_C(999));
    atomic_store(&p.events, UINT64_C(4096));
    check_line(&p, 1.0, "kbcl run [0:01] phase 1: 0.999 ns simulated, 4096 events");
    atomic_store(&p.sim_now, INT64_C(1077000000000));
    atomic_store(&p.events, UINT64_C(999949));
    check_line(&p, 59.6, "kbcl run [1:00] phase 1: 1.077 s simulated, 999.9 k events");
    atomic_store(&p.events, UINT64_C(999950)); /* not "1000.0 k" */
    check_line(&p, 60.0, "kbcl run [1:00] phase 1: 1.077 s simulated, 1.0 M events");
    /* the device set-up overlaps Phase 1 */
    kb_progress_set_device(&p, KB_PROGRESS_DEV_BUILD);
    atomic_store(&p.sim_now, INT64_C(2500000000));
    check_line(&p, 3725.0,
               "kbcl run [1:02:05] phase 1: 2.500 ms simulated, 1.0 M events; building OpenCL "
               "program");

    assert_int_equal(kb_progress_set_phase(&p, KB_PROGRESS_DEVICE_WAIT), KB_PROGRESS_PHASE1);
    check_line(&p, 64.0, "kbcl run [1:04] waiting for the Phase-2 device: building OpenCL program");
    kb_progress_set_device(&p, KB_PROGRESS_DEV_LOAD);
    check_line(&p, 64.0,
               "kbcl run [1:04] waiting for the Phase-2 device: loading the cached OpenCL program");
    kb_progress_set_device(&p, KB_PROGRESS_DEV_NONE);
    check_line(&p, 64.0, "kbcl run [1:04] waiting for the Phase-2 device: setting it up");

    kb_progress_set_phase(&p, KB_PROGRESS_REPLAY);
    atomic_store(&p.flushes, UINT64_C(2));
    atomic_store(&p.flush_records, UINT64_C(40000));
    check_line(&p, 7.0, "kbcl run [0:07] phase 2: replay flush 2 (40.0 k records): planning");
    atomic_store(&p.batches, UINT64_C(10));
    atomic_store(&p.batches_done, UINT64_C(3));
    check_line(&p, 7.0, "kbcl run [0:07] phase 2: replay flush 2 (40.0 k records): batch 4/10");
    atomic_store(&p.batches_done, UINT64_C(10));
    check_line(&p, 7.0, "kbcl run [0:07] phase 2: replay flush 2 (40.0 k records): finishing");

    kb_progress_set_phase(&p, KB_PROGRESS_VERIFY);
    check_line(&p, 8.0, "kbcl run [0:08] verifying the outputs");

    /* cut to the buffer, always terminated */
    char small[12];
    assert_int_equal(kbcl_progress_format(small, sizeof small, &p, 8.0), 11);
    assert_string_equal(small, "kbcl run [0");
}

static void test_wanted(void **s)
{
    (void)s;
    assert_int_equal(kbcl_progress_wanted(0, NULL, 1), 1);
    assert_int_equal(kbcl_progress_wanted(0, NULL, 0), 0);
    assert_int_equal(kbcl_progress_wanted(0, "", 1), 1);
    assert_int_equal(kbcl_progress_wanted(0, "0", 1), 0);
    assert_int_equal(kbcl_progress_wanted(0, "1", 0), 1);
    assert_int_equal(kbcl_progress_wanted(0, "yes", 0), 0); /* only 0 and 1 force */
    assert_int_equal(kbcl_progress_wanted(1, "1", 1), 0);   /* --quiet wins */
    assert_int_equal(kbcl_progress_wanted(1, NULL, 1), 0);
}

/* A callback re-scheduling itself until `left` runs out, 1 ns apart (a later wheel slot each
 * time), noting how far the published count trails the engine's. */
typedef struct ticker_st {
    uint64_t left, max_lag;
    kb_progress *p;
} ticker_st;

static void tick(kb_sim *sim, void *a, void *b)
{
    ticker_st *t = a;
    (void)b;
    uint64_t lag = kb_sim_events(sim) - atomic_load(&t->p->events);
    if (lag > t->max_lag)
        t->max_lag = lag;
    if (t->left && --t->left)
        kb_sim_after(sim, 1000, tick, a, NULL);
}

/* The engine publishes during a run (at most KB_PROGRESS_EVERY events behind when time moves
 * on every event) and when it returns. */
static void test_sim_publishes(void **s)
{
    kb_progress p;
    ticker_st t = { 3 * KB_PROGRESS_EVERY + 5, 0, &p };
    kb_sim *sim = kb_sim_create(NULL);
    (void)s;
    kb_progress_init(&p);
    assert_non_null(sim);
    kb_sim_set_progress(sim, &p);
    assert_int_equal(kb_sim_at(sim, 0, tick, &t, NULL), 0);
    assert_int_equal(kb_sim_run(sim), 0);
    assert_true(t.max_lag >= KB_PROGRESS_EVERY - 1 && t.max_lag <= KB_PROGRESS_EVERY + 1);
    assert_int_equal(atomic_load(&p.events), kb_sim_events(sim));
    assert_int_equal(atomic_load(&p.events), 3 * KB_PROGRESS_EVERY + 5);
    assert_int_equal(atomic_load(&p.sim_now), kb_sim_now(sim));
    assert_int_equal(atomic_load(&p.sim_now), (3 * KB_PROGRESS_EVERY + 4) * INT64_C(1000));
    /* the phase is the caller's business */
    assert_int_equal(atomic_load(&p.phase), KB_PROGRESS_START);

    /* unset: a later run publishes nothing */
    t.left = 10;
    kb_sim_set_progress(sim, NULL);
    assert_int_equal(kb_sim_after(sim, 0, tick, &t, NULL), 0);
    assert_int_equal(kb_sim_run(sim), 0);
    assert_int_equal(atomic_load(&p.events), 3 * KB_PROGRESS_EVERY + 5);
    kb_sim_destroy(sim);
}

/* ---- the binary on a pseudo-terminal ---- */

#define RUN_ARGS "run --bench ccl --algorithm ring_allreduce_tcm --world-size 256 --device none"

/*
 * Runs kbcl with args (space-separated, no quoting) in the scratch directory, its stdout and
 * stderr on a new pseudo-terminal (or, with err_file, stderr into that scratch file) and
 * KBCL_PROGRESS unset; the terminal's bytes go into out. Returns the exit status.
 */
static int run_on_pty(char *out, size_t n, const char *args, const char *err_file)
{
    char line[512], *argv[32];
    int argc = 0, master, st;
    struct winsize ws = { 24, 120, 0, 0 };
    size_t len = 0;
    pid_t pid;

    snprintf(line, sizeof line, "%s", args);
    argv[argc++] = (char *)kbt_kbcl_bin();
    for (char *t = strtok(line, " "); t && argc < 31; t = strtok(NULL, " "))
        argv[argc++] = t;
    argv[argc] = NULL;
    pid = forkpty(&master, NULL, NULL, &ws);
    assert_true(pid >= 0);
    if (pid == 0) {
        char path[512];
        unsetenv("KBCL_PROGRESS");
        if (chdir(kbt_workdir()) != 0)
            _exit(126);
        if (err_file) {
            kbt_path(path, sizeof path, err_file);
            if (!freopen(path, "w", stderr))
                _exit(126);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    for (;;) {
        char buf[4096];
        ssize_t r = read(master, buf, sizeof buf);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) /* EIO once the child's side is closed */
            break;
        for (ssize_t i = 0; i < r && len + 1 < n; i++)
            out[len++] = buf[i];
    }
    out[len] = 0;
    close(master);
    assert_int_equal(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The wall time a run printed ("  wall       1234.567 ms ..."), in seconds; -1 if none. */
static double printed_wall_s(const char *out)
{
    const char *w = strstr(out, "  wall ");
    return w ? strtod(w + 7, NULL) / 1000.0 : -1.0;
}

/*
 * Runs RUN_ARGS + extra at *mib MiB, doubling *mib until the run printed a wall time of at least
 * min_s (speed differs between machines and between two runs on one loaded machine, so a size
 * that was long enough once is not assumed to be again). Fails past 512 MiB.
 */
static void run_at_least(char *out, size_t n, int *mib, const char *extra, const char *err_file,
                         double min_s)
{
    char args[512];
    for (;; *mib *= 2) {
        snprintf(args, sizeof args, RUN_ARGS " --size %dM%s", *mib, extra);
        assert_int_equal(run_on_pty(out, n, args, err_file), 0);
        if (printed_wall_s(out) >= min_s)
            return;
        if (*mib >= 512)
            fail_msg("a 512 MiB run printed a wall time under %.2f s: %s", min_s, out);
    }
}

static void test_terminal(void **s)
{
    static char out[1 << 16];
    int mib = 4;
    (void)s;
    /* long enough that the line must have been drawn (from 1 s on, every 250 ms) */
    run_at_least(out, sizeof out, &mib, "", NULL, 1.6);
    /* the line, redrawn in place, then cleared: the results start on a clean line */
    const char *first = strstr(out, "\rkbcl run [0:01] phase 1: ");
    if (!first)
        fail_msg("no progress line on the terminal: %s", out);
    const char *res = strstr(out, "  ring_allreduce_tcm (ws=256): timing only");
    assert_non_null(res);
    assert_true(first < res);
    assert_true(res - out >= 4 && !memcmp(res - 4, "\r\033[K", 4));
    assert_null(strstr(res, "kbcl run ["));

    /* a run with stderr in a file, past the line's first draw: no line anywhere */
    run_at_least(out, sizeof out, &mib, "", "err.txt", 1.3);
    assert_null(strstr(out, "kbcl run ["));
    char *err = kbt_slurp("err.txt");
    assert_non_null(err);
    /* nothing of the line (a sanitizer build's runtime may write its own warnings here) */
    assert_null(strstr(err, "kbcl run ["));
    assert_null(strchr(err, '\r'));
    assert_null(strchr(err, '\033'));
    free(err);

    /* --quiet on the terminal: the result line alone */
    /* (--quiet prints no wall time: the size is the one that just ran past 1.3 s) */
    char args[512];
    snprintf(args, sizeof args, RUN_ARGS " --size %dM --quiet", mib);
    assert_int_equal(run_on_pty(out, sizeof out, args, NULL), 0);
    assert_null(strstr(out, "kbcl run ["));
    assert_null(strchr(out, '\033'));
    assert_non_null(strstr(out, "  ring_allreduce_tcm (ws=256): timing only"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_format),
        cmocka_unit_test(test_wanted),
        cmocka_unit_test(test_sim_publishes),
        cmocka_unit_test(test_terminal),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
