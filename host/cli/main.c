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
#include "kb_config.h"
#include "kb_runtime.h"

#define KBCL_VERSION "0.1.0"

enum { EXIT_VERIFY = 1, EXIT_USAGE = 2, EXIT_SIM = 3, EXIT_DEVICE = 4 };

static int exit_code_for(int rc)
{
    switch (rc) {
    case 0:
        return 0;
    case KB_ERR_VERIFY:
        return EXIT_VERIFY;
    case KB_ERR_CONFIG:
    case KB_ERR_USAGE:
    case KB_ERR_IO:
        return EXIT_USAGE;
    case KB_ERR_DEVICE:
        return EXIT_DEVICE;
    default:
        return EXIT_SIM;
    }
}

static void usage_main(FILE *f)
{
    fputs("usage: kbcl <command> [options]\n"
          "\n"
          "commands:\n"
          "  run      run a bench: simulate its timing (Phase 1) and, with --verify-data,\n"
          "           replay its data (Phase 2) and check the numbers\n"
          "  list     list benches and their parameters\n"
          "  version  print the version\n"
          "\n"
          "kbcl <command> --help shows the command's options.\n"
          "exit codes: 0 ok, 1 verification failed, 2 usage/config error, 3 simulation error,\n"
          "            4 device error\n",
          f);
}

static void usage_run(FILE *f)
{
    fputs("usage: kbcl run [options]\n"
          "\n"
          "  --bench NAME         bench to run (default gemm; see kbcl list)\n"
          "  --topology FILE      machine description (default configs/topology.yaml)\n"
          "  --ccl FILE           collective library config (default configs/ccl.yaml)\n"
          "  --set KEY=VALUE      override a config key, e.g. system.sips.count=4,\n"
          "                       ccl.defaults.n_slots=1 (repeatable)\n"
          "  --param NAME=VALUE   set a bench parameter, e.g. m=512 (repeatable)\n"
          "  --algorithm NAME     collective for ccl_allreduce (an entry of ccl.yaml)\n"
          "  --world-size N       ranks (rank = PE mode; overrides the entry's world_size)\n"
          "  --n-elem N           f16 elements per rank tile\n"
          "  --buffer-kind K      where IPCQ rx rings live: tcm | hbm | sram\n"
          "  --device DEV         ref | none (none = timing only, no data)  [default ref]\n"
          "  --verify-data        replay the data and check it against a host computation\n"
          "  --json FILE          write the results as JSON (atomically)\n"
          "  --quiet              print only the result line\n"
          "environment: KBCL_CCL_TRACE=1 prints one line per IPCQ send/recv to stderr;\n"
          "KBCL_CONFIG_DIR=DIR reads DIR/topology.yaml and DIR/ccl.yaml by default\n",
          f);
}

/* Default config file: $KBCL_CONFIG_DIR/NAME, else the source tree's configs/NAME, else none. */
static const char *default_config(const char *name, char *buf, size_t n)
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
    return NULL;
}

static int cmd_list(void)
{
    printf("benches:\n");
    for (int i = 0; kb_bench_at(i); i++) {
        const kb_bench *b = kb_bench_at(i);
        printf("  %-12s %s\n", b->name, b->summary);
        for (int j = 0; j < b->nparams; j++)
            printf("      --param %s=N   %s (default %lld, %lld..%lld)\n", b->params[j].name,
                   b->params[j].doc, (long long)b->params[j].dflt, (long long)b->params[j].min,
                   (long long)b->params[j].max);
    }
    printf("collective algorithms (ccl.yaml module names):\n");
    for (int i = 0; kb_ccl_algo_at(i); i++)
        printf("  %-24s %s\n", kb_ccl_algo_at(i)->module, kb_ccl_algo_at(i)->summary);
    printf("topologies:\n ");
    for (int i = 0; kb_topo_names[i]; i++)
        printf(" %s", kb_topo_names[i]);
    printf("\n");
    printf("devices:\n  ref    plain-C reference replay (the oracle)\n"
           "  none   timing only: no op log, no data\n");
    return 0;
}

