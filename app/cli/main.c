/*
 * kbcl — the command-line front end: parses arguments, loads the configuration, runs a bench
 * and prints/writes its results. Only this file decides exit statuses:
 *   0 success, 1 verification failure, 2 usage or configuration error,
 *   3 simulation error (deadlock, allocation, bad kernel), 4 compute-device error.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "kb_bench.h"
#include "kb_ccl.h"
#include "kb_ccl_reg.h"
#include "kb_dist_algo.h"
#include "kb_cli.h"
#include "kb_remote.h"
#include "kb_opencl.h"
#include "kb_config.h"
#include "kb_plugin.h"
#include "kb_progress.h"
#include "kb_psim.h"
#include "kb_runtime.h"


static void usage_run(FILE *f)
{
    fputs("usage: kbcl run [options]\n"
          "\n"
          "  --bench NAME         bench to run (default ccl_allreduce, also named ccl; see\n"
          "                       kbcl list)\n"
          "  --topology FILE      machine description (default configs/topology.yaml)\n"
          "  --ccl FILE           collective library config (default configs/ccl.yaml)\n"
          "  --set KEY=VALUE      override a config key, e.g. system.sips.count=4,\n"
          "                       ccl.defaults.n_slots=1 (repeatable)\n"
          "  --param NAME=VALUE   set a bench parameter, e.g. m=512 (repeatable)\n"
          "  --algorithm NAME     collective for the ccl bench: an entry of ccl.yaml (kbcl\n"
          "                       list shows them and marks the default)\n"
          "  --world-size N       ranks (rank = PE mode; overrides the entry's world_size)\n"
          "  --n-elem N           f16 elements per rank (nccl-tests' count; all_gather,\n"
          "                       reduce_scatter, all_to_all tiles hold ws chunks of it)\n"
          "  --size BYTES         the collective's buffer per rank, nccl-tests' size (all_reduce:\n"
          "                       count x 2 bytes); suffixes K, M, G = 2^10, 2^20, 2^30, e.g.\n"
          "                       --size 64K; instead of --n-elem\n"
          "  --buffer-kind K      where IPCQ rx rings live: tcm | hbm | sram\n"
          "  --root R             root rank of a broadcast or reduce (default 0)\n"
          "  --op OP              reduction: sum|prod|max|min|avg (default sum)\n"
          "  --dtype T            tile element type: f16|bf16|f32 (default f16); for\n"
          "                       decoder_layer the number format: f16|bf16|int8|mxint8|\n"
          "                       fp8e4m3|fp8e5m2\n"
          "  --model FILE         model file of decoder_layer (configs/models/*.yaml)\n"
          "  --device DEV         auto | gpu | cpu | ref | none (none = timing only)  [ref]\n"
          "  --trace FILE         write a Chrome trace-event timeline (Perfetto); its size\n"
          "                       is printed (docs/performance.md: a full one is large)\n"
          "  --trace-filter SPEC  keep only these events: categories kernel, dma, ipcq,\n"
          "                       compute, res and places sipR[/cubeR[/peR]] (R = N, N-M\n"
          "                       or *), comma-separated, e.g. sip0/cube0,kernel,ipcq\n"
          "  --trace-window A:B   keep only events overlapping simulated ns [A, B) (A: or\n"
          "                       :B leave a side open)\n"
          "  --verify-data        replay the data and check it against a host computation\n"
          "  --replay-cut N       op-log cut every N records (default 32768, 0 = none): a\n"
          "                       device server replays each part while Phase 1 runs on\n"
          "                       (docs/phase2.md)\n"
          "  --threads N|auto     Phase-1 threads, 0-64: a launch over several SIPs runs\n"
          "                       them as partitions on N threads, one result for every\n"
          "                       N >= 1 (system.switch.arbitration=per_sip, no --trace;\n"
          "                       docs/parallel.md); 0 = one engine, no partitions; auto\n"
          "                       = the CPUs this process may use (under mpirun: its\n"
          "                       binding's, or unbound the host's shared by its ranks;\n"
          "                       more threads than that are slow: a note says so)  [auto]\n"
          "  --json FILE          write the results as JSON (atomically; never over an\n"
          "                       input of the run)\n"
          "  --quiet              print only the result line (and no progress line)\n"
          "  --plugin FILE.so     load a plugin: algorithms and benches (repeatable;\n"
          "                       docs/plugins.md)\n"
          "environment: KBCL_CCL_TRACE=1 prints one line per IPCQ send/recv to stderr;\n"
          "KBCL_CONFIG_DIR=DIR reads DIR/topology.yaml and DIR/ccl.yaml by default;\n"
          "KBCL_PLUGIN_PATH=A:B loads plugins (files, or folders of *.so files) first;\n"
          "KBCL_PROGRESS=0 never shows the progress line that a terminal gets on stderr\n"
          "from 1 s into a run, KBCL_PROGRESS=1 shows it on any stderr\n"
          "under mpirun -n R (a build with MPI): a launch that runs partitioned spreads its\n"
          "SIPs over the R ranks too, with one process's result; rank 0 prints and writes\n",
          f);
}

static void usage_list(FILE *f)
{
    fputs("usage: kbcl list [--plugin FILE.so]... [--ccl FILE] [--topology FILE]\n"
          "                 [--set KEY=VALUE]...\n"
          "\n"
          "  lists benches, the entries of ccl.yaml (the default one or --ccl FILE: the names\n"
          "  --algorithm takes, the default marked *), the collective modules they name,\n"
          "  topologies and devices: kbcl's own, then what each plugin adds (plugins of\n"
          "  KBCL_PLUGIN_PATH, of --plugin, and of the plugins: list of that ccl.yaml).\n"
          "  --set and --topology apply as kbcl run applies them, so the entries are those a\n"
          "  run with the same options sees (a new entry, another world size or SIP count);\n"
          "  an assignment or file kbcl run would refuse is refused here too (exit 2)\n",
          f);
}

/* Loads KBCL_PLUGIN_PATH and the --plugin files into a new set (*out; NULL on error, with
 * the message printed under `cmd`). */
