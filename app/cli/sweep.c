/*
 * kbcl sweep — runs the cartesian product of a YAML grid of `kbcl run` jobs (docs/sweeps.md)
 * and appends one result row per point to a CSV or JSON Lines file as soon as the point
 * finishes. This file is the command: its options, the order of the steps (plugins, the plan
 * and its checks in sweep_plan.c, the output and --resume in sweep_out.c, running the points
 * in sweep_run.c or, under mpirun, over the ranks in sweep_mpi.c) and the exit code and summary.
 * Limits: --jobs at most SW_MAX_JOBS; every check runs on rank 0 before any point runs, so a
 * point that cannot run stops the sweep with exit 2 and the output untouched.
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kb_sweep_int.h"

/* ---------------------------------------------------------------- the command --------- */

static void usage_sweep(FILE *f)
{
    fputs("usage: kbcl sweep FILE.yaml [options]\n"
          "\n"
          "Runs every point of the grid in FILE.yaml (docs/sweeps.md) and appends one row per\n"
          "finished point to the output.\n"
          "\n"
          "  --jobs N       run N points at a time in worker processes (default 1; 0 = one per\n"
          "                 CPU). Under mpirun the points are spread over the ranks instead.\n"
          "  --out FILE     .csv (default format) or .jsonl/.json (JSON Lines); default stdout\n"
          "  --resume       keep the rows already in --out and run only the missing points\n"
          "  --quiet        no progress output\n"
          "  --plugin FILE  load a plugin before the sweep file's plugins: (repeatable;\n"
          "                 docs/plugins.md); KBCL_PLUGIN_PATH=A:B loads plugins first\n"
          "Every point is checked as `kbcl run` checks its options before any point runs.\n"
          "exit codes: 0 every point ok (or too large for its device: status nofit), 1 a\n"
          "            verification failed, 2 usage or sweep-file error or a point that\n"
          "            cannot run (nothing ran), 3 a point errored, 128+N interrupted by\n"
          "            signal N (resume with --resume)\n",
          f);
}

/* The options of `kbcl sweep` (--out goes to sw_ctx.out_path). */
typedef struct sw_args {
    const char *file;
    int jobs, resume, quiet;
    const char *files[KBCL_MAX_PLUGIN_ARGS]; /* --plugin */
    int nfiles;
} sw_args;

/* Parses the command line into *a and c->out_path; --jobs 0 becomes the CPU count. Returns
 * -1 to go on, else the exit code (after --help or a usage error). */
static int parse_args(int argc, char **argv, sw_args *a, sw_ctx *c)
{
    for (int i = 0; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "--help") || !strcmp(s, "-h")) {
            usage_sweep(stdout);
            return 0;
        } else if (!strcmp(s, "--jobs") || !strcmp(s, "-j")) {
            char *end;
            long v = i + 1 < argc ? strtol(argv[i + 1], &end, 10) : -1;
            if (i + 1 >= argc || *end || v < 0 || v > SW_MAX_JOBS) {
                fprintf(stderr, "kbcl sweep: --jobs needs a number 0..%d\n", SW_MAX_JOBS);
                return KBCL_EXIT_USAGE;
            }
            a->jobs = (int)v;
            i++;
        } else if (!strcmp(s, "--out") || !strcmp(s, "-o")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "kbcl sweep: --out needs a file name\n");
                return KBCL_EXIT_USAGE;
            }
            c->out_path = argv[++i];
        } else if (!strcmp(s, "--resume")) {
            a->resume = 1;
        } else if (!strcmp(s, "--plugin")) {
            if (i + 1 >= argc || a->nfiles >= KBCL_MAX_PLUGIN_ARGS) {
                fprintf(stderr, "kbcl sweep: --plugin needs a file (at most %d)\n",
                        KBCL_MAX_PLUGIN_ARGS);
                return KBCL_EXIT_USAGE;
            }
            a->files[a->nfiles++] = argv[++i];
        } else if (!strcmp(s, "--quiet") || !strcmp(s, "-q")) {
            a->quiet = 1;
        } else if (s[0] == '-' || a->file) {
            fprintf(stderr, "kbcl sweep: unexpected argument '%s' (see kbcl sweep --help)\n", s);
            return KBCL_EXIT_USAGE;
        } else {
            a->file = s;
        }
    }
    if (!a->file) {
        usage_sweep(stderr);
        return KBCL_EXIT_USAGE;
    }
    if (a->resume && !c->out_path) {
        fprintf(stderr, "kbcl sweep: --resume needs --out FILE\n");
        return KBCL_EXIT_USAGE;
    }
    if (a->jobs == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        a->jobs = n > 0 ? (n < SW_MAX_JOBS ? (int)n : SW_MAX_JOBS) : 1;
    }
    return -1;
}

