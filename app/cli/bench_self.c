/*
 * kbcl bench-self — the simulator's own speed, measured on this machine.
 *
 * Phase 1: a synthetic event-loop benchmark (callbacks re-scheduling themselves with random
 * delays, so the heap holds `pending` events), the fiber switch cost (a fiber sleeping 0 ps in
 * a loop: one FIFO event and two switches per iteration), the IPCQ send -> recv round trip in
 * host nanoseconds (two PEs ping-ponging one message), memory per PE (resident bytes a context
 * adds per simulated PE), and the timing-only runs of the 256-PE ring all-reduce and of the
 * hierarchical all-reduce at 256 / 1 024 / 2 048 / 8 192 PEs (each run in a child process, so
 * its peak RSS is its own), the partitioned engine's speed-up over threads (kb_psim on
 * synthetic rings of 8, 32 and 128 partitions: the engine alone) and, with --scaling, the
 * machine's (ring_rsag launches forked over 8, 32 and 128 SIPs). Phase 2: replay throughput of
 * the chosen device's backend (see
 * kb_cli.h: kbcl_bench_phase2). Wall-clock numbers vary with the machine and its load; the
 * JSON records what was measured, the table prints it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "kb_ccl.h"
#include "kb_cli.h"
#include "kb_ipcq.h"
#include "kb_psim.h"
#include "kb_sim.h"
#include "kb_tl.h"

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* ---- event loop ---- */

typedef struct evloop {
    uint64_t left;
    uint32_t rng;
} evloop;

static void ev_tick(kb_sim *sim, void *a, void *b)
{
    evloop *e = a;
    (void)b;
    if (e->left == 0)
        return;
    e->left--;
    e->rng = e->rng * 1664525u + 1013904223u;
    kb_sim_after(sim, 1 + (kb_time)(e->rng >> 20), ev_tick, e, NULL);
}

static double bench_event_loop(int pending, uint64_t total, double *events_per_s)
{
    kb_sim *sim = kb_sim_create(NULL);
    evloop e = { total, 12345u };
    double t0, t1;
    *events_per_s = 0;
    if (!sim)
        return -1;
    for (int i = 0; i < pending; i++)
        kb_sim_after(sim, (kb_time)i, ev_tick, &e, NULL);
    t0 = now_ns();
    kb_sim_run(sim);
    t1 = now_ns();
    uint64_t n = kb_sim_events(sim);
    kb_sim_destroy(sim);
    *events_per_s = (double)n / ((t1 - t0) / 1e9);
    return (t1 - t0) / (double)n;
}

/* ---- partitioned engine (kb_psim) ---- */

/*
 * A ring of entities spread over partitions in blocks, as PEs over SIPs: every entity starts
 * a token that travels `hops` steps round the ring, 10-40 ns per step inside a partition and
 * the lookahead (an inter-SIP link's 500 ns) plus that across a boundary, and mixes each
 * arrival into the entity's digest with a little arithmetic (about what a kernel's step
 * costs the host). The same run on every thread count: the digests must agree.
 */
typedef struct pring {
    kb_psim *ps;
    uint64_t *hash;
    int n, per;
    int refused;
} pring;

static void pring_ev(kb_sim *sim, void *a, void *b)
{
    pring *r = a;
    uintptr_t v = (uintptr_t)b;
    int i = (int)(v & 0xffffffu), left = (int)(v >> 24), j = (i + 1) % r->n;
    kb_time now = kb_sim_now(sim), dt = 10000 + (kb_time)((uint64_t)i * 7919u % 4u) * 10000;
    uint64_t h = r->hash[i] ^ (uint64_t)now;
    for (int k = 0; k < 64; k++)
        h = (h ^ (h >> 29)) * 0xbf58476d1ce4e5b9ull;
    r->hash[i] = h;
    if (left == 0)
        return;
    if (i / r->per != j / r->per)
        dt += kb_psim_lookahead(r->ps);
    if (kb_psim_post(r->ps, i / r->per, j / r->per, now + dt, pring_ev, r,
                     (void *)(((uintptr_t)(left - 1) << 24) | (uintptr_t)j)) != 0)
        r->refused++;
}