static int plugins_open(const char *cmd, const char *const *files, int n, kb_plugins **out)
{
    kb_errbuf eb = { { 0 } };
    int rc = kb_plugins_create(out, &eb);
    if (rc == 0 && (rc = kbcl_plugins_load_cli(*out, files, n, &eb)) != 0) {
        kb_plugins_destroy(*out);
        *out = NULL;
    }
    if (rc)
        fprintf(stderr, "kbcl %s: %s\n", cmd, eb.msg);
    return rc;
}

/* " [plugin NAME]" for an entry a plugin added, "" for a built-in. */
static const char *origin(const kb_plugins *ps, const void *entry, char *buf, size_t n)
{
    const kb_plugin_info *pi;
    buf[0] = '\0';
    for (int i = 0; (pi = kb_plugins_at(ps, i)) != NULL; i++) {
        for (int j = 0; j < pi->nalgos; j++)
            if ((const void *)pi->algos[j] == entry)
                snprintf(buf, n, "  [plugin %s]", pi->name);
        for (int j = 0; j < pi->nbenches; j++)
            if ((const void *)pi->benches[j] == entry)
                snprintf(buf, n, "  [plugin %s]", pi->name);
    }
    return buf;
}

/* The i-th bench / algorithm: kbcl's own, then the plugins' in load order. */
static const kb_bench *any_bench(const kb_plugins *ps, int i)
{
    const kb_plugin_info *pi;
    int nb = 0;
    while (kb_bench_at(nb))
        nb++;
    if (i < nb)
        return kb_bench_at(i);
    i -= nb;
    for (int p = 0; (pi = kb_plugins_at(ps, p)) != NULL; p++) {
        if (i < pi->nbenches)
            return pi->benches[i];
        i -= pi->nbenches;
    }
    return NULL;
}

static const kb_ccl_algo_impl *any_algo(const kb_plugins *ps, int i)
{
    int nb = 0;
    while (kb_ccl_algo_at(nb))
        nb++;
    return i < nb ? kb_ccl_algo_at(i) : kb_ccl_reg_algo_at(kb_plugins_ccl(ps), i - nb);
}

