/*
 * kb_cli — what the kbcl subcommands share: one "job" (everything `kbcl run` takes), its
 * execution from config files to a report, the report as JSON, atomic file writes, and the
 * exit-status table. `kbcl run` executes one job; `kbcl sweep` executes many.
 *
 * Exit statuses: 0 success, 1 verification failure, 2 usage or configuration error,
 * 3 simulation error (deadlock, allocation, bad kernel), 4 compute-device error.
 */
#ifndef KB_CLI_H
#define KB_CLI_H

#include <stdio.h>

#include "kb_bench.h"
#include "kb_config.h"
#include "kb_plugin.h"

#define KBCL_VERSION "0.1.0"

enum { KBCL_EXIT_OK = 0, KBCL_EXIT_VERIFY = 1, KBCL_EXIT_USAGE = 2, KBCL_EXIT_SIM = 3,
       KBCL_EXIT_DEVICE = 4 };

/* Exit status for a library error code. */
int kbcl_exit_code(int rc);

#define KBCL_MAX_SETS 64
typedef struct kbcl_job {
    const char *bench;          /* default ccl_allreduce */
    const char *topology, *ccl; /* NULL = default files */
    const char *algorithm, *world_size, *n_elem, *buffer_kind; /* collective shorthands */
    const char *size;           /* --size BYTES[K|M|G] (kbcl_parse_size); excludes n_elem */
    const char *root;           /* --root R: ccl.algorithms.<algorithm>.root */
    const char *op;             /* --op OP: ccl.algorithms.<algorithm>.op */
    const char *dtype;          /* --dtype T: ccl.algorithms.<algorithm>.dtype, or the number
                                 * format of a bench that takes --model */
    const char *model;          /* --model FILE: a model file (configs/models/) */
    const char *device;         /* default "ref" */
    const char *sets[KBCL_MAX_SETS];
    int nsets;
    const char *params[KBCL_MAX_SETS];
    int nparams;
    int verify;
    FILE *ipcq_trace;           /* KBCL_CCL_TRACE stream or NULL */
    const char *trace_path;     /* --trace FILE (Chrome trace JSON) or NULL */
    const char *trace_filter;   /* --trace-filter SPEC (kb_trace_set_filter) or NULL */
    const char *trace_window;   /* --trace-window START:END, simulated ns, or NULL */
    const char *replay_cut;     /* --replay-cut RECORDS: kb_ctx_opts.cut_records (0 = none);
                                   NULL = the default */
    const char *threads;        /* --threads N|auto: kb_ctx_opts.threads; NULL = 0 (one engine,
                                 * no partitions); kbcl run's default is auto */
    /* borrowed: the plugins loaded so far (the command loads KBCL_PLUGIN_PATH and --plugin
     * into it) and where ccl.yaml's plugins: load; benches and algorithms are looked up in it.
     * NULL = the built-ins only (a ccl.yaml that lists plugins is then refused). */
    kb_plugins *plugins;
    /* A Phase-2 backend kept across jobs (a sweep worker's) instead of one per job; NULL =
     * the job makes its own. Not owned. */
    const kb_backend *backend;
    const char *backend_desc;
    /* Where the run publishes how far it has come (kb_ctx_opts.progress); NULL = nobody
     * watches. Not owned. */
    struct kb_progress *progress;
    /* What a caller that checks many jobs (a sweep) loaded once, borrowed: the topology and
     * ccl files with ccl's plugins applied (used instead of topology and ccl), and
     * model_checked = 1 when model loads. NULL / 0: the job loads them itself. */
    const kb_config *base_cfg;
    const kb_ccl_cfg *base_ccl;
    int model_checked;
    /* kbcl run under mpirun: the processes' collective (kb_ctx_opts.net; NULL = one process)
     * and this process's rank (only rank 0 writes files: the trace). */
    const struct kb_psim_net *net;
    int rank;
} kbcl_job;

typedef struct kbcl_result {
    const kb_bench *bench;
    kb_bench_args args;
    kb_config cfg;              /* the machine */
    kb_ccl_cfg ccl;             /* the collective library (ccl.yaml + overrides) */
    char device[16];
    kb_run_report rep;          /* valid when kbcl_job_run returned 0 */
    /* --trace: the file (borrowed from the job; NULL = none written), the events written,
     * those the filter and window left out, and the file's size */
    const char *trace_path;
    uint64_t trace_events, trace_left_out, trace_bytes;
    int threads_asked;          /* --threads gave a count (not auto): say if nothing forked */
    int ranks;                  /* processes of the run (mpirun -n R), 1 without */
} kbcl_result;