/* Events per second of the ring at `threads`; *digest is the run's result. */
static double bench_psim(int parts, int per, int hops, int threads, uint64_t *digest,
                         uint64_t *windows)
{
    kb_psim_opts o = { .parts = parts, .threads = threads, .lookahead = 500000 };
    pring r = { .n = parts * per, .per = per };
    double t0, t1, eps = -1;
    *digest = 0;
    if (kb_psim_create(&o, &r.ps) != 0)
        return -1;
    if (!(r.hash = calloc((size_t)r.n, sizeof *r.hash)))
        goto out;
    for (int i = 0; i < r.n; i++)
        if (kb_sim_at(kb_psim_part(r.ps, i / per), 0, pring_ev, &r,
                      (void *)(((uintptr_t)hops << 24) | (uintptr_t)i)) != 0)
            goto out;
    t0 = now_ns();
    if (kb_psim_run(r.ps) != 0 || r.refused)
        goto out;
    t1 = now_ns();
    for (int i = 0; i < r.n; i++)
        *digest = (*digest ^ r.hash[i]) * 0x100000001b3ull;
    *windows = kb_psim_windows(r.ps);
    eps = (double)kb_psim_events(r.ps) / ((t1 - t0) / 1e9);
out:
    free(r.hash);
    kb_psim_destroy(r.ps);
    return eps;
}

/* The table: rings of 1 024, 4 096 and 16 384 entities (8, 32 and 128 partitions of 128, as
 * PEs over SIPs) at threads 1 .. 16, each ring with about 4 M events (--quick: 0.8 M). */
static cJSON *psim_table(int quick)
{
    static const int th[] = { 1, 2, 4, 8, 16 };
    static const int ranks[] = { 1024, 4096, 16384 };
    cJSON *arr = cJSON_CreateArray();
    printf("  partitioned engine (a ring, 128 entities per partition, lookahead 500 ns):\n"
           "    %6s %7s %9s %11s %9s %8s\n", "ranks", "threads", "M ev/s", "speed-up",
           "windows", "result");
    for (size_t r = 0; r < sizeof ranks / sizeof ranks[0]; r++) {
        double base = 0;
        uint64_t d0 = 0;
        int hops = (quick ? 800000 : 4000000) / ranks[r];
        for (size_t k = 0; k < sizeof th / sizeof th[0]; k++) {
            uint64_t dg, win = 0;
            double eps = bench_psim(ranks[r] / 128, 128, hops, th[k], &dg, &win);
            if (k == 0) {
                base = eps;
                d0 = dg;
            }
            cJSON *o = cJSON_CreateObject();
            cJSON_AddNumberToObject(o, "ranks", ranks[r]);
            cJSON_AddNumberToObject(o, "threads", th[k]);
            cJSON_AddNumberToObject(o, "events_per_s", eps);
            cJSON_AddNumberToObject(o, "speedup", base > 0 ? eps / base : 0);
            cJSON_AddNumberToObject(o, "windows", (double)win);
            cJSON_AddBoolToObject(o, "same_result", dg == d0);
            cJSON_AddItemToArray(arr, o);
            printf("    %6d %7d %9.2f %10.2fx %9llu %8s\n", ranks[r], th[k], eps / 1e6,
                   base > 0 ? eps / base : 0, (unsigned long long)win,
                   dg == d0 ? "same" : "DIFFERENT");
        }
    }
    return arr;
}

/* ---- fiber switch ---- */

static void sleeper(kb_sim *sim, void *arg)
{
    long n = *(long *)arg;
    for (long i = 0; i < n; i++)
        kb_fiber_sleep(sim, 0);
}

static double bench_fiber_switch(long iters)
{
    kb_sim *sim = kb_sim_create(NULL);
    double t0, t1;
    if (!sim || !kb_fiber_spawn(sim, sleeper, &iters, "sleeper")) {
        kb_sim_destroy(sim);
        return -1;
    }
    t0 = now_ns();
    kb_sim_run(sim);
    t1 = now_ns();
    uint64_t sw = kb_sim_switches(sim);
    kb_sim_destroy(sim);
    /* every resume is a switch in and a switch out */
    return (t1 - t0) / (2.0 * (double)sw);
}

/* ---- IPCQ round trip ---- */

typedef struct pingpong {
    long iters;
    kb_tensor *t;
    double ns;
} pingpong;

typedef struct pp_args {
    kb_va t;
    int64_t iters;
} pp_args;