/* How `kbcl run --bench ccl --algorithm NAME` runs entry e (bench_ccl.c decides the same way):
 * a world_size runs rank = PE unless the module has only a process-group form; none runs one
 * rank per SIP, through the module's process-group form when it has one, else in lanes. */
static const char *entry_model(const kb_ccl_cfg *ccl, const kb_ccl_algo *e, int *kind,
                               const void **impl)
{
    const kb_ccl_algo_impl *a = kb_ccl_reg_find_algo(ccl->reg, e->module);
    const kb_ccl_algo_impl *d = kb_ccl_reg_find_dist(ccl->reg, e->module);
    int ws = kb_ccl_config_params(ccl, e).world_size;

    *kind = a ? (int)a->kind : d ? (int)d->kind : -1;
    *impl = a ? (const void *)a : (const void *)d;
    if (!a && !d)
        return "unknown module (a plugin not loaded?)";
    if (ws > 0 && a)
        return "rank = PE";
    return d ? "rank = SIP, process group" : "rank = SIP, lanes";
}

/* Every entry of the ccl file in use: the names --algorithm takes, the default marked. */
static void list_entries(const kb_plugins *ps, const kb_ccl_cfg *ccl, int nsips)
{
    int wn = 5, wm = 6, wt = 8, have_default = 0;
    char from[96];

    for (int i = 0; i < ccl->nalgos; i++) {
        const kb_ccl_algo *e = &ccl->algos[i];
        wn = (int)strlen(e->name) > wn ? (int)strlen(e->name) : wn;
        wm = (int)strlen(e->module) > wm ? (int)strlen(e->module) : wm;
        wt = (int)strlen(e->topology) > wt ? (int)strlen(e->topology) : wt;
    }
    printf("ccl.yaml entries (%s): the names --algorithm takes; * marks the default "
           "(defaults.algorithm), the one kbcl run --bench ccl runs without --algorithm. "
           "world size: the entry's, which --world-size N overrides; N SIPs = one rank per SIP "
           "of the machine (system.sips.count):\n",
           ccl->path[0] ? ccl->path : "no file: built-in defaults");
    printf("  %-*s  %-*s  %-14s  %-*s  %-10s  %s\n", wn, "entry", wm, "module", "collective",
           wt, "topology", "world size", "rank model");
    for (int i = 0; i < ccl->nalgos; i++) {
        const kb_ccl_algo *e = &ccl->algos[i];
        const void *impl;
        int kind, mine = !strcmp(e->name, ccl->defaults.algorithm);
        const char *model = entry_model(ccl, e, &kind, &impl);
        char ws[16];
        int n = kb_ccl_config_params(ccl, e).world_size;

        if (!strncmp(model, "rank = SIP", 10))
            snprintf(ws, sizeof ws, "%d SIPs", nsips);
        else if (n > 0)
            snprintf(ws, sizeof ws, "%d", n);
        else
            snprintf(ws, sizeof ws, "-");
        have_default |= mine;
        printf("%c %-*s  %-*s  %-14s  %-*s  %-10s  %s%s\n", mine ? '*' : ' ', wn, e->name, wm,
               e->module, kind >= 0 ? kb_coll_name((kb_coll_kind)kind) : "-", wt,
               e->topology[0] ? e->topology : "-", ws, model,
               impl ? origin(ps, impl, from, sizeof from) : "");
    }
    if (!ccl->nalgos)
        printf("  (none)\n");
    if (!have_default)
        printf("  the default, '%s', is not an entry of this file: kbcl run --bench ccl "
               "needs --algorithm\n", ccl->defaults.algorithm);
}

/* The options of `kbcl list`: the files and assignments `kbcl run` would take. */
typedef struct list_args {
    const char *files[KBCL_MAX_PLUGIN_ARGS], *sets[KBCL_MAX_SETS];
    const char *ccl_path, *topo_path;
    int nfiles, nsets;
} list_args;

/* Parses the command line into *a. Returns -1 to go on, else the exit code (after --help or
 * a usage error). */