/* Rank 0, plan loaded: checks every point and the output, opens it (reading the rows already
 * there on --resume) and lists the points to run in *pending; *npending = -1 after an error,
 * which it prints. */
static void prepare_points(sw_ctx *c, const sw_args *a, int **pending, int *npending,
                           kb_errbuf *eb)
{
    const sw_plan *plan = c->plan;
    int rc = 0;

    if (!(c->done = calloc((size_t)plan->npoints, 1)) ||
        !(*pending = malloc((size_t)plan->npoints * sizeof **pending))) {
        rc = kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
    } else if ((rc = kbcl_sweep_plan_check_points(plan, eb)) == 0 &&
               (rc = kbcl_sweep_check_out(c, a->file, a->files, a->nfiles, eb)) == 0 &&
               (rc = kbcl_sweep_output_open(c, a->resume, eb)) == 0) {
        for (int i = 0; i < plan->npoints; i++)
            if (!c->done[i])
                (*pending)[(*npending)++] = i;
    }
    if (rc) {
        fprintf(stderr, "kbcl sweep: %s\n", eb->msg);
        *npending = -1;
    }
}

/* Rank 0, after the run: the interruption, the error or the summary. Returns the exit code. */
static int report_end(sw_ctx *c, int quiet, int rc, const kb_errbuf *eb)
{
    const sw_plan *plan = c->plan;

    kbcl_sweep_progress_clear(c);
    if (rc > 0) {
        fprintf(stderr, "kbcl sweep: interrupted (%s): %d of %d points in %s; run again with "
                "--resume to finish\n", strsignal(rc - 128), c->ndone_before + c->nfinished,
                plan->npoints, c->out_path ? c->out_path : "stdout");
        return rc;
    }
    if (rc) {
        fprintf(stderr, "kbcl sweep: %s\n", eb->msg);
        return kbcl_exit_code(rc);
    }
    if (!quiet) {
        char nofit[64] = "";
        if (c->n_nofit) /* rows that say so (status nofit), not errors: a sweep up to sizes
                         * the device cannot hold is a normal sweep */
            snprintf(nofit, sizeof nofit, ", %d too large for the device", c->n_nofit);
        fprintf(stderr, "kbcl sweep: %d points: %d ok, %d failed verification, %d errors%s "
                "(%d from earlier runs); %.1f s%s%s\n", plan->npoints, c->n_ok, c->n_verify_fail,
                c->n_err, nofit, c->ndone_before, kbcl_sweep_now_s() - c->t0,
                c->out_path ? "; rows in " : "", c->out_path ? c->out_path : "");
    }
    return c->n_err ? KBCL_EXIT_SIM : c->n_verify_fail ? KBCL_EXIT_VERIFY : 0;
}

