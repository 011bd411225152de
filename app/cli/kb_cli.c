/*
 * kb_cli — jobs, results, JSON and atomic writes shared by the kbcl subcommands (kb_cli.h).
 */
#include "kb_cli.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "kb_atomic_file.h"
#include "kb_opencl.h"
#include "kb_ccl.h"
#include "kb_ccl_reg.h"
#include "kb_dist_algo.h"
#include "kb_model.h"
#include "kb_psim.h"
#include "kb_tl_q.h"
#include "kb_trace.h"
#include "kb_wire.h"

int kbcl_exit_code(int rc)
{
    switch (rc) {
    case 0:
        return KBCL_EXIT_OK;
    case KB_ERR_VERIFY:
        return KBCL_EXIT_VERIFY;
    case KB_ERR_CONFIG:
    case KB_ERR_USAGE:
    case KB_ERR_IO:
        return KBCL_EXIT_USAGE;
    case KB_ERR_DEVICE:
    case KB_ERR_NOFIT: /* the device could run it, were it larger */
        return KBCL_EXIT_DEVICE;
    default:
        return KBCL_EXIT_SIM;
    }
}

int kbcl_job_option(kbcl_job *job, int argc, char **argv, int *i, kb_errbuf *eb)
{
    static const struct {
        const char *opt;
        size_t off;
    } str_opts[] = {
        { "--bench", offsetof(kbcl_job, bench) },
        { "--topology", offsetof(kbcl_job, topology) },
        { "--ccl", offsetof(kbcl_job, ccl) },
        { "--algorithm", offsetof(kbcl_job, algorithm) },
        { "--world-size", offsetof(kbcl_job, world_size) },
        { "--n-elem", offsetof(kbcl_job, n_elem) },
        { "--size", offsetof(kbcl_job, size) },
        { "--root", offsetof(kbcl_job, root) },
        { "--op", offsetof(kbcl_job, op) },
        { "--dtype", offsetof(kbcl_job, dtype) },
        { "--model", offsetof(kbcl_job, model) },
        { "--buffer-kind", offsetof(kbcl_job, buffer_kind) },
        { "--device", offsetof(kbcl_job, device) },
        { "--trace", offsetof(kbcl_job, trace_path) },
        { "--trace-filter", offsetof(kbcl_job, trace_filter) },
        { "--trace-window", offsetof(kbcl_job, trace_window) },
        { "--replay-cut", offsetof(kbcl_job, replay_cut) },
        { "--threads", offsetof(kbcl_job, threads) },
    };
    const char *o = argv[*i];
    const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;

    if (!strcmp(o, "--verify-data")) {
        job->verify = 1;
        return 1;
    }
    for (size_t k = 0; k < sizeof str_opts / sizeof str_opts[0]; k++) {
        if (strcmp(o, str_opts[k].opt))
            continue;
        if (!v)
            return kb_err_set(eb, KB_ERR_USAGE, "%s needs a value", o);
        *(const char **)((char *)job + str_opts[k].off) = v;
        (*i)++;
        return 1;
    }
    if (!strcmp(o, "--set") || !strcmp(o, "--param")) {
        int is_set = o[2] == 's';
        if (!v)
            return kb_err_set(eb, KB_ERR_USAGE, "%s needs a value", o);
        if ((is_set ? job->nsets : job->nparams) >= KBCL_MAX_SETS)
            return kb_err_set(eb, KB_ERR_USAGE, "too many %s options (at most %d)", o,
                              KBCL_MAX_SETS);
        if (is_set)
            job->sets[job->nsets++] = v;
        else
            job->params[job->nparams++] = v;
        (*i)++;
        return 1;
    }
    return 0;
}

const char *kbcl_default_config(const char *name, char *buf, size_t n)
{
    const char *dir = getenv("KBCL_CONFIG_DIR");
    if (dir && *dir) {
        snprintf(buf, n, "%s/%s", dir, name);
        return buf;
    }
#ifdef KBCL_SOURCE_DIR
    snprintf(buf, n, "%s/configs/%s", KBCL_SOURCE_DIR, name);
    if (access(buf, R_OK) == 0)
        return buf;
#endif
    /* an installed kbcl: PREFIX/bin/kbcl reads PREFIX/share/kbcl/configs */
    {
        char exe[4096];
        ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
        char *slash;
        if (len > 0) {
            exe[len] = '\0';
            if ((slash = strrchr(exe, '/')) != NULL) {
                *slash = '\0';
                snprintf(buf, n, "%s/../share/kbcl/configs/%s", exe, name);
                if (access(buf, R_OK) == 0)
                    return buf;
            }
        }
    }
    return NULL;
}

static int parse_kv(const char *s, char *key, size_t kn, const char **val)
{
    const char *eq = strchr(s, '=');
    if (!eq || eq == s || (size_t)(eq - s) >= kn)
        return -1;
    memcpy(key, s, (size_t)(eq - s));
    key[eq - s] = 0;
    *val = eq + 1;
    return 0;
}

int kbcl_parse_size(const char *s, int64_t *bytes)
{
    int64_t v = 0;
    int shift = 0;
    const char *p = s;
    if (!s || *p < '0' || *p > '9')
        return -1;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (v > (INT64_C(1) << 62) / 10)
            return -1;
        v = v * 10 + (*p - '0');
    }
    switch (*p) {
    case 0:
        break;
    case 'K': case 'k':
        shift = 10;
        break;
    case 'M': case 'm':
        shift = 20;
        break;
    case 'G': case 'g':
        shift = 30;
        break;
    default:
        return -1;
    }
    if (shift && p[1])
        return -1;
    /* at most 2^62 bytes: far above any machine, and far below int64 overflow */
    if (v == 0 || v > (INT64_C(1) << (62 - shift)))
        return -1;
    *bytes = v << shift;
    return 0;
}

void kbcl_result_fini(kbcl_result *res)
{
    kb_run_report_fini(&res->rep);
    kb_config_fini(&res->cfg);
}

