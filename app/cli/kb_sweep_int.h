/*
 * kb_sweep_int.h — what the files of `kbcl sweep` share among themselves and no one else:
 * the plan as sweep_plan.c loads it (axes, excludes, the points), the outcome of one point as
 * a worker sends it back, the state of a running sweep (sw_ctx), and the functions that one of
 * sweep.c, sweep_plan.c, sweep_run.c and sweep_out.c calls in another (kbcl_sweep_*). Its
 * limits are the grid's: at most SW_MAX_AXES axes, SW_MAX_POINTS points and SW_MAX_JOBS
 * workers. Internal to app/cli/: the API for tests, fuzz targets and the MPI side is kb_cli.h.
 */
#ifndef KB_SWEEP_INT_H
#define KB_SWEEP_INT_H

#include <limits.h>
#include <stddef.h>

#include "kb_cli.h"

#define SW_MAX_AXES 16
#define SW_MAX_POINTS 1000000
#define SW_MAX_JOBS 256

enum { AX_ALGORITHM, AX_WORLD_SIZE, AX_N_ELEM, AX_SIZE, AX_BUFFER_KIND, AX_OP, AX_DTYPE,
       AX_DEVICE, AX_PARAM, AX_CONFIG };
/* The bench options before AX_DEVICE are kept in sw_plan.fixed when given as top-level keys
 * (device has a field of its own); every one before AX_PARAM is also an axis name. */
#define SW_NFIXED AX_DEVICE
#define SW_NSHORTHAND AX_PARAM

/* Bench options that are both top-level keys and axis names, in AX_* order (sweep_plan.c). */
extern const char *const kbcl_sweep_shorthand_keys[SW_NSHORTHAND];
/* The axes for messages. */
#define SW_AXES_HELP "algorithm, world_size, n_elem, size, buffer_kind, op, dtype, device, "    \
                     "param.NAME or " \
                     "a config key such as system.sips.count"

typedef struct sw_axis {
    char *name;     /* column name, as written under grid: */
    int kind;       /* AX_* */
    int nvals;
    char **vals;    /* scalar text of each value */
    char **assign;  /* "key=value" per value for AX_PARAM / AX_CONFIG, else NULL */
} sw_axis;

/* One exclude: entry; want[a] == NULL means any value of axis a. */
typedef struct sw_excl {
    unsigned char *want[SW_MAX_AXES];
} sw_excl;

typedef struct kbcl_sweep_plan {
    char *file;
    char *bench, *device, *topology, *ccl, *model;
    int split_cols; /* the bench reports the decoder time split: its columns are written */
    char *fixed[SW_NFIXED];            /* algorithm, world_size, n_elem, size, buffer_kind,
                                        * op, dtype */
    int verify;
    int replay_cuts;                   /* points pipeline their replay (kbcl_sweep_point_job) */
    char *sets[KBCL_MAX_SETS];         /* "key=value" */
    int nsets;
    char *params[KBCL_MAX_SETS];       /* "name=value" */
    int nparams;
    sw_axis ax[SW_MAX_AXES];
    int nax;
    sw_excl *excl;
    int nexcl;
    int npoints;
    int *pt;                           /* npoints x nax value indices */
    char *plugin_files[KBCL_MAX_PLUGIN_ARGS]; /* plugins:, resolved against the file's folder */
    int nplugin_files;
    kb_plugins *plugins;               /* borrowed: where they load; every point's job uses it */
    /* the topology and ccl files as loaded (ccl's plugins applied), for checking the points
     * without loading them once per point */
    kb_config *base_cfg;
    kb_ccl_cfg *base_ccl;
} sw_plan;

/* What a worker sends back for one point: plain bytes, under PIPE_BUF so one write is atomic. */
typedef struct sw_outcome {
    int point;
    int rc;                            /* 0 or a KB_ERR_* code; SW_CRASH for a dead worker */
    int verified;                      /* 1, 0, -1 (not checked) */
    int have_size, have_algbw, have_busbw, have_split;
    int have_bound;                    /* the run measured a bound (kb_bench_result.bound_*) */
    double size_bytes, sim_time_ns, algbw, busbw, wall_ms;
    double bound_ns, efficiency;       /* efficiency: kb_bench_efficiency, as `kbcl run` */
    double split[5];                   /* compute_ns memory_ns comm_ns launch_ns tokens_per_s */
    int have_roofline;                 /* the bench has a roofline (kb_bench_result.roofline) */
    double roofline_ns, roofline_efficiency;
    char roofline_bound[8];            /* kb_roofline_bound_name: compute, memory, comm */
    unsigned long long events;
    char bound_resource[sizeof ((kb_bench_result *)0)->bound_resource];
    char msg[sizeof(kb_errbuf)];
} sw_outcome;

_Static_assert(sizeof(sw_outcome) <= PIPE_BUF, "a worker's outcome is one atomic pipe write");

#define SW_CRASH 1

struct sw_worker;

typedef struct sw_ctx {
    sw_plan *plan;
    const char *out_path;              /* NULL = stdout */
    int fd, jsonl, quiet, tty;
    unsigned char *done;               /* per point: a row exists */
    int ndone_before, nfinished, npending;
    int n_ok, n_verify_fail, n_err;
    int n_nofit;              /* points too large for their device (KB_ERR_NOFIT): not errors */
    double t0;
    int bar_shown;
    int write_failed;
    kb_errbuf werr;
    /* for the ETA: points run at a time, the finished points' own wall times, and the local
     * workers (NULL under MPI, whose running points this rank does not see) */
    int slots;
    int nmeasured;
    double measured_s;
    const struct sw_worker *workers;
    int nworkers;
} sw_ctx;

/* The decoder_layer time split (docs/decoder.md): columns of a sweep whose bench takes a
 * model file, between wall_ms and verified (sweep_out.c). */
#define SW_NSPLIT 5
extern const char *const kbcl_sweep_split_cols[SW_NSPLIT];

/* sweep_plan.c: helpers */
char *kbcl_sweep_asprintf(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
/* Whether s is a whole decimal integer that fits in a long long. */
int kbcl_sweep_is_int_text(const char *s);

/* sweep_plan.c: a point's values, device and job */
const char *kbcl_sweep_point_val(const sw_plan *p, int point, int a);
const char *kbcl_sweep_point_device(const sw_plan *p, int point);
int kbcl_sweep_point_uses_opencl(const sw_plan *p, int point);
void kbcl_sweep_point_job(const sw_plan *p, int point, kbcl_job *job);
int kbcl_sweep_plan_check_points(const sw_plan *p, kb_errbuf *eb);

/* sweep_out.c: rows, the output file, --resume */
const char *kbcl_sweep_status_name(int rc);
char *kbcl_sweep_format_row(const sw_plan *p, const sw_outcome *o, int jsonl);
int kbcl_sweep_out_is_jsonl(const char *path);
int kbcl_sweep_check_out(const sw_ctx *c, const char *plan_file, const char *const *plugins,
                         int nplugins, kb_errbuf *eb);
int kbcl_sweep_output_open(sw_ctx *c, int resume, kb_errbuf *eb);

/* sweep_run.c: running points, progress */
double kbcl_sweep_now_s(void);
void kbcl_sweep_progress_bar(sw_ctx *c);
void kbcl_sweep_progress_clear(sw_ctx *c);
void kbcl_sweep_run_point_cb(void *ctx, int point, void *outcome);
int kbcl_sweep_finish_point(void *ctx, const void *outcome);
int kbcl_sweep_run_local(sw_ctx *c, const int *pending, int npending, int jobs, kb_errbuf *eb);

#endif