/*
 * Parses a size as users write it: a positive whole number of bytes, optionally followed by K,
 * M or G (also k, m, g: 2^10, 2^20, 2^30, as nccl-tests' -b/-e read them): "8", "64K", "1G".
 * Returns 0, or -1 for anything else (empty, signs, spaces, fractions, other suffixes, zero, or
 * more than 2^62 bytes).
 */
int kbcl_parse_size(const char *s, int64_t *bytes);
/* The usage line every size error ends with. */
#define KBCL_SIZE_HELP "expected a positive number of bytes, optionally with K, M or G " \
                       "(2^10, 2^20, 2^30), e.g. 8, 64K, 1G"

/*
 * Plugins named outside the configuration files: every element of $KBCL_PLUGIN_PATH (files,
 * or folders of *.so files), then files[0..n) (the --plugin options), into ps. 0 or
 * KB_ERR_CONFIG with "FILE: why" in eb.
 */
int kbcl_plugins_load_cli(kb_plugins *ps, const char *const *files, int n, kb_errbuf *eb);
/*
 * Loads ccl's plugins: into ps (ps NULL: ccl must list none), lends ccl the registry of every
 * plugin collective loaded into ps, and gives each plugin collective that ccl does not define
 * as an entry a ccl.yaml entry of its own name (module = it; the rank = PE form's topology),
 * so that --algorithm NAME runs it. 0 or KB_ERR_CONFIG.
 */
int kbcl_ccl_plugins(kb_plugins *ps, kb_ccl_cfg *ccl, kb_errbuf *eb);
#define KBCL_MAX_PLUGIN_ARGS 32

/* The configuration file NAME kbcl reads when none is named: $KBCL_CONFIG_DIR/NAME, else the
 * source tree's configs/NAME when it exists, else PREFIX/share/kbcl/configs/NAME of an
 * installed kbcl (PREFIX/bin/kbcl) when it exists (written into buf), else NULL. */
const char *kbcl_default_config(const char *name, char *buf, size_t n);

/*
 * The files kbcl run reads: the machine (topo, else kbcl_default_config's topology.yaml, else
 * the built-in one) into cfg, the collective library (ccl_path, else the default ccl.yaml)
 * into ccl, then ccl's plugins (kbcl_ccl_plugins with ps). cfg and ccl hold defaults on entry;
 * a NULL one is left out (and, for ccl, its plugins). 0, KB_ERR_USAGE (a file that cannot be
 * read) or KB_ERR_CONFIG, with the message in eb.
 */
int kbcl_configs_load(const char *topo, const char *ccl_path, kb_plugins *ps, kb_config *cfg,
                      kb_ccl_cfg *ccl, kb_errbuf *eb);

/* Applies one --set KEY=VALUE: ccl.* keys to ccl, every other key to the machine's cfg. */
int kbcl_config_set(kb_config *cfg, kb_ccl_cfg *ccl, const char *assignment, kb_errbuf *eb);

/*
 * Parses one `kbcl run` option at argv[*i] into job (advancing *i past its value). Returns 1
 * if it was a job option, 0 if not, KB_ERR_USAGE on a missing value or one --set/--param too
 * many (message in eb).
 */
int kbcl_job_option(kbcl_job *job, int argc, char **argv, int *i, kb_errbuf *eb);

/* Resolves the job and runs every check `kbcl run` makes before it simulates, without
 * simulating: its files (or job->base_*) and the model file, the bench, device, options,
 * --param values, --set assignments and the cross-key validation of the machine and the
 * collective library. Returns 0 (res holds the configuration; free with kbcl_result_fini)
 * or an error code with the message in eb. */
int kbcl_job_prepare(const kbcl_job *job, kbcl_result *res, kb_errbuf *eb);
/* Resolves (kbcl_job_prepare) and runs the job. Returns 0 or a library error code (message in
 * eb; for a deadlock the whole report is in res->rep.report; for KB_ERR_NOMEM it ends with what
 * to try instead). Free with kbcl_result_fini. */