static int list_parse_args(int argc, char **argv, list_args *a)
{
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage_list(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--plugin") && i + 1 < argc &&
                   a->nfiles < KBCL_MAX_PLUGIN_ARGS) {
            a->files[a->nfiles++] = argv[++i];
        } else if (!strcmp(argv[i], "--ccl") && i + 1 < argc) {
            a->ccl_path = argv[++i];
        } else if (!strcmp(argv[i], "--topology") && i + 1 < argc) {
            a->topo_path = argv[++i];
        } else if (!strcmp(argv[i], "--set") && i + 1 < argc && a->nsets < KBCL_MAX_SETS) {
            a->sets[a->nsets++] = argv[++i];
        } else {
            fprintf(stderr, "kbcl list: unexpected argument '%s'\n", argv[i]);
            usage_list(stderr);
            return KBCL_EXIT_USAGE;
        }
    }
    return -1;
}

/* cfg and ccl as `kbcl run` would have them: the files it reads (ccl.yaml's plugins loaded
 * into ps), the assignments in order, then its checks. Returns 0 or the exit code, its
 * message printed. */
static int list_config(const list_args *a, kb_plugins *ps, kb_config *cfg, kb_ccl_cfg *ccl)
{
    kb_errbuf eb = { { 0 } };
    kb_ccl_cfg *chk = NULL;
    int rc = 0;

    kb_ccl_config_defaults(ccl);
    if (kbcl_configs_load(a->topo_path, a->ccl_path, ps, cfg, ccl, &eb) != 0) {
        fprintf(stderr, "kbcl list: %s\n", eb.msg);
        return KBCL_EXIT_USAGE;
    }
    for (int i = 0; i < a->nsets; i++)
        if (kbcl_config_set(cfg, ccl, a->sets[i], &eb) != 0) {
            fprintf(stderr, "kbcl list: %s\n", eb.msg);
            return KBCL_EXIT_USAGE;
        }
    /* kbcl run validates with its --algorithm as the default; list names none, so a default
     * that is no entry of the file is listed with its note below, not refused: the check runs
     * on a copy that selects the first entry instead */
    if (!(chk = malloc(sizeof *chk))) {
        fprintf(stderr, "kbcl list: out of memory\n");
        return KBCL_EXIT_SIM;
    }
    *chk = *ccl;
    if (chk->nalgos > 0 && !kb_ccl_config_find(chk, chk->defaults.algorithm))
        snprintf(chk->defaults.algorithm, sizeof chk->defaults.algorithm, "%s",
                 chk->algos[0].name);
    if (kb_config_validate(cfg, &eb) != 0 || kb_ccl_config_validate(chk, &cfg->topo, &eb) != 0) {
        fprintf(stderr, "kbcl list: %s\n", eb.msg);
        rc = KBCL_EXIT_USAGE;
    }
    free(chk);
    return rc;
}

/* Every bench, kbcl's and the plugins', with its --param options. */
static void list_benches(const kb_plugins *ps)
{
    char from[96];

    printf("benches:\n");
    for (int i = 0; any_bench(ps, i); i++) {
        const kb_bench *b = any_bench(ps, i);
        printf("  %-12s %s%s\n", b->name, b->summary, origin(ps, b, from, sizeof from));
        for (int j = 0; j < b->nparams; j++) {
            char names[256];
            kb_bench_param_names(b, j, names, sizeof names);
            printf("      --param %s=N   %s (default %lld, %lld..%lld%s%s)\n",
                   b->params[j].name, b->params[j].doc, (long long)b->params[j].dflt,
                   (long long)b->params[j].min, (long long)b->params[j].max,
                   names[0] ? "; " : "", names);
        }
    }
}

/* The collective modules entries can name: rank = PE forms, then process-group forms. */
static void list_modules(const kb_plugins *ps)
{
    char from[96];

    printf("collective modules, rank = PE form (the implementations entries name as module:, "
           "collective kind; every rank is one PE, layout single_shard_per_rank; with "
           "world_size 0 one rank per SIP in lanes over the SIP's PEs, unless the module has a "
           "process-group form below):\n");
    for (int i = 0; any_algo(ps, i); i++) {
        const kb_ccl_algo_impl *a = any_algo(ps, i);
        if (a->kernel)
            printf("  %-24s %-14s %s%s\n", a->module, kb_coll_name(a->kind), a->summary,
                   origin(ps, a, from, sizeof from));
    }
    printf("collective modules, rank = SIP process-group forms (init_process_group; PEs of "
           "a rank / layout):\n");
    for (int i = 0; any_algo(ps, i); i++) {
        const kb_ccl_algo_impl *a = any_algo(ps, i);
        if (a->sip)
            printf("  %-24s %-14s %s / %s: %s%s\n", a->module, kb_coll_name(a->kind),
                   a->sip->mapper, a->sip->validator, a->sip->summary,
                   origin(ps, a, from, sizeof from));
    }
}