int kbcl_plugins_load_cli(kb_plugins *ps, const char *const *files, int n, kb_errbuf *eb)
{
    const char *env = getenv("KBCL_PLUGIN_PATH");
    int rc = 0;

    if (env && *env && (rc = kb_plugins_load_list(ps, env, eb)) != 0)
        kb_err_prefix(eb, "KBCL_PLUGIN_PATH");
    for (int i = 0; rc == 0 && i < n; i++)
        if ((rc = kb_plugins_load(ps, files[i], eb)) != 0)
            kb_err_prefix(eb, "--plugin");
    return rc;
}

/* Adds "ccl.algorithms.NAME.KEY=VALUE" to ccl. */
static int add_entry_key(kb_ccl_cfg *ccl, const char *name, const char *key, const char *value,
                         kb_errbuf *eb)
{
    char buf[256];
    snprintf(buf, sizeof buf, "ccl.algorithms.%s.%s=%s", name, key, value);
    return kb_ccl_config_set(ccl, buf, eb);
}

int kbcl_ccl_plugins(kb_plugins *ps, kb_ccl_cfg *ccl, kb_errbuf *eb)
{
    const kb_ccl_reg *reg;
    int rc = 0;

    if (!ps) {
        if (ccl->nplugins)
            return kb_err_set(eb, KB_ERR_CONFIG, "%s: plugins: %s: this program loads no "
                              "plugins", ccl->path, ccl->plugins[0]);
        return 0;
    }
    for (int i = 0; i < ccl->nplugins; i++)
        if ((rc = kb_plugins_load(ps, ccl->plugins[i], eb)) != 0) {
            kb_err_prefix(eb, "%s: plugins", ccl->path);
            return rc;
        }
    reg = kb_plugins_ccl(ps);
    ccl->reg = reg;
    /* the entries with a rank = PE kernel first, then those with a rank = SIP form only */
    for (int model = 0; model < 2; model++) {
        const kb_ccl_algo_impl *a;
        for (int i = 0; (a = kb_ccl_reg_algo_at(reg, i)) != NULL; i++) {
            const char *name = a->module;
            if ((a->kernel == NULL) != model || kb_ccl_config_find(ccl, name))
                continue; /* the other pass's, or ccl.yaml's entry wins */
            if ((rc = add_entry_key(ccl, name, "module", name, eb)) != 0 ||
                (a->kernel && (rc = add_entry_key(ccl, name, "topology", a->topology, eb)) != 0)) {
                kb_err_prefix(eb, "plugin algorithm '%s': cannot add its ccl.yaml entry", name);
                return KB_ERR_CONFIG;
            }
        }
    }
    return 0;
}

int kbcl_configs_load(const char *topo, const char *ccl_path, kb_plugins *ps, kb_config *cfg,
                      kb_ccl_cfg *ccl, kb_errbuf *eb)
{
    char buf[2][4096];
    int rc = 0;

    if (!topo)
        topo = kbcl_default_config("topology.yaml", buf[0], sizeof buf[0]);
    if (!ccl_path)
        ccl_path = kbcl_default_config("ccl.yaml", buf[1], sizeof buf[1]);
    if ((cfg && topo && (rc = kb_config_load_topology(cfg, topo, eb)) != 0) ||
        (ccl && ccl_path && (rc = kb_ccl_config_load(ccl, ccl_path, eb)) != 0))
        return rc == KB_ERR_IO ? KB_ERR_USAGE : KB_ERR_CONFIG;
    return ccl ? kbcl_ccl_plugins(ps, ccl, eb) : 0;
}

int kbcl_config_set(kb_config *cfg, kb_ccl_cfg *ccl, const char *assignment, kb_errbuf *eb)
{
    const char *k = assignment;
    while (*k == ' ' || *k == '\t')
        k++;
    return strncmp(k, "ccl.", 4) == 0 ? kb_ccl_config_set(ccl, assignment, eb)
                                      : kb_config_set(cfg, assignment, eb);
}

/* --replay-cut RECORDS into *cut (SIZE_MAX = no cuts; unset: 0, the context's default). */
static int parse_cut(const char *s, size_t *cut, kb_errbuf *eb)
{
    char *end;
    unsigned long long v;
    *cut = 0;
    if (!s)
        return 0;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-')
        return kb_err_set(eb, KB_ERR_USAGE, "--replay-cut %s: a record count (0 = no cuts)", s);
    *cut = v == 0 || v > SIZE_MAX ? SIZE_MAX : (size_t)v;
    return 0;
}

int kbcl_usable_cpus(void)
{
    cpu_set_t set;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    int n = online < 1 ? 1 : online > INT_MAX ? INT_MAX : (int)online;
    /* a launcher's binding (mpirun binds each of 2 ranks to one core), taskset, a cgroup's
     * cpuset: the process may use fewer CPUs than are online */
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) >= 1 &&
        CPU_COUNT(&set) < n)
        n = CPU_COUNT(&set);
    return n;
}

/* --threads N|auto: Phase-1 threads, 0 (the sequential engine) .. KB_CTX_MAX_THREADS, or auto:
 * the CPUs this process may use (kbcl_usable_cpus), at most KB_CTX_MAX_THREADS (NULL: 0). */
static int parse_threads(const char *s, int *threads, kb_errbuf *eb)
{
    char *end;
    long v;
    *threads = 0;
    if (!s)
        return 0;
    if (!strcmp(s, "auto")) {
        int n = kbcl_usable_cpus();
        *threads = n > KB_CTX_MAX_THREADS ? KB_CTX_MAX_THREADS : n;
        return 0;
    }
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < 0 || v > KB_CTX_MAX_THREADS)
        return kb_err_set(eb, KB_ERR_USAGE, "--threads %s: Phase-1 threads, 0 (one engine, no "
                          "partitions) to %d, or auto (the CPUs this process may use)", s,
                          KB_CTX_MAX_THREADS);
    *threads = (int)v;
    return 0;
}