int kbcl_cmd_sweep(int argc, char **argv)
{
    int rank = 0, size = 1, mpi, rc = 0, code = 0;
    int *pending = NULL, npending = 0;
    kb_plugins *plugins = NULL;
    sw_plan *plan = NULL;
    sw_args a;
    sw_ctx c;
    kb_errbuf eb = { { 0 } };

    memset(&a, 0, sizeof a);
    a.jobs = 1;
    memset(&c, 0, sizeof c);
    c.fd = -1;
    if ((rc = parse_args(argc, argv, &a, &c)) >= 0)
        return rc;
    mpi = kbcl_sweep_mpi_init(&rank, &size, &eb);
    if (mpi < 0) {
        fprintf(stderr, "kbcl sweep: %s\n", eb.msg);
        return KBCL_EXIT_USAGE;
    }
    c.jsonl = kbcl_sweep_out_is_jsonl(c.out_path);
    c.quiet = a.quiet || rank != 0;
    c.tty = isatty(STDERR_FILENO);
    c.t0 = kbcl_sweep_now_s();
    /* every rank (and, through fork, every worker) has the plugins before any point runs */
    if ((rc = kb_plugins_create(&plugins, &eb)) == 0)
        rc = kbcl_plugins_load_cli(plugins, a.files, a.nfiles, &eb);
    if (rc == 0)
        rc = kbcl_sweep_plan_load(a.file, plugins, &plan, &eb);
    if (rc == 0) {
        /* op-log cuts (a replay beside the simulation) only where the jobs leave a core free
         * for it: the workers' and a device server's threads would fight for them otherwise;
         * an MPI sweep's hosts are not known here */
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        plan->replay_cuts = !mpi && 2L * a.jobs <= ncpu;
    }
    if (rc != 0) {
        if (rank == 0)
            fprintf(stderr, "kbcl sweep: %s\n", eb.msg);
        npending = -1;
    } else if (rank == 0) {
        c.plan = plan;
        prepare_points(&c, &a, &pending, &npending, &eb);
    }
    c.plan = plan;
    /* every rank learns rank 0's list of points to run, or that some rank cannot go on */
    if (mpi && kbcl_sweep_mpi_share(&pending, &npending, npending >= 0, &eb) != 0) {
        fprintf(stderr, "kbcl sweep: %s\n", eb.msg);
        code = KBCL_EXIT_SIM;
        goto out;
    }
    if (npending < 0) {
        code = KBCL_EXIT_USAGE;
        goto out;
    }
    c.npending = npending;
    c.slots = mpi ? size : a.jobs;
    /* a device server for each device the points use (gpu, cpu, auto), before any worker
     * forks or any thread starts: every point then finds its device set up */
    {
        static const char *const devs[] = { "gpu", "cpu", "auto" };
        for (size_t d = 0; d < sizeof devs / sizeof devs[0]; d++)
            for (int i = 0; i < npending; i++) {
                const char *pd = kbcl_sweep_point_device(plan, pending[i]);
                if (pd && !strcmp(pd, devs[d])) {
                    kbcl_devd_autostart(devs[d]);
                    break;
                }
            }
    }
    if (rank == 0 && !c.quiet && !c.tty)
        fprintf(stderr, "kbcl sweep: %s: %d points, %d to run (%s %d)\n", plan->file,
                plan->npoints, npending, mpi ? "MPI ranks" : "jobs", mpi ? size : a.jobs);
    if (rank == 0 && !c.quiet && c.tty)
        kbcl_sweep_progress_bar(&c);
    if (mpi) {
        kbcl_sweep_io io = { &c, sizeof(sw_outcome), kbcl_sweep_run_point_cb,
                             kbcl_sweep_finish_point };
        rc = kbcl_sweep_mpi_run(&io, pending, npending, &eb);
    } else {
        rc = kbcl_sweep_run_local(&c, pending, npending, a.jobs, &eb);
    }
    if (rank == 0 && c.write_failed && rc <= 0)
        rc = kb_err_set(&eb, KB_ERR_IO, "%s", c.werr.msg);
    if (rank != 0)
        code = rc ? KBCL_EXIT_SIM : 0;
    else
        code = report_end(&c, a.quiet, rc, &eb);
out:
    if (c.fd >= 0 && c.fd != STDOUT_FILENO)
        close(c.fd);
    free(c.done);
    free(pending);
    kbcl_sweep_plan_free(plan);
    kb_plugins_destroy(plugins);
    if (mpi)
        kbcl_sweep_mpi_fini();
    return code;
}