/* The topology kinds and the --device names. */
static void list_topologies_devices(void)
{
    printf("topologies:\n ");
    for (int i = 0; kb_topo_names[i]; i++)
        printf(" %s", kb_topo_names[i]);
    printf("\n");
    printf("devices:\n"
           "  auto   an OpenCL GPU, else an OpenCL CPU device, else ref (says which)\n"
           "  gpu    an OpenCL GPU (exit 4 if there is none)\n"
           "  cpu    an OpenCL CPU device, e.g. PoCL\n"
           "  ref    plain-C reference replay (the oracle)\n"
           "  none   timing only: no op log, no data\n");
}

/* The plugins loaded, each with what it adds. */
static void list_plugins(const kb_plugins *ps)
{
    const kb_plugin_info *pi;

    printf("plugins:\n");
    if (!kb_plugins_at(ps, 0))
        printf("  (none: --plugin FILE.so, KBCL_PLUGIN_PATH or ccl.yaml's plugins: load them)\n");
    for (int i = 0; (pi = kb_plugins_at(ps, i)) != NULL; i++) {
        printf("  %s  %s%s%s\n", pi->name, pi->path, pi->summary[0] ? ": " : "", pi->summary);
        for (int j = 0; j < pi->nalgos; j++)
            if (pi->algos[j]->kernel)
                printf("      rank = PE algorithm   %s\n", pi->algos[j]->module);
        for (int j = 0; j < pi->nalgos; j++)
            if (pi->algos[j]->sip)
                printf("      rank = SIP algorithm  %s\n", pi->algos[j]->module);
        for (int j = 0; j < pi->nbenches; j++)
            printf("      bench                 %s\n", pi->benches[j]->name);
    }
}

static int cmd_list(int argc, char **argv)
{
    list_args a;
    kb_plugins *ps = NULL;
    kb_ccl_cfg *ccl = NULL;
    kb_config cfg;
    int rc = 0;

    kb_config_defaults(&cfg);
    memset(&a, 0, sizeof a);
    if ((rc = list_parse_args(argc, argv, &a)) >= 0)
        return rc;
    rc = 0;
    if (plugins_open("list", a.files, a.nfiles, &ps) != 0)
        return KBCL_EXIT_USAGE;
    /* the plugins of ccl.yaml (the one `kbcl run` would read) */
    if (!(ccl = malloc(sizeof *ccl))) {
        fprintf(stderr, "kbcl list: out of memory\n");
        rc = KBCL_EXIT_SIM;
        goto out;
    }
    if ((rc = list_config(&a, ps, &cfg, ccl)) != 0)
        goto out;
    list_benches(ps);
    list_entries(ps, ccl, cfg.topo.sips_count);
    list_modules(ps);
    list_topologies_devices();
    list_plugins(ps);
out:
    free(ccl);
    kb_config_fini(&cfg);
    kb_plugins_destroy(ps);
    return rc;
}

/* --json and --trace against every input of the run (configurations, model, plugins) and
 * each other, before anything runs. */
static int run_check_outputs(const kbcl_job *job, const char *json_path,
                             const char *const *plugins, int nplugins, kb_errbuf *eb)
{
    char tbuf[4096], cbuf[4096];
    const char *ins[5 + KBCL_MAX_PLUGIN_ARGS] = {
        job->topology ? job->topology
                      : kbcl_default_config("topology.yaml", tbuf, sizeof tbuf),
        job->ccl ? job->ccl : kbcl_default_config("ccl.yaml", cbuf, sizeof cbuf),
        job->model,
    };
    int n = 3, rc;
    for (int i = 0; i < nplugins; i++)
        ins[n++] = plugins[i];
    if ((rc = kbcl_check_output("--json", json_path, ins, n, eb)) != 0)
        return rc;
    ins[n++] = json_path;
    return kbcl_check_output("--trace", job->trace_path, ins, n, eb);
}