/* One side of --trace-window in ns into picoseconds; "" = dflt. 0 or -1. */
static int parse_window_end(const char *s, size_t n, kb_time dflt, kb_time *out)
{
    char buf[64], *end;
    double v;
    if (n == 0) {
        *out = dflt;
        return 0;
    }
    if (n >= sizeof buf || s[0] == '-' || s[0] == '+' || s[0] == ' ')
        return -1;
    memcpy(buf, s, n);
    buf[n] = 0;
    errno = 0;
    v = strtod(buf, &end);
    /* below a year of simulated time: far past any run, far inside kb_time's range */
    if (errno || end == buf || *end || !(v >= 0 && v <= 3.2e16))
        return -1;
    *out = kb_time_from_ns(v);
    return 0;
}

#define KBCL_WINDOW_HELP "expected START:END in simulated ns with START < END, either side " \
                         "may be left out (e.g. 0:5000, 1000: or :2500.5)"

/* --trace-filter and --trace-window into tr. */
static int trace_options(const kbcl_job *job, kb_trace *tr, kb_errbuf *eb)
{
    int rc;
    if (job->trace_filter && (rc = kb_trace_set_filter(tr, job->trace_filter, eb)) != 0) {
        kb_err_prefix(eb, "--trace-filter%s%s", *job->trace_filter ? " " : "",
                      job->trace_filter);
        return rc;
    }
    if (job->trace_window) {
        const char *w = job->trace_window, *colon = strchr(w, ':');
        kb_time t0, t1;
        if (!colon || strchr(colon + 1, ':') ||
            parse_window_end(w, (size_t)(colon - w), 0, &t0) != 0 ||
            parse_window_end(colon + 1, strlen(colon + 1), KB_TIME_MAX, &t1) != 0 || t0 >= t1)
            return kb_err_set(eb, KB_ERR_USAGE, "--trace-window %s: " KBCL_WINDOW_HELP, w);
        kb_trace_set_window(tr, t0, t1);
    }
    return 0;
}

/* --size into res->args.size_bytes: a shorthand for the tile length. The bench maps the bytes
 * through its collective's nccl-tests size (and a rank's shards), which only it knows. */
static int job_size(const kbcl_job *job, kbcl_result *res, const char *bench_name,
                    kb_errbuf *eb)
{
    if (!job->size)
        return 0;
    if (job->n_elem)
        return kb_err_set(eb, KB_ERR_USAGE, "--size and --n-elem both give the message "
                          "size: use one");
    if (kbcl_parse_size(job->size, &res->args.size_bytes) != 0)
        return kb_err_set(eb, KB_ERR_USAGE, "--size %s: " KBCL_SIZE_HELP, job->size);
    if (res->bench->size_elem_bytes < 1)
        return kb_err_set(eb, KB_ERR_USAGE, "--size: bench '%s' takes no size (ccl_allreduce "
                          "does; its sizes are --param options, kbcl list shows them)",
                          bench_name);
    if (res->args.size_bytes % res->bench->size_elem_bytes)
        return kb_err_set(eb, KB_ERR_USAGE, "--size %s: not a whole number of %d-byte "
                          "elements", job->size, res->bench->size_elem_bytes);
    return 0;
}

/* The options a bench does not take refused by name: the collective ones for a bench that
 * runs no collective, --model for one that reads no model. */
static int job_refuse_options(const kbcl_job *job, const kbcl_result *res,
                              const char *bench_name, kb_errbuf *eb)
{
    if (!kb_bench_takes_collective(res->bench)) {
        const char *opt[] = { "--algorithm", "--world-size", "--n-elem", "--buffer-kind",
                              "--root", "--op", "--dtype" };
        const char *val[] = { job->algorithm, job->world_size, job->n_elem, job->buffer_kind,
                              job->root, job->op, job->dtype };
        for (size_t i = 0; i < sizeof opt / sizeof opt[0]; i++)
            if (val[i])
                return kb_err_set(eb, KB_ERR_USAGE, "%s: bench '%s' runs no collective and "
                                  "takes no %s (its options are --param ones: kbcl list "
                                  "shows them)", opt[i], bench_name, opt[i]);
    }
    if (job->model && !kb_bench_takes_model(res->bench))
        return kb_err_set(eb, KB_ERR_USAGE, "--model: bench '%s' takes no model file "
                          "(decoder_layer does)", bench_name);
    return 0;
}

/* res->args.p: the bench's defaults, then each --param NAME=VALUE (an integer or one of the
 * parameter's value names) within its range. */
static int job_params(const kbcl_job *job, kbcl_result *res, kb_errbuf *eb)
{
    for (int i = 0; i < res->bench->nparams; i++)
        res->args.p[i] = res->bench->params[i].dflt;
    for (int i = 0; i < job->nparams; i++) {
        char key[64];
        const char *val;
        int64_t x;
        int idx;
        const kb_bench_param *bp;
        if (parse_kv(job->params[i], key, sizeof key, &val) != 0 ||
            (idx = kb_bench_param_index(res->bench, key)) < 0)
            return kb_err_set(eb, KB_ERR_USAGE, "--param %s: expected NAME=INTEGER with NAME a "
                              "parameter of '%s' (kbcl list shows them)", job->params[i],
                              res->bench->name);
        bp = &res->bench->params[idx];
        if (kb_bench_param_parse(res->bench, idx, val, &x) != 0) {
            char names[256];
            kb_bench_param_names(res->bench, idx, names, sizeof names);
            return kb_err_set(eb, KB_ERR_USAGE, "--param %s: expected an integer in [%lld, %lld] "
                              "for %s%s%s", job->params[i], (long long)bp->min,
                              (long long)bp->max, key, names[0] ? " or one of " : "", names);
        }
        if (x < bp->min || x > bp->max)
            return kb_err_set(eb, KB_ERR_USAGE, "--param %s: %s = %lld is out of range [%lld, "
                              "%lld]", job->params[i], key, (long long)x, (long long)bp->min,
                              (long long)bp->max);
        res->args.p[idx] = x;
    }
    return 0;
}