static void pp_kernel(kb_tl *tl, const kb_kargs *ka)
{
    const pp_args *a = KB_KARGS_GET(ka, pp_args);
    int me = tl_program_id(tl, 0);
    kb_val v = tl_load(tl, a->t + (kb_va)me * 16u, KB_SHAPE1(8), KB_F16);
    for (int64_t i = 0; i < a->iters; i++) {
        if (me == 0) {
            tl_send(tl, KB_DIR_E, v);
            tl_free(tl, tl_recv(tl, KB_DIR_W, KB_SHAPE1(8), KB_F16));
        } else {
            kb_val r = tl_recv(tl, KB_DIR_W, KB_SHAPE1(8), KB_F16);
            tl_send(tl, KB_DIR_E, r);
            tl_free(tl, r);
        }
    }
}

static int pp_host(kb_ctx *ctx, void *arg)
{
    pingpong *pp = arg;
    kb_ccl_layout l;
    kb_ipcq_cfg icfg = { 4, 64, KB_MEM_TCM, 1, 1 };
    kb_tensor_desc d = { "pp", 1, 16, KB_F16, kb_dp(KB_DP_COLUMN_WISE, KB_DP_COLUMN_WISE, 1, 2),
                         KB_MEM_HBM };
    int rc;
    if ((rc = kb_tensor_zeros(ctx, &d, &pp->t)) != 0 ||
        (rc = kb_ccl_layout_whole(kb_ctx_machine(ctx), 2, &l, kb_ctx_err(ctx))) != 0 ||
        (rc = kb_ccl_install(ctx, "ring_1d", &l, &icfg)) != 0)
        return rc;
    kb_kargs a;
    memset(&a, 0, sizeof a);
    KB_KARGS_PUT(&a, (pp_args){ .t = kb_tensor_va(pp->t), .iters = pp->iters });
    kb_grid g = { 2, 1, 1, -1 };
    double t0 = now_ns();
    rc = kb_launch(ctx, "pingpong", pp_kernel, &a, &g);
    pp->ns = (now_ns() - t0) / (double)pp->iters;
    return rc;
}

static double bench_ipcq_rtt(long iters)
{
    kb_config cfg;
    kb_ctx *ctx = NULL;
    kb_ctx_opts o = { .device = KB_DEV_NONE };
    pingpong pp = { iters, NULL, -1 };
    kb_config_defaults(&cfg);
    if (kb_config_set(&cfg, "system.sips.count=1", NULL) || kb_ctx_create(&cfg, &o, &ctx, NULL))
        return -1;
    if (kb_ctx_run_host(ctx, pp_host, &pp) != 0)
        pp.ns = -1;
    kb_ctx_destroy(ctx);
    return pp.ns;
}

/* ---- memory per PE ---- */

static long rss_bytes(void)
{
    long pages = 0, rss = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f)
        return -1;
    if (fscanf(f, "%ld %ld", &pages, &rss) != 2)
        rss = -1;
    fclose(f);
    return rss < 0 ? -1 : rss * sysconf(_SC_PAGESIZE);
}

static double bench_mem_per_pe(int sips)
{
    kb_config cfg;
    kb_ctx *ctx = NULL;
    kb_ctx_opts o = { .device = KB_DEV_NONE };
    char set[64];
    kb_config_defaults(&cfg);
    snprintf(set, sizeof set, "system.sips.count=%d", sips);
    if (kb_config_set(&cfg, set, NULL))
        return -1;
    long before = rss_bytes();
    if (kb_ctx_create(&cfg, &o, &ctx, NULL))
        return -1;
    long after = rss_bytes();
    int pes = kb_topo_total_pes(&cfg.topo);
    kb_ctx_destroy(ctx);
    return before < 0 || after < 0 ? -1 : (double)(after - before) / pes;
}

/* ---- whole runs, each in a child (own peak RSS) ---- */

typedef struct run_stat {
    int ok;
    double wall_ms, phase1_ms, sim_ns, events, events_per_s, rss_mb, chunks;
} run_stat;

static double extra_of(const kb_bench_result *r, const char *name)
{
    for (int i = 0; i < r->nextras; i++)
        if (!strcmp(r->extras[i].name, name))
            return r->extras[i].value;
    return 0;
}