/* kbcl run's body; net and rank: under mpirun (NULL, 0: one process). Only rank 0 prints and
 * writes files: every rank computes the same result. */
static int run_main(int argc, char **argv, const kb_psim_net *net, int rank)
{
    kbcl_job job;
    kbcl_result res;
    kb_errbuf eb = { { 0 } };
    char threads_buf[24];
    const char *json_path = NULL, *tr = getenv("KBCL_CCL_TRACE");
    const char *files[KBCL_MAX_PLUGIN_ARGS];
    kb_plugins *ps = NULL;
    int quiet = 0, nfiles = 0, rc, code;

    memset(&job, 0, sizeof job);
    job.ipcq_trace = tr && *tr && strcmp(tr, "0") ? stderr : NULL;
    for (int i = 0; i < argc; i++) {
        int k = kbcl_job_option(&job, argc, argv, &i, &eb);
        if (k < 0) {
            fprintf(stderr, "kbcl run: %s\n", eb.msg);
            return KBCL_EXIT_USAGE;
        }
        if (k)
            continue;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage_run(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--json") && i + 1 < argc) {
            json_path = argv[++i];
        } else if (!strcmp(argv[i], "--quiet")) {
            quiet = 1;
        } else if (!strcmp(argv[i], "--plugin")) {
            if (i + 1 >= argc || nfiles >= KBCL_MAX_PLUGIN_ARGS) {
                fprintf(stderr, "kbcl run: --plugin needs a file (at most %d)\n",
                        KBCL_MAX_PLUGIN_ARGS);
                return KBCL_EXIT_USAGE;
            }
            files[nfiles++] = argv[++i];
        } else {
            fprintf(stderr, "kbcl run: unknown option '%s' (see kbcl run --help)\n", argv[i]);
            return KBCL_EXIT_USAGE;
        }
    }
    if (run_check_outputs(&job, json_path, files, nfiles, &eb) != 0) {
        fprintf(stderr, "kbcl run: %s\n", eb.msg);
        return KBCL_EXIT_USAGE;
    }
    /* a launch that can run partitioned does, on every core (the result is the same on any
     * number): issue #34's default */
    if (!job.threads)
        job.threads = "auto";
    job.net = net;
    job.rank = rank;
    int usable = kbcl_usable_cpus();
    if (net && !strcmp(job.threads, "auto") && usable == sysconf(_SC_NPROCESSORS_ONLN)) {
        /* ranks not bound by the launcher (--bind-to none): the host's CPUs shared by its
         * ranks; bound ones: auto is their binding's CPUs */
        const char *v = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
        int local = v && atoi(v) > 0 ? atoi(v) : 1;
        int t = usable > local ? usable / local : 1;
        snprintf(threads_buf, sizeof threads_buf, "%d", t > KB_CTX_MAX_THREADS ? KB_CTX_MAX_THREADS : t);
        job.threads = threads_buf;
    } else if (rank == 0 && strcmp(job.threads, "auto") != 0 && atoi(job.threads) > usable) {
        /* threads that wait on each other at every window, more of them than CPUs: slow */
        fprintf(stderr, "kbcl run: note: %d Phase-1 threads on %d CPU(s) this process may use%s\n",
                atoi(job.threads), usable,
                net ? " (mpirun binds each of up to 2 ranks to one core: add --bind-to none)"
                    : "");
    }
    /* the plugins outlive everything that may point into them: the result, the report */
    if (plugins_open("run", files, nfiles, &ps) != 0)
        return KBCL_EXIT_USAGE;
    job.plugins = ps;
    /* a device server for --device gpu|cpu|auto, started on first use, so that this run and
     * the next ones skip the device's set-up; before any thread and any OpenCL call */
    kbcl_devd_autostart(job.device);
    /* the other ranks trace too (a trace keeps launches from forking, on every rank alike),
     * into nothing: rank 0's lines are the run's */
    FILE *devnull = NULL;
    if (rank != 0 && job.ipcq_trace && (devnull = fopen("/dev/null", "w")) != NULL)
        job.ipcq_trace = devnull;
    /* The progress line: on stderr, so never with the IPCQ trace lines there too. */
    kb_progress pg;
    kbcl_ticker *ticker = NULL;
    if (rank == 0 && kbcl_progress_wanted(quiet || job.ipcq_trace, getenv("KBCL_PROGRESS"),
                             isatty(STDERR_FILENO))) {
        kb_progress_init(&pg);
        job.progress = &pg;
        if (kbcl_ticker_start(&ticker, &pg, STDERR_FILENO, 1.0) != 0)
            job.progress = NULL; /* no thread: the run goes on without a line */
    }
    rc = kbcl_job_run(&job, &res, &eb);
    kbcl_ticker_stop(ticker); /* the line is gone before anything else is printed */
    if (rank != 0) { /* rank 0 says it all (the same run, the same words) */
        code = rc ? kbcl_exit_code(rc) : res.rep.res.verified == 0 ? KBCL_EXIT_VERIFY : 0;
        if (devnull)
            fclose(devnull);
        kbcl_result_fini(&res);
        kb_plugins_destroy(ps);
        return code;
    }
    if (res.rep.device_note[0])
        fprintf(stderr, "kbcl: %s\n", res.rep.device_note);
    if (rc) {
        if (res.rep.report) /* the whole deadlock report, not just the message's start */
            fprintf(stderr, "kbcl: %s: at the end of the run:%s\n", kb_strerror(rc), res.rep.report);
        else if (rc == KB_ERR_USAGE || rc == KB_ERR_CONFIG)
            fprintf(stderr, "kbcl: %s\n", eb.msg);
        else
            fprintf(stderr, "kbcl: %s: %s\n", kb_strerror(rc), eb.msg);
        kbcl_result_fini(&res);
        kb_plugins_destroy(ps);
        return kbcl_exit_code(rc);
    }
    kbcl_result_print(stdout, &res, quiet);
    code = res.rep.res.verified == 0 ? KBCL_EXIT_VERIFY : 0;
    if (json_path) {
        char *text = kbcl_result_json(&res);
        if (!text) {
            fprintf(stderr, "kbcl: out of memory writing JSON\n");
            code = KBCL_EXIT_SIM;
        } else {
            if (kbcl_write_atomic(json_path, text, &eb) != 0) {
                fprintf(stderr, "kbcl: %s\n", eb.msg);
                code = KBCL_EXIT_USAGE;
            }
            cJSON_free(text);
        }
    }
    kbcl_result_fini(&res);
    kb_plugins_destroy(ps);
    return code;
}