/* The collective options, shorthands for ccl.yaml overrides of the chosen algorithm: --algorithm
 * as ccl.defaults.algorithm, the others as keys of its entry. */
static int job_collective_options(const kbcl_job *job, kbcl_result *res, kb_errbuf *eb)
{
    char setbuf[256];
    const char *an = job->algorithm ? job->algorithm : res->ccl.defaults.algorithm;
    const char *keys[7] = { NULL, "world_size", "n_elem", "buffer_kind", "root", "op",
                            "dtype" };
    const char *vals[7] = { job->algorithm, job->world_size, job->n_elem, job->buffer_kind,
                            job->root, job->op,
                            kb_bench_takes_model(res->bench) ? NULL : job->dtype };
    for (int i = 0; i < 7; i++) {
        if (!vals[i])
            continue;
        if (i == 0 && !kb_ccl_config_find(&res->ccl, vals[i]))
            return kb_err_set(eb, KB_ERR_USAGE, "--algorithm %s: no such entry in ccl.yaml "
                              "(kbcl list shows them)", vals[i]);
        if (i == 0)
            snprintf(setbuf, sizeof setbuf, "ccl.defaults.algorithm=%s", vals[i]);
        else
            snprintf(setbuf, sizeof setbuf, "ccl.algorithms.%s.%s=%s", an, keys[i], vals[i]);
        if (kb_ccl_config_set(&res->ccl, setbuf, eb) != 0)
            return KB_ERR_USAGE;
    }
    return 0;
}

/* The configuration as the run will have it: decoder_layer's default algorithm, --set in
 * order, the collective options, then the checks of both files. */
static int job_configure(const kbcl_job *job, kbcl_result *res, kb_errbuf *eb)
{
    int rc;

    /* decoder_layer runs its process group on hierarchical_allreduce_sip whatever the default
     * algorithm is: make that the default so the default's world size (ring_allreduce_tcm's
     * 256 ranks) does not refuse machines the layer runs on */
    if (kb_bench_takes_model(res->bench) && !job->algorithm &&
        kb_ccl_config_find(&res->ccl, "hierarchical_allreduce_sip") &&
        kb_ccl_config_set(&res->ccl, "ccl.defaults.algorithm=hierarchical_allreduce_sip",
                          eb) != 0)
        return KB_ERR_USAGE;
    for (int i = 0; i < job->nsets; i++)
        if (kbcl_config_set(&res->cfg, &res->ccl, job->sets[i], eb) != 0)
            return KB_ERR_USAGE;
    if ((rc = job_collective_options(job, res, eb)) != 0)
        return rc;
    if (kb_config_validate(&res->cfg, eb) != 0 ||
        kb_ccl_config_validate(&res->ccl, &res->cfg.topo, eb) != 0)
        return KB_ERR_USAGE;
    return 0;
}

/* For a bench that reads a model: --model given, --dtype one of its number formats, the
 * model file as the bench reads it (unless the caller checked it already). */
static int job_model(const kbcl_job *job, const char *bench_name, kb_errbuf *eb)
{
    kb_model_cfg mc;
    int rc;

    if (!job->model)
        return kb_err_set(eb, KB_ERR_USAGE, "%s needs --model FILE (e.g. "
                          "configs/models/gemma2-2b.yaml)", bench_name);
    if (job->dtype && kb_qfmt_from_name(job->dtype) < 0)
        return kb_err_set(eb, KB_ERR_USAGE, "--dtype %s: %s takes f16, bf16, int8, mxint8, "
                          "fp8e4m3 or fp8e5m2", job->dtype, bench_name);
    if (!job->model_checked && (rc = kb_model_load(&mc, job->model, eb)) != 0)
        return rc == KB_ERR_IO ? KB_ERR_USAGE : KB_ERR_CONFIG;
    return 0;
}

int kbcl_job_prepare(const kbcl_job *job, kbcl_result *res, kb_errbuf *eb)
{
    const char *bench_name = job->bench ? job->bench : "ccl_allreduce";
    const char *device_name = job->device ? job->device : "ref";
    size_t cut;
    int threads;
    int rc, dev;

    memset(res, 0, sizeof *res);
    if (job->base_cfg)
        res->cfg = *job->base_cfg;
    else
        kb_config_defaults(&res->cfg);
    if (job->base_ccl)
        res->ccl = *job->base_ccl;
    else
        kb_ccl_config_defaults(&res->ccl);
    /* the configuration first: ccl.yaml's plugins may add the bench */
    if ((rc = kbcl_configs_load(job->topology, job->ccl, job->plugins,
                                job->base_cfg ? NULL : &res->cfg,
                                job->base_ccl ? NULL : &res->ccl, eb)) != 0)
        return rc;
    if (!job->trace_path && (job->trace_filter || job->trace_window))
        return kb_err_set(eb, KB_ERR_USAGE, "%s: there is no trace to limit (add --trace FILE)",
                          job->trace_filter ? "--trace-filter" : "--trace-window");
    res->bench = kb_plugins_find_bench(job->plugins, bench_name);
    if (!res->bench)
        return kb_err_set(eb, KB_ERR_USAGE, "unknown bench '%s' (kbcl list shows them)",
                          bench_name);
    dev = kb_device_from_name(device_name);
    if (dev < 0)
        return kb_err_set(eb, KB_ERR_USAGE, "unknown device '%s' (auto, gpu, cpu, ref, none)",
                          device_name);
    snprintf(res->device, sizeof res->device, "%s", device_name);
    res->args.verify = job->verify;
    if ((rc = job_size(job, res, bench_name, eb)) != 0 ||
        (rc = job_refuse_options(job, res, bench_name, eb)) != 0)
        return rc;
    res->args.model = job->model;
    if (kb_bench_takes_model(res->bench))
        res->args.dtype = job->dtype;
    if ((rc = job_params(job, res, eb)) != 0 || (rc = job_configure(job, res, eb)) != 0 ||
        (rc = parse_cut(job->replay_cut, &cut, eb)) != 0 ||
        (rc = parse_threads(job->threads, &threads, eb)) != 0)
        return rc;
    if (kb_bench_takes_model(res->bench))
        return job_model(job, bench_name, eb);
    return 0;
}