/* threads > 0: --threads, with system.switch.arbitration=per_sip (docs/parallel.md) */
static run_stat run_child(const char *algo, const char *ws, const char *n_elem, int sips,
                          const char *topo, const char *device, int threads)
{
    run_stat st;
    int fd[2];
    memset(&st, 0, sizeof st);
    if (pipe(fd) != 0)
        return st;
    pid_t pid = fork();
    if (pid == 0) {
        kbcl_job job;
        kbcl_result res;
        kb_errbuf eb;
        char s1[64], s2[64], th[16];
        run_stat r;
        memset(&job, 0, sizeof job);
        memset(&r, 0, sizeof r);
        close(fd[0]);
        job.bench = "ccl_allreduce";
        job.algorithm = algo;
        job.world_size = ws;
        job.n_elem = n_elem;
        job.device = device;
        job.verify = strcmp(device, "none") != 0;
        snprintf(s1, sizeof s1, "system.sips.count=%d", sips);
        snprintf(s2, sizeof s2, "system.sips.topology=%s", topo);
        job.sets[job.nsets++] = s1;
        job.sets[job.nsets++] = s2;
        if (threads > 0) {
            snprintf(th, sizeof th, "%d", threads);
            job.threads = th;
            job.sets[job.nsets++] = "system.switch.arbitration=per_sip";
        }
        if (kbcl_job_run(&job, &res, &eb) == 0 && res.rep.res.verified != 0) {
            struct rusage ru;
            getrusage(RUSAGE_SELF, &ru);
            r.ok = 1;
            r.wall_ms = res.rep.wall_ms;
            r.phase1_ms = res.rep.phase1_ms;
            r.sim_ns = res.rep.sim_time_ns;
            r.events = (double)res.rep.events;
            r.chunks = extra_of(&res.rep.res, "ipcq_chunks");
            r.rss_mb = (double)ru.ru_maxrss / 1024.0;
        }
        kbcl_result_fini(&res);
        ssize_t w = write(fd[1], &r, sizeof r);
        (void)w;
        _exit(0);
    }
    close(fd[1]);
    if (pid > 0) {
        if (read(fd[0], &st, sizeof st) != (ssize_t)sizeof st)
            memset(&st, 0, sizeof st);
        waitpid(pid, NULL, 0);
    }
    close(fd[0]);
    /* the event rate of the simulation loop itself (setup and teardown excluded) */
    if (st.ok && st.phase1_ms > 0)
        st.events_per_s = st.events / (st.phase1_ms / 1e3);
    return st;
}

static cJSON *stat_json(const char *name, int pes, const run_stat *s)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "run", name);
    cJSON_AddNumberToObject(o, "pes", pes);
    cJSON_AddBoolToObject(o, "ok", s->ok);
    cJSON_AddNumberToObject(o, "wall_ms", s->wall_ms);
    cJSON_AddNumberToObject(o, "phase1_ms", s->phase1_ms);
    cJSON_AddNumberToObject(o, "sim_time_ns", s->sim_ns);
    cJSON_AddNumberToObject(o, "events", s->events);
    cJSON_AddNumberToObject(o, "events_per_s", s->events_per_s);
    cJSON_AddNumberToObject(o, "peak_rss_mib", s->rss_mb);
    cJSON_AddNumberToObject(o, "ipcq_chunks", s->chunks);
    cJSON_AddNumberToObject(o, "phase1_us_per_chunk",
                            s->chunks > 0 ? s->phase1_ms * 1e3 / s->chunks : 0);
    return o;
}

/*
 * The machine on threads (--scaling): ring_rsag_allreduce at 8 KiB per rank on 1 024, 4 096
 * and 16 384 ranks (8, 32 and 128 SIPs; --quick: 1 024 and 4 096) with the per_sip
 * arbitration, its launch forked over the SIPs on 1, 2, 4, 8 and 16 threads. The speed-up is
 * the simulation loop's time at 1 thread over its time at N; "same" says that the simulated
 * time and the events are those of 1 thread.
 */