static int cmd_run(int argc, char **argv)
{
    kb_errbuf eb = { { 0 } };
    kb_psim_net net;
    int rank = 0, size = 1, code;
    int mpi = kbcl_sweep_mpi_init(&rank, &size, &eb);
    if (mpi < 0) {
        fprintf(stderr, "kbcl run: %s\n", eb.msg);
        return KBCL_EXIT_USAGE;
    }
    if (mpi > 0)
        kbcl_mpi_net(&net, rank, size);
    code = run_main(argc, argv, mpi > 0 ? &net : NULL, rank);
    if (mpi > 0)
        kbcl_sweep_mpi_fini();
    return code;
}

static int cmd_version(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    printf("kbcl %s\n", KBCL_VERSION);
    return 0;
}

static int cmd_help(int argc, char **argv);

/* The commands, in the order the usage text lists them; an entry without help is another
 * spelling of a listed one and is not listed. */
static const struct {
    const char *name;
    int (*run)(int argc, char **argv); /* argv: the arguments after the command's name */
    const char *help;
} commands[] = {
    { "run", cmd_run, "run a bench: simulate its timing (Phase 1) and, with --verify-data, "
                      "replay its data (Phase 2) and check the numbers" },
    { "sweep", kbcl_cmd_sweep, "run a grid of jobs from a YAML file, one result row per point "
                               "(CSV or JSON Lines; --jobs N workers, --resume, mpirun)" },
    { "report", kbcl_cmd_report, "render sweep results as a self-contained HTML page with "
                                 "plots" },
    { "validate", kbcl_cmd_validate, "compare measured collective times (nccl-tests-style "
                                     "CSV rows) with kbcl's predictions: error per row, mean "
                                     "and worst; --threshold PCT, --ratio R" },
    { "list", cmd_list, "list benches, ccl.yaml entries (--algorithm names), collective "
                        "modules, topologies and devices" },
    { "devices", kbcl_cmd_devices, "list the OpenCL platforms and devices Phase 2 can use" },
    { "devd", kbcl_cmd_devd, "device server: keeps an OpenCL device set up for all kbcl "
                             "runs" },
    { "bench-self", kbcl_cmd_bench_self, "measure the simulator's own speed (Phase 1 and "
                                         "Phase-2 replay)" },
    { "version", cmd_version, "print the version" },
    { "--version", cmd_version, NULL },
    { "help", cmd_help, NULL },
    { "--help", cmd_help, NULL },
    { "-h", cmd_help, NULL },
};
#define NCOMMANDS (sizeof commands / sizeof commands[0])