/* What a run out of host memory can do instead: the hint every such error ends with (the
 * message is cut short, not the hint, when both do not fit). */
static void nomem_hint(const kbcl_result *res, kb_errbuf *eb)
{
    const char *hint = !strcmp(res->device, "none")
                           ? "; the run was timing only already (--device none): try a smaller "
                             "size or machine"
                           : "; --device none runs timing only, without the data (and without "
                             "--verify-data), or try a smaller size";
    size_t cap = sizeof eb->msg - 1, hl = strlen(hint), ml = strnlen(eb->msg, cap);
    if (ml + hl > cap)
        ml = cap - hl;
    memcpy(eb->msg + ml, hint, hl + 1);
}

/*
 * Under mpirun, before the run's first collective: every rank's outcome of its preparation
 * (its code and message), so that a rank that could not load a file fails the job on every
 * rank, which would otherwise wait for it forever at the first partitioned launch. The
 * lowest-numbered failed rank's code and message are everyone's. 0, or that code.
 */
static int agree_prepared(const kb_psim_net *net, int rc, kb_errbuf *eb)
{
    kb_wire w;
    void *all = NULL;
    size_t *counts = calloc((size_t)net->nranks, sizeof *counts), off = 0;
    int out = 0;
    kb_wire_init(&w);
    kb_wire_u32(&w, (uint32_t)rc);
    kb_wire_put(&w, eb->msg, rc ? strlen(eb->msg) : 0);
    if (!counts || kb_wire_ok(&w) != 0 || net->allgather(net->ud, w.p, w.n, &all, counts) != 0) {
        /* the collective itself failed: nothing more can be agreed */
        out = rc ? rc : kb_err_set(eb, KB_ERR_IO, "MPI: the ranks could not compare their "
                                   "preparation");
        goto done;
    }
    for (int r = 0; r < net->nranks && !out; r++) {
        kb_wire_rd rd;
        kb_wire_rd_init(&rd, (const uint8_t *)all + off, counts[r]);
        off += counts[r];
        int code = (int)kb_wire_get_u32(&rd);
        if (!code || !kb_wire_rd_ok(&rd))
            continue;
        if (r == net->rank) {
            out = rc;
            break;
        }
        size_t len = rd.n - rd.at < sizeof eb->msg - 16 ? rd.n - rd.at : sizeof eb->msg - 16;
        char msg[sizeof eb->msg];
        memcpy(msg, rd.p + rd.at, len);
        msg[len] = 0;
        out = kb_err_set(eb, code, "rank %d: %s", r, msg);
    }
done:
    free(all);
    free(counts);
    kb_wire_free(&w);
    return out;
}

int kbcl_job_run(const kbcl_job *job, kbcl_result *res, kb_errbuf *eb)
{
    kb_trace *tr = NULL;
    size_t cut;
    int rc, threads;

    rc = kbcl_job_prepare(job, res, eb);
    if (job->net)
        rc = agree_prepared(job->net, rc, eb);
    if (rc)
        return rc;
    parse_cut(job->replay_cut, &cut, eb);
    parse_threads(job->threads, &threads, eb);
    res->threads_asked = job->threads && strcmp(job->threads, "auto") != 0;
    res->ranks = job->net ? job->net->nranks : 1;
    if (job->trace_path) {
        if ((rc = kb_trace_create(&tr, eb)) != 0)
            return rc;
        if ((rc = trace_options(job, tr, eb)) != 0) {
            kb_trace_destroy(tr);
            return rc;
        }
    }
    kb_ctx_opts opts = { (kb_device_kind)kb_device_from_name(res->device), job->ipcq_trace, tr,
                         job->backend, job->backend_desc, cut, job->progress, threads,
                         job->net };
    rc = kb_bench_execute(&res->cfg, &res->ccl, &opts, res->bench, &res->args, &res->rep, eb);
    if (rc == 0 && tr && job->rank == 0) { /* under mpirun, every rank made the same one */
        rc = kb_trace_write(tr, job->trace_path, eb);
        res->trace_path = job->trace_path;
        res->trace_events = kb_trace_events(tr);
        res->trace_left_out = kb_trace_events_offered(tr) - kb_trace_events(tr);
        res->trace_bytes = kb_trace_bytes(tr);
    }
    kb_trace_destroy(tr);
    if (rc == KB_ERR_NOMEM)
        nomem_hint(res, eb);
    return rc;
}

/* nccl-tests' type, redop and root columns of a collective run: the entry's dtype, its op
 * ("none" for a kind that does not reduce) and its root (-1 for a kind without one). */
static void coll_labels(const kbcl_result *res, const char **type, const char **redop,
                        int *root)
{
    const kb_ccl_algo *e = kb_ccl_config_find(&res->ccl, res->ccl.defaults.algorithm);
    const kb_ccl_algo_impl *impl = e ? kb_ccl_reg_find_algo(res->ccl.reg, e->module) : NULL;
    const kb_ccl_algo_impl *da = e ? kb_ccl_reg_find_dist(res->ccl.reg, e->module) : NULL;
    kb_coll_kind k = impl ? impl->kind : da ? da->kind : KB_COLL_ALLREDUCE;
    *type = e && e->dtype[0] ? e->dtype : "f16";
    *redop = !kb_coll_reduces(k) ? "none" : e && e->op[0] ? e->op : "sum";
    *root = kb_coll_rooted(k) ? (e && e->root > 0 ? e->root : 0) : -1;
}