/* Writes text to path atomically (temporary file + rename). */
static int write_atomic(const char *path, const char *text, kb_errbuf *eb)
{
    char tmp[4096];
    FILE *f;
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    f = fopen(tmp, "w");
    if (!f)
        return kb_err_set(eb, KB_ERR_IO, "%s: %s", tmp, strerror(errno));
    if (fputs(text, f) < 0 || fputc('\n', f) < 0 || fclose(f) != 0) {
        remove(tmp);
        return kb_err_set(eb, KB_ERR_IO, "%s: write failed", tmp);
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        remove(tmp);
        return kb_err_set(eb, KB_ERR_IO, "%s: %s", path, strerror(e));
    }
    return 0;
}

static char *report_json(const kb_bench *b, const kb_bench_args *a, const char *device,
                         const kb_config *cfg, const kb_run_report *rep)
{
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
    cJSON_AddItemToObject(root, "machine", machine);
    cJSON_AddNumberToObject(root, "sim_time_ns", rep->sim_time_ns);
    cJSON_AddNumberToObject(root, "events", (double)rep->events);
    cJSON_AddNumberToObject(root, "fiber_switches", (double)rep->switches);
    cJSON_AddNumberToObject(root, "kernels", (double)rep->kernels);
    cJSON_AddNumberToObject(root, "op_records", (double)rep->records);
    for (int i = 0; i < rep->res.nextras; i++)
        cJSON_AddNumberToObject(root, rep->res.extras[i].name, rep->res.extras[i].value);
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
    cJSON_AddNumberToObject(replay, "records", (double)rep->replay.records);
    cJSON_AddNumberToObject(replay, "batches", (double)rep->replay.batches);
    cJSON_AddNumberToObject(replay, "launches", (double)rep->replay.launches);
    cJSON_AddNumberToObject(replay, "flushes", (double)rep->replay.flushes);
    cJSON_AddItemToObject(root, "replay", replay);
    /* wall-clock fields last: the only ones that differ between identical runs */
    cJSON_AddNumberToObject(replay, "ms", rep->replay.ms);
    cJSON_AddNumberToObject(root, "wall_ms", rep->wall_ms);
    out = cJSON_Print(root);
    cJSON_Delete(root);
    return out;
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

static int parse_i64(const char *s, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 0);
    if (errno || end == s || *end)
        return -1;
    *out = v;
    return 0;
}