/* The listed commands: names in a column as wide as the longest, each help wrapped at 80
 * columns under its first word. */
static void usage_main(FILE *f)
{
    int w = 0;
    for (size_t i = 0; i < NCOMMANDS; i++)
        if (commands[i].help && (int)strlen(commands[i].name) > w)
            w = (int)strlen(commands[i].name);
    fputs("usage: kbcl <command> [options]\n\ncommands:\n", f);
    for (size_t i = 0; i < NCOMMANDS; i++) {
        const char *h = commands[i].help;
        int col, first = 1;
        if (!h)
            continue;
        col = fprintf(f, "  %-*s  ", w, commands[i].name);
        while (*h) {
            int n = (int)strcspn(h, " ");
            if (!first && col + 1 + n > 80) {
                col = fprintf(f, "\n%*s", w + 4, "") - 1;
                first = 1;
            }
            col += fprintf(f, "%s%.*s", first ? "" : " ", n, h);
            first = 0;
            h += n;
            h += strspn(h, " ");
        }
        fputc('\n', f);
    }
    fputs("\n"
          "kbcl <command> --help shows the command's options.\n"
          "exit codes: 0 ok, 1 verification failed (validate: an error above --threshold or\n"
          "            a row outside --ratio),\n"
          "            2 usage/config error, 3 simulation error, 4 device error\n",
          f);
}

static int cmd_help(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    usage_main(stdout);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage_main(stderr);
        return KBCL_EXIT_USAGE;
    }
    for (size_t i = 0; i < NCOMMANDS; i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].run(argc - 2, argv + 2);
    fprintf(stderr, "kbcl: unknown command '%s'\n", argv[1]);
    usage_main(stderr);
    return KBCL_EXIT_USAGE;
}

int kbcl_cmd_devices(int argc, char **argv)
{
    static char buf[16384];
    if (argc > 0) {
        int help = !strcmp(argv[0], "--help") || !strcmp(argv[0], "-h");
        fprintf(help ? stdout : stderr,
                "usage: kbcl devices\n  lists the OpenCL platforms and devices Phase 2 can use "
                "(--device gpu/cpu/auto),\n  and how to register NVIDIA's driver when its ICD "
                "file is missing\n");
        return help ? 0 : KBCL_EXIT_USAGE;
    }
    int n = kb_opencl_list(buf, sizeof buf);
    fputs(buf, stdout);
    printf("ref: plain-C reference replay (always available)\n");
    static const char *const served[] = { "gpu", "cpu", "auto" };
    for (int i = 0; i < 3; i++) {
        char path[200];
        kb_devd_hello h;
        kb_errbuf eb;
        if (kb_devd_socket_path(served[i], path, sizeof path, &eb) == 0 &&
            kb_remote_hello(path, &h, &eb) == 0)
            printf("device server for %s: %s at %s, pid %d (kbcl devd; %s)\n", served[i], h.desc,
                   path, (int)h.pid, kb_devd_enabled() ? "used by --device runs" : "KBCL_DEVD=off");
    }
    return n < 0 ? KBCL_EXIT_DEVICE : 0;
}