static cJSON *machine_scaling(int quick)
{
    static const int th[] = { 1, 2, 4, 8, 16 };
    static const struct { const char *ws; int sips; } rk[] = { { "1024", 8 }, { "4096", 32 },
                                                               { "16384", 128 } };
    cJSON *arr = cJSON_CreateArray();
    printf("  the machine on threads (ring_rsag_allreduce x 8K, per_sip, --threads N):\n"
           "    %6s %7s %10s %10s %11s %9s %8s\n", "ranks", "threads", "wall ms", "loop ms",
           "speed-up", "peak MiB", "result");
    for (size_t r = 0; r < sizeof rk / sizeof rk[0]; r++) {
        run_stat base;
        if (quick && rk[r].sips > 32)
            continue;
        memset(&base, 0, sizeof base);
        for (size_t k = 0; k < sizeof th / sizeof th[0]; k++) {
            run_stat s = run_child("ring_rsag_allreduce", rk[r].ws, "4096", rk[r].sips,
                                   "ring_1d", "none", th[k]);
            if (k == 0)
                base = s;
            int same = s.ok && base.ok && s.sim_ns == base.sim_ns && s.events == base.events;
            double up = s.ok && base.ok && s.phase1_ms > 0 ? base.phase1_ms / s.phase1_ms : 0;
            cJSON *o = stat_json("ring_rsag_allreduce x 8K", atoi(rk[r].ws), &s);
            cJSON_AddNumberToObject(o, "threads", th[k]);
            cJSON_AddNumberToObject(o, "speedup", up);
            cJSON_AddBoolToObject(o, "same_result", same);
            cJSON_AddItemToArray(arr, o);
            if (s.ok)
                printf("    %6s %7d %10.1f %10.1f %10.2fx %9.1f %8s\n", rk[r].ws, th[k],
                       s.wall_ms, s.phase1_ms, up, s.rss_mb, same ? "same" : "DIFFERENT");
            else
                printf("    %6s %7d   failed\n", rk[r].ws, th[k]);
            fflush(stdout);
        }
    }
    return arr;
}

static void usage_bench_self(FILE *f)
{
    fputs("usage: kbcl bench-self [--device DEV] [--quick] [--scaling] [--json FILE]\n"
          "  measures the simulator itself: event loop, fiber switches, IPCQ round trip,\n"
          "  memory per PE, timing-only runs at 256 .. 8192 PEs, and Phase-2 replay throughput\n"
          "  of DEV's backend (ref, cpu, gpu, auto; default ref)\n"
          "  --quick    smaller scaling runs (up to 2048 PEs) and shorter loops\n"
          "  --scaling  also the machine on threads: ring_rsag on 1024, 4096 and 16384 ranks\n"
          "             at --threads 1, 2, 4, 8, 16 (with --quick: up to 4096 ranks); long\n",
          f);
}