char *kbcl_result_json(const kbcl_result *res)
{
    const kb_bench *b = res->bench;
    const kb_bench_args *a = &res->args;
    const char *device = res->device;
    const kb_config *cfg = &res->cfg;
    const kb_run_report *rep = &res->rep;
    cJSON *root = cJSON_CreateObject(), *params = cJSON_CreateObject(),
          *replay = cJSON_CreateObject(), *machine = cJSON_CreateObject();
    char digest[32];
    char *out;

    cJSON_AddStringToObject(root, "kbcl_version", KBCL_VERSION);
    cJSON_AddStringToObject(root, "bench", b->name);
    cJSON_AddStringToObject(root, "device", device);
    for (int i = 0; i < b->nparams; i++)
        cJSON_AddNumberToObject(params, b->params[i].name, (double)a->p[i]);
    cJSON_AddItemToObject(root, "params", params);
    cJSON_AddNumberToObject(machine, "sips", cfg->topo.sips_count);
    cJSON_AddNumberToObject(machine, "cubes_per_sip", kb_topo_cubes_per_sip(&cfg->topo));
    cJSON_AddNumberToObject(machine, "pes_per_cube", kb_topo_pes_per_cube(&cfg->topo));
    cJSON_AddNumberToObject(machine, "pes", kb_topo_total_pes(&cfg->topo));
    cJSON_AddStringToObject(machine, "sip_topology", cfg->topo.sips_topology);
    cJSON_AddStringToObject(machine, "switch_arbitration", cfg->topo.switch_arbitration);
    cJSON_AddItemToObject(root, "machine", machine);
    for (int i = 0; i < rep->res.nextras; i++)
        if (!strcmp(rep->res.extras[i].name, "algbw_gbps")) { /* a collective: its labels */
            const char *type, *redop;
            int r;
            coll_labels(res, &type, &redop, &r);
            cJSON_AddStringToObject(root, "dtype", type);
            cJSON_AddStringToObject(root, "redop", redop);
            cJSON_AddNumberToObject(root, "root", r);
            break;
        }
    cJSON_AddNumberToObject(root, "sim_time_ns", rep->sim_time_ns);
    cJSON_AddNumberToObject(root, "sim_end_ns", rep->sim_end_ns);
    cJSON_AddNumberToObject(root, "events", (double)rep->events);
    cJSON_AddNumberToObject(root, "fiber_switches", (double)rep->switches);
    cJSON_AddNumberToObject(root, "kernels", (double)rep->kernels);
    cJSON_AddNumberToObject(root, "op_records", (double)rep->records);
    if (rep->threads > 0) { /* the same for every thread count (docs/parallel.md) */
        cJSON_AddNumberToObject(root, "forked_launches", (double)rep->forked_launches);
        cJSON_AddNumberToObject(root, "phase1_windows", (double)rep->windows);
    }
    for (int i = 0; i < rep->res.nextras; i++)
        cJSON_AddNumberToObject(root, rep->res.extras[i].name, rep->res.extras[i].value);
    if (rep->res.busiest[0]) {
        cJSON_AddStringToObject(root, "busiest_resource", rep->res.busiest);
        cJSON_AddNumberToObject(root, "busiest_busy_frac", rep->res.busiest_frac);
    }
    if (rep->res.bound_resource[0]) {
        cJSON_AddNumberToObject(root, "bound_ns", rep->res.bound_ns);
        cJSON_AddStringToObject(root, "bound_resource", rep->res.bound_resource);
        cJSON_AddNumberToObject(root, "efficiency", kb_bench_efficiency(&rep->res));
    }
    if (rep->res.have_roofline) { /* the workload's lower bound (kb_roofline.h) */
        const kb_roofline *rl = &rep->res.roofline;
        cJSON_AddNumberToObject(root, "roofline_ns", rl->ns);
        cJSON_AddStringToObject(root, "roofline_bound", kb_roofline_bound_name(rl->bound));
        cJSON_AddNumberToObject(root, "roofline_efficiency",
                                kb_bench_roofline_efficiency(&rep->res));
        cJSON_AddNumberToObject(root, "roofline_compute_ns", rl->compute_ns);
        cJSON_AddNumberToObject(root, "roofline_memory_ns", rl->memory_ns);
        cJSON_AddNumberToObject(root, "roofline_comm_ns", rl->comm_ns);
        cJSON_AddStringToObject(root, "roofline_comm_level",
                                kb_roofline_level_name(rl->comm_level));
    }
    if (rep->res.verified < 0)
        cJSON_AddNullToObject(root, "verified");
    else
        cJSON_AddBoolToObject(root, "verified", rep->res.verified == 1);
    if (rep->res.have_digest) {
        snprintf(digest, sizeof digest, "%016llx", (unsigned long long)rep->res.digest);
        cJSON_AddStringToObject(root, "data_digest", digest);
    }
    if (rep->res.have_err) {
        cJSON_AddNumberToObject(root, "max_abs_err", rep->res.max_abs_err);
        cJSON_AddNumberToObject(root, "err_bound", rep->res.err_bound);
    }
    cJSON_AddStringToObject(replay, "device", device);
    cJSON_AddStringToObject(replay, "device_desc", rep->device_desc);
    cJSON_AddNumberToObject(replay, "records", (double)rep->replay.records);
    cJSON_AddNumberToObject(replay, "batches", (double)rep->replay.batches);
    cJSON_AddNumberToObject(replay, "launches", (double)rep->replay.launches);
    cJSON_AddNumberToObject(replay, "flushes", (double)rep->replay.flushes);
    /* the host's bytes in the op log (host writes not generated where they replay) */
    cJSON_AddNumberToObject(replay, "payload_bytes", (double)rep->payload_bytes);
    if (rep->program_cache >= 0) { /* an OpenCL device: device-resident memory */
        const kb_xfer_stats *x = &rep->xfer;
        cJSON *t = cJSON_AddObjectToObject(replay, "transfers");
        cJSON_AddNumberToObject(t, "uploads", (double)x->uploads);
        cJSON_AddNumberToObject(t, "upload_bytes", (double)x->upload_bytes);
        cJSON_AddNumberToObject(t, "downloads", (double)x->downloads);
        cJSON_AddNumberToObject(t, "download_bytes", (double)x->download_bytes);
        cJSON_AddNumberToObject(t, "fills", (double)x->fills);
        cJSON_AddNumberToObject(t, "fill_bytes", (double)x->fill_bytes);
        cJSON_AddNumberToObject(t, "moves", (double)x->moves);
        cJSON_AddNumberToObject(t, "move_bytes", (double)x->move_bytes);
        cJSON_AddNumberToObject(t, "arena_bytes", (double)x->arena_bytes);
        cJSON_AddNumberToObject(t, "arena_blocks", (double)x->blocks);
    }
    cJSON_AddItemToObject(root, "replay", replay);
    /* wall-clock fields last: the only ones that differ between identical runs (and the
     * program cache's state, which a first run leaves warm) */
    cJSON_AddNumberToObject(replay, "ms", rep->replay.ms);
    if (rep->program_cache >= 0) {
        cJSON_AddStringToObject(replay, "program_cache",
                                kb_cl_cache_state_name((kb_cl_cache_state)rep->program_cache));
        cJSON_AddNumberToObject(replay, "setup_ms", rep->setup_ms);
        cJSON_AddNumberToObject(replay, "setup_wait_ms", rep->setup_wait_ms);
        cJSON_AddNumberToObject(replay, "upload_ms", rep->xfer.upload_ms);
        cJSON_AddNumberToObject(replay, "download_ms", rep->xfer.download_ms);
        cJSON_AddNumberToObject(replay, "kernel_ms", rep->kernel_ms);
    }
    cJSON_AddNumberToObject(root, "phase1_ms", rep->phase1_ms);
    if (rep->threads > 0)
        cJSON_AddNumberToObject(root, "phase1_threads", rep->threads);
    if (res->ranks > 1)
        cJSON_AddNumberToObject(root, "phase1_ranks", res->ranks);
    cJSON_AddNumberToObject(root, "events_per_s",
                            rep->phase1_ms > 0 ? (double)rep->events / (rep->phase1_ms / 1e3) : 0.0);
    cJSON_AddNumberToObject(root, "wall_ms", rep->wall_ms);
    out = cJSON_Print(root);
    cJSON_Delete(root);
    return out;
}