static int cmd_run(int argc, char **argv)
{
    const char *bench_name = "ccl_allreduce", *algo = NULL, *world = NULL, *nelem = NULL,
               *bufkind = NULL, *topo_path = NULL, *ccl_path = NULL, *json_path = NULL;
    const char *device_name = "ref";
    const char **sets = calloc((size_t)argc, sizeof *sets), **params = calloc((size_t)argc, sizeof *params);
    int nsets = 0, nparams = 0, verify = 0, quiet = 0, rc = 0, code = 0;
    char pathbuf[2][4096];
    kb_config cfg;
    kb_errbuf eb = { { 0 } };
    kb_bench_args args;
    kb_run_report rep;
    const kb_bench *b;
    int dev;

    kb_config_defaults(&cfg);
    if (!sets || !params) {
        fprintf(stderr, "kbcl: out of memory\n");
        code = EXIT_SIM;
        goto out;
    }
    for (int i = 0; i < argc; i++) {
        const char *o = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEEDV()                                                                   \
    do {                                                                          \
        if (!v) {                                                                 \
            fprintf(stderr, "kbcl run: %s needs a value\n", o);                   \
            code = EXIT_USAGE;                                                    \
            goto out;                                                             \
        }                                                                         \
        i++;                                                                      \
    } while (0)
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            usage_run(stdout);
            goto out;
        } else if (!strcmp(o, "--bench")) {
            NEEDV(); bench_name = v;
        } else if (!strcmp(o, "--topology")) {
            NEEDV(); topo_path = v;
        } else if (!strcmp(o, "--ccl")) {
            NEEDV(); ccl_path = v;
        } else if (!strcmp(o, "--set")) {
            NEEDV(); sets[nsets++] = v;
        } else if (!strcmp(o, "--param")) {
            NEEDV(); params[nparams++] = v;
        } else if (!strcmp(o, "--device")) {
            NEEDV(); device_name = v;
        } else if (!strcmp(o, "--json")) {
            NEEDV(); json_path = v;
        } else if (!strcmp(o, "--algorithm")) {
            NEEDV(); algo = v;
        } else if (!strcmp(o, "--world-size")) {
            NEEDV(); world = v;
        } else if (!strcmp(o, "--n-elem")) {
            NEEDV(); nelem = v;
        } else if (!strcmp(o, "--buffer-kind")) {
            NEEDV(); bufkind = v;
        } else if (!strcmp(o, "--verify-data")) {
            verify = 1;
        } else if (!strcmp(o, "--quiet")) {
            quiet = 1;
        } else {
            fprintf(stderr, "kbcl run: unknown option '%s' (see kbcl run --help)\n", o);
            code = EXIT_USAGE;
            goto out;
        }
#undef NEEDV
    }
    b = kb_bench_find(bench_name);
    if (!b) {
        fprintf(stderr, "kbcl run: unknown bench '%s' (kbcl list shows them)\n", bench_name);
        code = EXIT_USAGE;
        goto out;
    }
    dev = kb_device_from_name(device_name);
    if (dev < 0) {
        fprintf(stderr, "kbcl run: unknown device '%s' (auto, gpu, cpu, ref, none)\n", device_name);
        code = EXIT_USAGE;
        goto out;
    }
    memset(&args, 0, sizeof args);
    args.verify = verify;
    for (int i = 0; i < b->nparams; i++)
        args.p[i] = b->params[i].dflt;
    for (int i = 0; i < nparams; i++) {
        char key[64];
        const char *val;
        int64_t x;
        int idx;
        if (parse_kv(params[i], key, sizeof key, &val) != 0 ||
            (idx = kb_bench_param_index(b, key)) < 0 || parse_i64(val, &x) != 0 ||
            x < b->params[idx].min || x > b->params[idx].max) {
            fprintf(stderr, "kbcl run: --param %s: expected NAME=INTEGER with a parameter of '%s' "
                            "in its range (kbcl list shows them)\n", params[i], b->name);
            code = EXIT_USAGE;
            goto out;
        }
        args.p[idx] = x;
    }

    if (!topo_path)
        topo_path = default_config("topology.yaml", pathbuf[0], sizeof pathbuf[0]);
    if (!ccl_path)
        ccl_path = default_config("ccl.yaml", pathbuf[1], sizeof pathbuf[1]);
    if ((topo_path && (rc = kb_config_load_topology(&cfg, topo_path, &eb)) != 0) ||
        (ccl_path && (rc = kb_config_load_ccl(&cfg, ccl_path, &eb)) != 0)) {
        fprintf(stderr, "kbcl: %s\n", eb.msg);
        code = exit_code_for(rc == KB_ERR_IO ? KB_ERR_USAGE : KB_ERR_CONFIG);
        goto out;
    }
    for (int i = 0; i < nsets; i++) {
        if ((rc = kb_config_set(&cfg, sets[i], &eb)) != 0) {
            fprintf(stderr, "kbcl: %s\n", eb.msg);
            code = EXIT_USAGE;
            goto out;
        }
    }
    /* collective options are shorthands for ccl.yaml overrides of the chosen algorithm */
    {
        char setbuf[256];
        const char *an = algo ? algo : cfg.ccl.defaults.algorithm;
        const char *keys[4] = { NULL, "world_size", "n_elem", "buffer_kind" };
        const char *vals[4] = { algo, world, nelem, bufkind };
        for (int i = 0; i < 4; i++) {
            if (!vals[i])
                continue;
            if (i == 0)
                snprintf(setbuf, sizeof setbuf, "ccl.defaults.algorithm=%s", vals[i]);
            else
                snprintf(setbuf, sizeof setbuf, "ccl.algorithms.%s.%s=%s", an, keys[i], vals[i]);
            if (i == 0 && !kb_config_find_algo(&cfg, vals[i])) {
                fprintf(stderr, "kbcl: --algorithm %s: no such entry in ccl.yaml (kbcl list shows "
                                "them)\n", vals[i]);
                code = EXIT_USAGE;
                goto out;
            }
            if ((rc = kb_config_set(&cfg, setbuf, &eb)) != 0) {
                fprintf(stderr, "kbcl: %s\n", eb.msg);
                code = EXIT_USAGE;
                goto out;
            }
        }
    }
    if ((rc = kb_config_validate(&cfg, &eb)) != 0) {
        fprintf(stderr, "kbcl: %s\n", eb.msg);
        code = EXIT_USAGE;
        goto out;
    }

    {
        const char *tr = getenv("KBCL_CCL_TRACE");
        kb_ctx_opts opts = { (kb_device_kind)dev, tr && *tr && strcmp(tr, "0") ? stderr : NULL };
        rc = kb_bench_execute(&cfg, &opts, b, &args, &rep, &eb);
    }
    if (rc) {
        if (rep.report) /* the whole deadlock report, not just the message's start */
            fprintf(stderr, "kbcl: %s: at the end of the run:%s\n", kb_strerror(rc), rep.report);
        else
            fprintf(stderr, "kbcl: %s: %s\n", kb_strerror(rc), eb.msg);
        kb_run_report_fini(&rep);
        code = exit_code_for(rc);
        goto out;
    }
    if (rep.res.verified == 1)
        printf("%s: %s\n", rep.res.line, rep.res.ok_text[0] ? rep.res.ok_text : "OK");
    else if (rep.res.verified == 0)
        printf("  [FAIL] %s: %s\n", rep.res.line + 2, rep.res.detail);
    else
        printf("%s: timing only (%s)\n", rep.res.line,
               dev == KB_DEV_NONE ? "--device none" : "add --verify-data to check the numbers");
    if (!quiet) {
        printf("  sim_time   %.3f ns (%.3f us)\n", rep.sim_time_ns, rep.sim_time_ns / 1000.0);
        for (int i = 0; i < rep.res.nextras; i++)
            printf("  %-10s %.6g\n", rep.res.extras[i].name, rep.res.extras[i].value);
        printf("  events     %llu (%llu fiber switches, %llu kernels)\n",
               (unsigned long long)rep.events, (unsigned long long)rep.switches,
               (unsigned long long)rep.kernels);
        if (rep.res.have_err)
            printf("  max_err    %.6g (bound %.6g)\n", rep.res.max_abs_err, rep.res.err_bound);
        if (rep.res.have_digest)
            printf("  digest     %016llx\n", (unsigned long long)rep.res.digest);
        if (rep.replay.flushes)
            printf("  replay     %s: %llu records, %llu batches, %llu launches, %.3f ms\n",
                   device_name, (unsigned long long)rep.replay.records,
                   (unsigned long long)rep.replay.batches,
                   (unsigned long long)rep.replay.launches, rep.replay.ms);
        printf("  wall       %.3f ms\n", rep.wall_ms);
    }
    if (json_path) {
        char *text = report_json(b, &args, device_name, &cfg, &rep);
        if (!text) {
            fprintf(stderr, "kbcl: out of memory writing JSON\n");
            code = EXIT_SIM;
            goto out;
        }
        rc = write_atomic(json_path, text, &eb);
        cJSON_free(text);
        if (rc) {
            fprintf(stderr, "kbcl: %s\n", eb.msg);
            code = EXIT_USAGE;
            goto out;
        }
    }
    code = rep.res.verified == 0 ? EXIT_VERIFY : 0;
    kb_run_report_fini(&rep);
out:
    free(sets);
    free(params);
    kb_config_fini(&cfg);
    return code;
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
        !strcmp(argv[1], "help")) {
        usage_main(argc < 2 ? stderr : stdout);
        return argc < 2 ? EXIT_USAGE : 0;
    }
    if (!strcmp(argv[1], "run"))
        return cmd_run(argc - 2, argv + 2);
    if (!strcmp(argv[1], "list"))
        return cmd_list();
    if (!strcmp(argv[1], "version") || !strcmp(argv[1], "--version")) {
        printf("kbcl %s\n", KBCL_VERSION);
        return 0;
    }
    fprintf(stderr, "kbcl: unknown command '%s'\n", argv[1]);
    usage_main(stderr);
    return EXIT_USAGE;
}