int kbcl_cmd_bench_self(int argc, char **argv)
{
    const char *json_path = NULL, *device = "ref";
    int quick = 0, scaling = 0;
    cJSON *root = cJSON_CreateObject(), *p1 = cJSON_CreateObject(), *runs = cJSON_CreateArray();
    kb_errbuf eb;

    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc)
            json_path = argv[++i];
        else if (!strcmp(argv[i], "--device") && i + 1 < argc)
            device = argv[++i];
        else if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--scaling"))
            scaling = 1;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage_bench_self(stdout);
            cJSON_Delete(root);
            return 0;
        } else {
            fprintf(stderr, "kbcl bench-self: unknown option '%s'\n", argv[i]);
            usage_bench_self(stderr);
            cJSON_Delete(root);
            return KBCL_EXIT_USAGE;
        }
    }
    cJSON_AddStringToObject(root, "kbcl_version", KBCL_VERSION);
    printf("Phase 1 (simulation)\n");
    static const int pend[] = { 1, 1000, 100000 };
    cJSON *evl = cJSON_CreateArray();
    for (size_t i = 0; i < sizeof pend / sizeof pend[0]; i++) {
        double eps, ns = bench_event_loop(pend[i], quick ? 500000 : 3000000, &eps);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "pending", pend[i]);
        cJSON_AddNumberToObject(o, "ns_per_event", ns);
        cJSON_AddNumberToObject(o, "events_per_s", eps);
        cJSON_AddItemToArray(evl, o);
        printf("  event loop, %6d pending      %8.1f ns/event  %7.2f M events/s\n", pend[i], ns,
               eps / 1e6);
    }
    cJSON_AddItemToObject(p1, "event_loop", evl);
    double sw = bench_fiber_switch(quick ? 200000 : 2000000);
    cJSON_AddNumberToObject(p1, "fiber_switch_ns", sw);
    printf("  fiber switch                  %8.1f ns\n", sw);
    double rtt = bench_ipcq_rtt(quick ? 2000 : 20000);
    cJSON_AddNumberToObject(p1, "ipcq_round_trip_host_ns", rtt);
    printf("  IPCQ send->recv round trip    %8.0f ns of host time\n", rtt);
    double mpe = bench_mem_per_pe(8);
    cJSON_AddNumberToObject(p1, "memory_per_pe_bytes", mpe);
    printf("  memory per PE                 %8.0f bytes (context of 1024 PEs)\n", mpe);
    cJSON_AddItemToObject(p1, "partitioned_engine", psim_table(quick));

    printf("  %-32s %6s %9s %9s %9s %11s %9s %9s\n", "timing-only run", "PEs", "wall ms",
           "loop ms", "events", "loop ev/s", "us/chunk", "peak MiB");
    /* ring_rsag at n = 4096 (8 KiB per rank): one-element chunks at 4 096 ranks, the
     * message-bound end of a sweep; us/chunk = loop time over IPCQ chunks sent */
    struct { const char *name, *algo, *ws, *n; int sips; const char *topo; int pes; } rs[] = {
        { "ring_allreduce 256", "ring_allreduce_tcm", "256", "8", 2, "ring_1d", 256 },
        { "ring_rsag_allreduce 256 x 8K", "ring_rsag_allreduce", "256", "4096", 2, "ring_1d", 256 },
        { "ring_rsag_allreduce 1024 x 8K", "ring_rsag_allreduce", "1024", "4096", 8, "ring_1d", 1024 },
        { "ring_rsag_allreduce 4096 x 8K", "ring_rsag_allreduce", "4096", "4096", 32, "ring_1d", 4096 },
        { "hierarchical_allreduce 256", "hierarchical_allreduce", "256", "8", 2, "ring_1d", 256 },
        { "hierarchical_allreduce 1024", "hierarchical_allreduce", "1024", "8", 8, "ring_1d", 1024 },
        { "hierarchical_allreduce 2048", "hierarchical_allreduce", "2048", "8", 16, "ring_1d", 2048 },
        { "hierarchical_allreduce 8192", "hierarchical_allreduce", "8192", "8", 64, "ring_1d", 8192 },
    };
    for (size_t i = 0; i < sizeof rs / sizeof rs[0]; i++) {
        if (quick && rs[i].pes > 2048)
            continue;
        run_stat s = run_child(rs[i].algo, rs[i].ws, rs[i].n, rs[i].sips, rs[i].topo, "none", 0);
        cJSON_AddItemToArray(runs, stat_json(rs[i].name, rs[i].pes, &s));
        if (s.ok)
            printf("  %-32s %6d %9.1f %9.1f %9.0f %11.3g %9.3f %9.1f\n", rs[i].name, rs[i].pes,
                   s.wall_ms, s.phase1_ms, s.events, s.events_per_s,
                   s.chunks > 0 ? s.phase1_ms * 1e3 / s.chunks : 0.0, s.rss_mb);
        else
            printf("  %-32s %6d   failed\n", rs[i].name, rs[i].pes);
    }
    cJSON_AddItemToObject(p1, "runs", runs);
    if (scaling)
        cJSON_AddItemToObject(p1, "machine_scaling", machine_scaling(quick));
    cJSON_AddItemToObject(root, "phase1", p1);

    cJSON *p2 = NULL;
    int rc = kbcl_bench_phase2(device, quick, &p2, &eb);
    if (rc) {
        fprintf(stderr, "kbcl bench-self: %s\n", eb.msg);
        cJSON_Delete(root);
        return kbcl_exit_code(rc);
    }
    cJSON_AddItemToObject(root, "phase2", p2);
    if (json_path) {
        char *text = cJSON_Print(root);
        rc = text ? kbcl_write_atomic(json_path, text, &eb) : KB_ERR_NOMEM;
        cJSON_free(text);
        if (rc) {
            fprintf(stderr, "kbcl bench-self: %s\n", eb.msg);
            cJSON_Delete(root);
            return kbcl_exit_code(rc);
        }
    }
    cJSON_Delete(root);
    return 0;
}