int kbcl_write_atomic(const char *path, const char *text, kb_errbuf *eb)
{
    kb_atomic_file af;
    int rc = kb_atomic_open(&af, path, eb);
    if (rc)
        return rc;
    return kb_atomic_commit(&af, fputs(text, af.f) < 0 || fputc('\n', af.f) < 0, eb);
}

int kbcl_same_file(const char *a, const char *b)
{
    struct stat x, y;
    if (!a || !b || stat(a, &x) != 0 || stat(b, &y) != 0)
        return 0;
    return x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

int kbcl_check_output(const char *what, const char *out, const char *const *ins, int n,
                      kb_errbuf *eb)
{
    struct stat st;
    for (int i = 0; out && i < n; i++)
        if (ins[i] && (!strcmp(out, ins[i]) || kbcl_same_file(out, ins[i])))
            return kb_err_set(eb, KB_ERR_USAGE, "%s %s is the same file as %s, which this "
                              "command reads or writes: give another file", what, out, ins[i]);
    if (!out)
        return 0;
    /* what can be seen before anything runs: an output that could not be written at the end
     * would otherwise cost the whole run */
    if (stat(out, &st) == 0 && S_ISDIR(st.st_mode))
        return kb_err_set(eb, KB_ERR_USAGE, "%s %s: cannot write it: it is a folder", what, out);
    if (stat(out, &st) != 0 || S_ISREG(st.st_mode)) { /* a new file in its folder */
        char dir[4096];
        const char *slash = strrchr(out, '/');
        if (!slash)
            snprintf(dir, sizeof dir, ".");
        else
            snprintf(dir, sizeof dir, "%.*s", slash == out ? 1 : (int)(slash - out), out);
        if (stat(dir, &st) != 0)
            return kb_err_set(eb, KB_ERR_USAGE, "%s %s: cannot write it: its folder %s: %s",
                              what, out, dir, strerror(errno));
        if (!S_ISDIR(st.st_mode))
            return kb_err_set(eb, KB_ERR_USAGE, "%s %s: cannot write it: %s is not a folder",
                              what, out, dir);
        if (access(dir, W_OK) != 0)
            return kb_err_set(eb, KB_ERR_USAGE, "%s %s: cannot write it: its folder %s: %s",
                              what, out, dir, strerror(errno));
    }
    return 0;
}

int kbcl_write_all(int fd, const void *buf, size_t n)
{
    const char *s = buf;
    while (n) {
        ssize_t w = write(fd, s, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        s += w;
        n -= (size_t)w;
    }
    return 0;
}

void kbcl_result_print(FILE *f, const kbcl_result *res, int quiet)
{
    const kb_run_report *rep = &res->rep;
    if (rep->res.verified == 1)
        fprintf(f, "%s: %s\n", rep->res.line, rep->res.ok_text[0] ? rep->res.ok_text : "OK");
    else if (rep->res.verified == 0)
        fprintf(f, "  [FAIL] %s: %s\n", rep->res.line + 2, rep->res.detail);
    else
        fprintf(f, "%s: timing only (%s)\n", rep->res.line,
                !strcmp(res->device, "none") ? "--device none"
                                             : "add --verify-data to check the numbers");
    if (quiet)
        return;
    double bytes = 0, count = 0, algbw = -1, busbw = 0, wrong = -1;
    for (int i = 0; i < rep->res.nextras; i++) {
        const char *n = rep->res.extras[i].name;
        double v = rep->res.extras[i].value;
        if (!strcmp(n, "size_bytes"))
            bytes = v;
        else if (!strcmp(n, "n_elem"))
            count = v;
        else if (!strcmp(n, "algbw_gbps"))
            algbw = v;
        else if (!strcmp(n, "busbw_gbps"))
            busbw = v;
        else if (!strcmp(n, "n_wrong"))
            wrong = v;
    }
    if (algbw >= 0) { /* collectives: the nccl-tests columns */
        const char *type, *redop;
        int root;
        char nw[24] = "N/A";
        coll_labels(res, &type, &redop, &root);
        if (wrong >= 0)
            snprintf(nw, sizeof nw, "%.0f", wrong);
        fprintf(f, "  %12s %10s %5s %6s %5s %12s %12s %12s %8s\n", "size(B)", "count", "type",
                "redop", "root", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
        fprintf(f, "  %12.0f %10.0f %5s %6s %5d %12.3f %12.6g %12.6g %8s\n", bytes, count, type,
                redop, root, rep->sim_time_ns / 1000.0, algbw, busbw, nw);
    }
    fprintf(f, "  sim_time   %.3f ns (%.3f us)\n", rep->sim_time_ns, rep->sim_time_ns / 1000.0);
    for (int i = 0; i < rep->res.nextras; i++) {
        double v = rep->res.extras[i].value;
        /* counts and sizes as integers (1073741824, not 1.07374e+09); rates as before */
        if (v == floor(v) && fabs(v) < 9007199254740992.0)
            fprintf(f, "  %-10s %.0f\n", rep->res.extras[i].name, v);
        else
            fprintf(f, "  %-10s %.6g\n", rep->res.extras[i].name, v);
    }
    if (rep->res.busiest[0])
        fprintf(f, "  busiest    %s, reserved %.1f %% of sim_time\n", rep->res.busiest,
                100.0 * rep->res.busiest_frac);
    if (rep->res.bound_resource[0])
        fprintf(f, "  bound      %.3f ns by %s: efficiency %.3f\n", rep->res.bound_ns,
                rep->res.bound_resource, kb_bench_efficiency(&rep->res));
    if (rep->res.have_roofline) {
        const kb_roofline *rl = &rep->res.roofline;
        fprintf(f, "  roofline   %.3f ns, %s-bound (compute %.3f, memory %.3f, comm %.3f ns%s%s): "
                "roofline_efficiency %.3f\n", rl->ns, kb_roofline_bound_name(rl->bound),
                rl->compute_ns, rl->memory_ns, rl->comm_ns, rl->comm_level >= 0 ? " over " : "",
                kb_roofline_level_name(rl->comm_level), kb_bench_roofline_efficiency(&rep->res));
    }
    fprintf(f, "  events     %llu (%llu fiber switches, %llu kernels)\n",
            (unsigned long long)rep->events, (unsigned long long)rep->switches,
            (unsigned long long)rep->kernels);
    if (rep->threads > 0 && rep->forked_launches > 0 && res->ranks > 1)
        fprintf(f, "  threads    %d on each of %d processes: %llu launch(es) ran partitioned over "
                "the SIPs, %llu windows\n", rep->threads, res->ranks,
                (unsigned long long)rep->forked_launches, (unsigned long long)rep->windows);
    else if (rep->threads > 0 && rep->forked_launches > 0)
        fprintf(f, "  threads    %d: %llu launch(es) ran partitioned over the SIPs, %llu windows\n",
                rep->threads, (unsigned long long)rep->forked_launches,
                (unsigned long long)rep->windows);
    else if (rep->threads > 0 && res->threads_asked) /* asked for, nothing used it: say why */
        fprintf(f, "  threads    %d: no launch ran partitioned (that needs a launch over several "
                "SIPs, no --trace, system.switch.arbitration=per_sip, no device "
                "queue and one host program: docs/parallel.md)\n", rep->threads);
    if (rep->res.have_err)
        fprintf(f, "  max_err    %.6g (bound %.6g)\n", rep->res.max_abs_err, rep->res.err_bound);
    if (rep->res.have_digest)
        fprintf(f, "  digest     %016llx\n", (unsigned long long)rep->res.digest);
    if (rep->replay.flushes)
        fprintf(f, "  replay     %s: %llu records, %llu batches, %llu launches, %.3f ms\n",
                res->device, (unsigned long long)rep->replay.records,
                (unsigned long long)rep->replay.batches, (unsigned long long)rep->replay.launches,
                rep->replay.ms);
    if (rep->program_cache >= 0)
        fprintf(f, "  device     set-up %.1f ms (%.1f waited for, program cache %s), up %.2f MiB "
                "in %llu (%.1f ms), down %.2f MiB in %llu (%.1f ms), kernels %.1f ms\n",
                rep->setup_ms, rep->setup_wait_ms,
                kb_cl_cache_state_name((kb_cl_cache_state)rep->program_cache),
                (double)rep->xfer.upload_bytes / 1048576.0, (unsigned long long)rep->xfer.uploads,
                rep->xfer.upload_ms, (double)rep->xfer.download_bytes / 1048576.0,
                (unsigned long long)rep->xfer.downloads, rep->xfer.download_ms, rep->kernel_ms);
    if (res->trace_path) { /* the size a --trace file came to: a full one is large */
        fprintf(f, "  trace      %s: %llu events, %llu bytes", res->trace_path,
                (unsigned long long)res->trace_events, (unsigned long long)res->trace_bytes);
        if (res->trace_left_out)
            fprintf(f, " (%llu more left out by --trace-filter/--trace-window)",
                    (unsigned long long)res->trace_left_out);
        fputc('\n', f);
    }
    fprintf(f, "  wall       %.3f ms (simulation %.3f ms, %.3g events/s)\n", rep->wall_ms,
            rep->phase1_ms, rep->phase1_ms > 0 ? (double)rep->events / (rep->phase1_ms / 1e3) : 0.0);
}