int kbcl_job_run(const kbcl_job *job, kbcl_result *res, kb_errbuf *eb);
void kbcl_result_fini(kbcl_result *res);

/* The result as JSON text (cJSON_free it). Identical runs give identical text apart from the
 * wall-clock fields wall_ms and replay.ms. */
char *kbcl_result_json(const kbcl_result *res);

/* Prints the result table (`kbcl run` output) to f. */
void kbcl_result_print(FILE *f, const kbcl_result *res, int quiet);

/* Writes text + "\n" to path through a temporary file and rename (never half-written). */
int kbcl_write_atomic(const char *path, const char *text, kb_errbuf *eb);
/* write(2) until all n bytes are out (retrying EINTR); 0 or -1. */
int kbcl_write_all(int fd, const void *buf, size_t n);

/* 1 when paths a and b (either may be NULL) name one existing file (the same device and
 * inode: links and other spellings included), else 0. */
int kbcl_same_file(const char *a, const char *b);
/* Checks an output path against the inputs of a command before anything is written: a
 * KB_ERR_USAGE naming both when out (may be NULL) is one of ins[0..n) (entries may be NULL),
 * or naming out and why when it is a folder or its folder is missing, not a folder or not
 * writable. `what` names the output in the message ("--json"). */
int kbcl_check_output(const char *what, const char *out, const char *const *ins, int n,
                      kb_errbuf *eb);

/* ---- progress (progress.c) ---- */

/* m:ss, or h:mm:ss from an hour on, of s seconds (rounded; negative counts as 0). */
void kbcl_fmt_dur(char *b, size_t n, double s);
/*
 * Whether `kbcl run` shows its progress line: never with --quiet (quiet != 0); else env, the
 * value of KBCL_PROGRESS, decides when it is "0" (off) or "1" (on, terminal or not: scripts
 * and tests); else only when stderr is a terminal.
 */
int kbcl_progress_wanted(int quiet, const char *env, int stderr_is_tty);
/*
 * The progress line (no carriage return, no newline) for what p holds after elapsed_s
 * seconds, into buf (always NUL-terminated when n > 0); returns its length. It begins with
 * "kbcl run [m:ss] " and then says the phase: "phase 1: T simulated, N events" (with the
 * device set-up's stage, "building OpenCL program", while it overlaps), "phase 2: replay
 * flush F (R records): batch B/NB" (or "planning", "finishing"), "waiting for the Phase-2
 * device: ...", "verifying the outputs", or "setting up the run".
 */
struct kb_progress;
size_t kbcl_progress_format(char *buf, size_t n, struct kb_progress *p, double elapsed_s);
/*
 * A thread that, from delay_s seconds on, redraws that line on fd every 250 ms ("\r", the
 * line cut to the terminal's width, "\033[K"); kbcl_ticker_stop ends it and clears the line,
 * so that whatever is printed next starts on a clean line. 0 or KB_ERR_NOMEM (then *out is
 * NULL and the run goes on without a line). p must outlive the ticker.
 */
typedef struct kbcl_ticker kbcl_ticker;
int kbcl_ticker_start(kbcl_ticker **out, struct kb_progress *p, int fd, double delay_s);
void kbcl_ticker_stop(kbcl_ticker *t); /* NULL: no-op */

/*
 * A sweep's remaining wall time in seconds from what it knows now: `not_started` points
 * waiting, `jobs` run at a time, `nmeasured` finished points that took `measured_s` seconds
 * together, and `nrunning` points running for running_s[i] seconds each. With mean =
 * measured_s / nmeasured, a running point has max(0, mean - running_s[i]) left and a waiting
 * one mean; the estimate is the largest of: the work left spread over the jobs, the longest
 * left of a running point, and mean when a point still waits. -1 (no estimate) when nothing
 * has been measured, or when points are running, none waits and every one of them has run
 * past the mean (a point far longer than the others: saying 0:00 would be wrong).
 */
double kbcl_sweep_eta(int not_started, int jobs, int nmeasured, double measured_s,
                      const double *running_s, int nrunning);

/* Subcommands implemented outside main.c. */
int kbcl_cmd_bench_self(int argc, char **argv);
int kbcl_cmd_devices(int argc, char **argv);
int kbcl_cmd_devd(int argc, char **argv);
/* Starts a device server for dev (gpu, cpu, auto) in the background unless one listens, or
 * KBCL_DEVD=off / KBCL_DEVD_AUTO=0; quiet, returns once it listens (app/cli/devd.c). */
void kbcl_devd_autostart(const char *dev);

/* Phase-2 section of bench-self: replay throughput of `device`'s backend, as JSON (*out,
 * caller deletes) and a printed table. quick = smaller sizes. */
struct cJSON;
int kbcl_bench_phase2(const char *device, int quick, struct cJSON **out, kb_errbuf *eb);
int kbcl_cmd_sweep(int argc, char **argv);
int kbcl_cmd_report(int argc, char **argv);
/* kbcl validate DATA.csv (validate.c): measured collective times against kbcl's predictions;
 * the exit status as documented in its usage (0, 1 above --threshold, 2, or a run's). */
int kbcl_cmd_validate(int argc, char **argv);

/*
 * The input-reading halves of `kbcl sweep` and `kbcl report` on their own, for tests and the
 * fuzz targets (tests/fuzz/): nothing runs and no file is written.
 *
 * kbcl_sweep_plan_load loads and checks a sweep file as `kbcl sweep` does before its first
 * point (plugins NULL: a file with plugins: is an error); 0, or an error code with
 * "FILE:LINE:COL: ..." in eb. kbcl_sweep_resume_check reads an output file as --resume does
 * (JSON Lines when its name ends in .jsonl or .json, else CSV) without changing it: 0 when
 * --resume would go on, *ndone the points the file already holds and *keep the bytes it
 * keeps (all but a partial last line, which it cuts).
 */
typedef struct kbcl_sweep_plan kbcl_sweep_plan;
int kbcl_sweep_plan_load(const char *file, kb_plugins *plugins, kbcl_sweep_plan **out,
                         kb_errbuf *eb);
int kbcl_sweep_plan_npoints(const kbcl_sweep_plan *p);
void kbcl_sweep_plan_free(kbcl_sweep_plan *p);
int kbcl_sweep_resume_check(kbcl_sweep_plan *p, const char *out, int *ndone, size_t *keep,
                            kb_errbuf *eb);
/* The page `kbcl report IN` writes, as text in *html (free it), or an error code. */
int kbcl_report_render(const char *in, char **html, kb_errbuf *eb);

/*
 * The MPI side of `kbcl sweep` (sweep_mpi.c; refusals without KBCL_HAVE_MPI). The sweep hands it
 * opaque fixed-size outcomes: `run` computes one point (on any rank; on rank 0 in a helper
 * thread) and `finish` records one (rank 0's main thread only).
 */
typedef struct kbcl_sweep_io {
    void *ctx;
    size_t outcome_size;        /* bytes of one outcome, at most PIPE_BUF */
    void (*run)(void *ctx, int point, void *outcome);
    int (*finish)(void *ctx, const void *outcome);  /* nonzero: hand out no more points */
} kbcl_sweep_io;

/* 1 (MPI initialised, *rank and *size set) when an MPI launcher started this process as one
 * of several ranks; 0 to run locally; < 0 when it did but kbcl was built without MPI. */
int kbcl_sweep_mpi_init(int *rank, int *size, kb_errbuf *eb);
/* Gives every rank rank 0's points (*points is malloc'd on the other ranks; free it), or
 * *npoints = -1 on all ranks when any rank passed ok = 0. */
int kbcl_sweep_mpi_share(int **points, int *npoints, int ok, kb_errbuf *eb);
/* Runs the points over the ranks (rank 0 hands them out one at a time). Collective. */
int kbcl_sweep_mpi_run(const kbcl_sweep_io *io, const int *points, int npoints, kb_errbuf *eb);
void kbcl_sweep_mpi_fini(void);
/* After kbcl_sweep_mpi_init returned 1: net becomes the ranks' collective over
 * MPI_COMM_WORLD (kb_ctx_opts.net), for `kbcl run` under mpirun. */
struct kb_psim_net;
void kbcl_mpi_net(struct kb_psim_net *net, int rank, int size);
/* The CPUs this process may run on: the online ones, or fewer where its affinity is bound (a
 * launcher's binding, taskset, a cpuset); at least 1. What --threads auto means. */
int kbcl_usable_cpus(void);

#endif
