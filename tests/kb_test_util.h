/*
 * kb_test_util — helpers the cmocka tests share instead of copying: one random generator
 * (splitmix64), float bit patterns, ns/rate -> ps arithmetic done independently of the
 * simulator, a scratch directory with file helpers and runs of the kbcl binary ($KBCL_BIN)
 * with their output captured, error-message checks, and, for the layers a test includes
 * before this header, random op records (kb_oplog.h), configurations and their key listings
 * (kb_config.h), contexts (kb_runtime.h), collective-library configurations and contexts that
 * carry one (kb_ccl_config.h) and the kernel clock (kb_tl.h). Header-only: every function is
 * static inline, so a test carries only what it calls and links against no more than its own
 * layer. Failures are cmocka failures of the calling test, with the library's message where
 * there is one.
 */
#ifndef KB_TEST_UTIL_H
#define KB_TEST_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- random numbers: splitmix64 (any seed, including 0, gives a full-period stream) ---- */

typedef struct kbt_rng {
    uint64_t s;
} kbt_rng;

static inline uint64_t kbt_rng_next(kbt_rng *g)
{
    uint64_t z = (g->s += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* Uniform in [0, n) (n > 0; the modulo bias is far below what a test can see). */
static inline uint32_t kbt_rng_below(kbt_rng *g, uint32_t n)
{
    return (uint32_t)(kbt_rng_next(g) % n);
}

/* Uniform in [lo, hi), on a 2^-24 grid. */
static inline float kbt_rng_float(kbt_rng *g, float lo, float hi)
{
    return lo + (hi - lo) * (float)(kbt_rng_next(g) >> 40) * 0x1p-24f;
}

/* ---- float bit patterns ---- */

static inline uint32_t kbt_f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float kbt_u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- expected times, computed apart from the simulator's own arithmetic ---- */

/* ns -> ps, rounded to nearest. */
static inline int64_t kbt_ps(double ns) { return (int64_t)(ns * 1000.0 + 0.5); }

/* ceil(n * 1000 / rate) ps: n bytes (or items) at `rate` per ns (GB/s), the rate rounded to
 * whole bytes per us as the configuration stores it. */
static inline int64_t kbt_xfer_ps(uint64_t n, double rate)
{
    uint64_t per_us = (uint64_t)(rate * 1000.0 + 0.5);
    return (int64_t)((n * UINT64_C(1000000) + per_us - 1) / per_us);
}

/* ---- error messages ---- */

/* Fails the test unless msg contains part. */
static inline void kbt_msg_has(const char *msg, const char *part)
{
    if (!strstr(msg, part))
        fail_msg("message '%s' lacks '%s'", msg, part);
}

/* Fails the test unless msg starts with "path:loc" (a FILE:LINE:COLUMN location, or its
 * start) and contains part. */
static inline void kbt_msg_at(const char *msg, const char *path, const char *loc,
                              const char *part)
{
    char head[512];
    snprintf(head, sizeof head, "%s:%s", path, loc);
    if (strncmp(msg, head, strlen(head)) != 0 || !strstr(msg, part))
        fail_msg("message '%s' lacks '%s' or '%s'", msg, head, part);
}

/* ---- a scratch directory, its files, and the kbcl binary run inside it ---- */

/* The test program's scratch directory (empty until kbt_workdir_make). */
static inline char *kbt_workdir(void)
{
    static char dir[256];
    return dir;
}

/* Makes /tmp/<prefix>-XXXXXX the scratch directory; 0 or -1 (a cmocka setup's result). */
static inline int kbt_workdir_make(const char *prefix)
{
    snprintf(kbt_workdir(), 256, "/tmp/%s-XXXXXX", prefix);
    return mkdtemp(kbt_workdir()) ? 0 : -1;
}

/* Removes the scratch directory and everything in it; 0 or -1 (a teardown's result). */
static inline int kbt_workdir_remove(void)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", kbt_workdir());
    return system(cmd) == 0 ? 0 : -1;
}

/* The path of `name` in the scratch directory. */
static inline void kbt_path(char *buf, size_t n, const char *name)
{
    snprintf(buf, n, "%s/%s", kbt_workdir(), name);
}

/* The whole of scratch file `name`, NUL-terminated (malloc'd), or NULL if it cannot be read. */
static inline char *kbt_slurp(const char *name)
{
    char path[512];
    FILE *f;
    long sz;
    char *buf;
    kbt_path(path, sizeof path, name);
    f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = malloc((size_t)sz + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)sz, f), (size_t)sz);
    buf[sz] = 0;
    fclose(f);
    return buf;
}

static inline void kbt_write_file(const char *name, const char *text)
{
    char path[512];
    FILE *f;
    kbt_path(path, sizeof path, name);
    f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* Writes text to a new file /tmp/<prefix>_XXXXXX (mkstemp); path receives its name. The
 * caller unlinks it. */
static inline void kbt_tmp_file(const char *prefix, const char *text, char path[64])
{
    size_t len = strlen(text);
    int fd;
    snprintf(path, 64, "/tmp/%s_XXXXXX", prefix);
    fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, len), (ssize_t)len);
    close(fd);
}

/* rel inside the source tree ($KBCL_SOURCE_DIR, set by CTest) into buf, or NULL without it. */
static inline const char *kbt_source_path(const char *rel, char *buf, size_t cap)
{
    const char *dir = getenv("KBCL_SOURCE_DIR");
    if (!dir)
        return NULL;
    snprintf(buf, cap, "%s/%s", dir, rel);
    return buf;
}

/* The whole of the file at path, NUL-terminated (malloc'd); fails the test when unreadable
 * or empty. */
static inline char *kbt_read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    char *text;
    long len;
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    len = ftell(f);
    assert_true(len > 0);
    rewind(f);
    text = calloc(1, (size_t)len + 1);
    assert_non_null(text);
    assert_int_equal(fread(text, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    return text;
}

/* The binary under test: $KBCL_BIN (CTest sets it), else ./kbcl. */
static inline const char *kbt_kbcl_bin(void)
{
    const char *b = getenv("KBCL_BIN");
    return b ? b : "./kbcl";
}

/* kbt_kbcl's body: `kbcl ARGS` in the scratch directory, stderr to `err` (a shell redirection,
 * "2>&1" or "2>/dev/null"), stdout into out. */
static inline int kbt_kbcl_va(char *out, size_t n, const char *err, const char *fmt, va_list ap)
{
    char args[2048], cmd[4096];
    FILE *p;
    size_t len = 0;
    int st;

    vsnprintf(args, sizeof args, fmt, ap);
    snprintf(cmd, sizeof cmd, "cd %s && '%s' %s %s", kbt_workdir(), kbt_kbcl_bin(), args, err);
    p = popen(cmd, "r");
    assert_non_null(p);
    while (len + 1 < n && fgets(out + len, (int)(n - len), p))
        len += strlen(out + len);
    out[len] = 0;
    st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/*
 * Runs `kbcl ARGS` (ARGS from fmt, as a shell would split them) in the scratch directory with
 * stdout and stderr captured into out (n bytes, NUL-terminated, cut if longer); returns the
 * exit status, -1 if it did not exit.
 */
static inline int kbt_kbcl(char *out, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = kbt_kbcl_va(out, n, "2>&1", fmt, ap);
    va_end(ap);
    return rc;
}

/* kbt_kbcl with stdout alone captured (stderr discarded): for output that must be byte-exact. */
static inline int kbt_kbcl_stdout(char *out, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = kbt_kbcl_va(out, n, "2>/dev/null", fmt, ap);
    va_end(ap);
    return rc;
}

/* ---- op records (kb_cl) ---- */
#ifdef KB_OPLOG_H

/* A record of kind k at t (10 ps long) with the kind's number of sources, all else zero. */
static inline kb_rec kbt_rec_new(kb_rec_kind k, kb_time t)
{
    static const unsigned nsrc[KB_REC_NKINDS] = { 1, 0, 1, 2, 3, 1, 1, 1, 2, 1, 1, 2,
                                                   /* dequant (elements only) */ 1 };
    kb_rec r;
    memset(&r, 0, sizeof r);
    r.kind = (uint8_t)k;
    r.nsrc = (uint8_t)nsrc[k];
    r.t_start = t;
    r.t_end = t + 10;
    return r;
}

/* A random value in [lo, hi) stored as dtype t into element i of buf. */
static inline void kbt_rand_store(kbt_rng *g, kb_dtype t, uint8_t *buf, size_t i, float lo,
                                  float hi)
{
    kb_dtype_store(t, buf, i, kbt_rng_float(g, lo, hi));
}

/* bytes / 2 random f16 values in [lo, hi). */
static inline void kbt_rand_f16(kbt_rng *g, uint8_t *buf, size_t bytes, float lo, float hi)
{
    for (size_t i = 0; i + 1 < bytes; i += 2)
        kbt_rand_store(g, KB_F16, buf, i / 2, lo, hi);
}

/*
 * Random records over a window of memory: every kind, dtype and op, shapes up to maxr x maxc
 * (gemm inner dimension up to maxk), broadcasting sources, row strides, in-place records now
 * and then, and optionally odd addresses, payload sources and a destination that never partly
 * overlaps a source (for comparisons where element order must not matter).
 */
typedef struct kbt_recgen {
    kbt_rng g;
    uint64_t base;          /* window start PA */
    uint32_t win;           /* window bytes */
    uint32_t maxr, maxc, maxk;
    int odd_addr;           /* one operand in 16 at a misaligned element address */
    int disjoint;           /* dst equal to its first source or disjoint from every source */
    /* one source in payload_one_in (0: none) moves to the payload, filled with random values:
     * add_payload(ud, bytes, n) stores them and returns their payload offset */
    uint32_t payload_one_in;
    uint64_t (*add_payload)(void *ud, const void *bytes, size_t n);
    void *ud;
} kbt_recgen;

/* An operand of the given shape somewhere in the window. */
static inline kb_opnd kbt_rand_place(kbt_recgen *ge, uint32_t rows, uint32_t cols, kb_dtype t)
{
    kb_opnd o = kb_opnd_make(0, rows, cols, t);
    size_t es = kb_dtype_size(t);
    uint64_t slack = ge->odd_addr ? 4 : 0; /* room for the misaligned shift */
    o.ld = cols + (rows > 1 ? kbt_rng_below(&ge->g, 3) : 0);
    uint64_t span = kb_opnd_span(&o);
    assert_true(span + slack <= ge->win);
    uint64_t slots = (ge->win - span - slack) / es + 1;
    o.addr = ge->base + es * (kbt_rng_next(&ge->g) % slots);
    if (ge->odd_addr && kbt_rng_below(&ge->g, 16) == 0)
        o.addr += es == 2 ? 1 : 2;
    return o;
}

/* A source broadcasting to rows x cols (a row, a column or the full shape). */
static inline kb_opnd kbt_rand_bsrc(kbt_recgen *ge, uint32_t rows, uint32_t cols)
{
    uint32_t r = kbt_rng_below(&ge->g, 4) == 0 ? 1 : rows;
    uint32_t c = kbt_rng_below(&ge->g, 4) == 0 ? 1 : cols;
    return kbt_rand_place(ge, r, c, (kb_dtype)kbt_rng_below(&ge->g, KB_NDTYPES));
}

static inline void kbt__to_payload(kbt_recgen *ge, kb_opnd *o)
{
    size_t span = (size_t)kb_opnd_span(o);
    size_t es = kb_dtype_size((kb_dtype)o->dtype);
    uint8_t *buf = calloc(span + 1, 1);
    assert_non_null(buf);
    for (size_t i = 0; i < span / es; i++)
        kbt_rand_store(&ge->g, (kb_dtype)o->dtype, buf, i, -2.0f, 2.0f);
    o->addr = ge->add_payload(ge->ud, buf, span);
    o->space = KB_SPACE_PAYLOAD;
    free(buf);
}

static inline int kbt__overlap(const kb_opnd *a, const kb_opnd *b)
{
    if (a->space != KB_SPACE_MEM || b->space != KB_SPACE_MEM)
        return 0;
    uint64_t sa = kb_opnd_span(a), sb = kb_opnd_span(b);
    return sa && sb && a->addr < b->addr + sb && b->addr < a->addr + sa;
}

/* dst disjoint from every source, or (elementwise and softmax) exactly the first one. */
static inline int kbt__disjoint(const kb_rec *r)
{
    for (unsigned s = 0; s < r->nsrc; s++) {
        if (!kbt__overlap(&r->dst, &r->src[s]))
            continue;
        if (s == 0 && r->kind != KB_REC_GEMM && r->kind != KB_REC_REDUCE &&
            r->kind != KB_REC_TRANSPOSE && r->kind != KB_REC_GATHER &&
            r->kind != KB_REC_DEQUANT &&
            memcmp(&r->dst, &r->src[0], sizeof r->dst) == 0)
            continue;
        return 0;
    }
    return 1;
}

static inline kb_rec kbt_rand_rec(kbt_recgen *ge, kb_time t)
{
    kbt_rng *g = &ge->g;
    kb_rec_kind k = (kb_rec_kind)kbt_rng_below(g, KB_REC_NKINDS);
    kb_rec r = kbt_rec_new(k, t);
    uint32_t rows = 1 + kbt_rng_below(g, ge->maxr), cols = 1 + kbt_rng_below(g, ge->maxc);
    kb_dtype dt = (kb_dtype)kbt_rng_below(g, KB_NDTYPES);

    switch (k) {
    case KB_REC_COPY:
    case KB_REC_MATH1:
    case KB_REC_MATH2:
    case KB_REC_FMA:
    case KB_REC_CLAMP:
        for (unsigned s = 0; s < r.nsrc; s++)
            r.src[s] = kbt_rand_bsrc(ge, rows, cols);
        r.op = (uint8_t)(k == KB_REC_MATH1 ? kbt_rng_below(g, KB_M1_NOPS)
                         : k == KB_REC_MATH2 ? kbt_rng_below(g, KB_M2_NOPS) : 0);
        r.imm[0] = k == KB_REC_CLAMP ? kbt_rng_float(g, -1.0f, 0.0f)
                                     : kbt_rng_float(g, -2.0f, 2.0f);
        r.imm[1] = k == KB_REC_CLAMP ? kbt_rng_float(g, 0.0f, 1.0f)
                                     : kbt_rng_float(g, -1.0f, 1.0f);
        break;
    case KB_REC_FILL:
        r.imm[0] = kbt_rng_float(g, -4.0f, 4.0f);
        break;
    case KB_REC_SOFTMAX:
        r.op = (uint8_t)kbt_rng_below(g, 2);
        r.src[0] = kbt_rand_place(ge, rows, cols, (kb_dtype)kbt_rng_below(g, KB_NDTYPES));
        break;
    case KB_REC_REDUCE:
        r.op = (uint8_t)kbt_rng_below(g, KB_RED_NOPS);
        r.src[0] = kbt_rand_place(ge, rows, cols, (kb_dtype)kbt_rng_below(g, KB_NDTYPES));
        if (kbt_rng_below(g, 2)) {
            r.flags = KB_REC_AXIS0;
            rows = 1;
        } else {
            cols = 1;
        }
        break;
    case KB_REC_GEMM: {
        uint32_t kd = 1 + kbt_rng_below(g, ge->maxk);
        r.flags = kbt_rng_below(g, 2) ? KB_REC_ACC : 0;
        r.src[0] = kbt_rand_place(ge, rows, kd, (kb_dtype)kbt_rng_below(g, KB_NDTYPES));
        r.src[1] = kbt_rand_place(ge, kd, cols, (kb_dtype)kbt_rng_below(g, KB_NDTYPES));
        break;
    }
    case KB_REC_TRANSPOSE:
        r.src[0] = kbt_rand_place(ge, cols, rows, (kb_dtype)kbt_rng_below(g, KB_NDTYPES));
        break;
    case KB_REC_ATTN_SOFTMAX:
        r.op = (uint8_t)kbt_rng_below(g, 2);
        r.imm[0] = kbt_rng_float(g, 0.1f, 2.0f);
        r.imm[1] = kbt_rng_below(g, 2) ? kbt_rng_float(g, 1.0f, 30.0f) : 0.0f;
        r.src[0] = kbt_rand_place(ge, rows, cols, (kb_dtype)kbt_rng_below(g, KB_NDTYPES));
        /* the causal offset (no operand), from fully masked rows to none masked */
        r.src[1].addr = (uint64_t)((int64_t)kbt_rng_below(g, rows + cols + 3) - (int64_t)rows - 1);
        break;
    case KB_REC_GATHER: {
        uint32_t vocab = 1 + kbt_rng_below(g, ge->maxr);
        r.src[0] = kbt_rand_place(ge, vocab, cols, (kb_dtype)kbt_rng_below(g, KB_NDTYPES));
        r.src[1] = kbt_rng_below(g, 2) ? kbt_rand_place(ge, 1, rows, KB_F32)
                                       : kbt_rand_place(ge, rows, 1, KB_F32);
        break;
    }
    case KB_REC_DEQUANT: {
        /* optionally 2:4-sparse (rows a multiple of 4; random metadata bytes, any nibble) and
         * scaled by a block scale whose blocks divide the shape */
        int sparse = kbt_rng_below(g, 2), scaled = kbt_rng_below(g, 3) != 0;
        uint32_t rb = 1 + kbt_rng_below(g, 4), cb = 1 + kbt_rng_below(g, 4);
        uint32_t ru = sparse ? 4 * rb : rb; /* rows: a multiple of 4 (sparse) and of rb */
        rows = (rows + ru - 1) / ru * ru;
        cols = (cols + cb - 1) / cb * cb;
        r.nsrc = (uint8_t)(1 + sparse + scaled);
        r.imm[0] = kbt_rng_below(g, 2) ? 1.0f : 0x1p-6f;
        r.src[0] = kbt_rand_place(ge, sparse ? rows / 2 : rows, cols,
                                  (kb_dtype)kbt_rng_below(g, KB_NDTYPES));
        if (sparse) {
            r.flags |= KB_REC_QSPARSE;
            r.src[1] = kbt_rand_place(ge, (rows + 7) / 8, cols, KB_I8);
        }
        if (scaled) {
            r.flags |= KB_REC_QSCALE;
            r.src[r.nsrc - 1] = kbt_rand_place(ge, rows / rb, cols / cb,
                                               (kb_dtype)kbt_rng_below(g, KB_NDTYPES));
        }
        break;
    }
    default:
        break;
    }
    for (unsigned s = 0; s < r.nsrc; s++)
        if (ge->payload_one_in && kbt_rng_below(g, ge->payload_one_in) == 0)
            kbt__to_payload(ge, &r.src[s]);
    r.dst = kbt_rand_place(ge, rows, cols, dt);
    /* in place now and then, when the first source has dst's shape */
    if (k != KB_REC_GEMM && k != KB_REC_REDUCE && k != KB_REC_FILL && k != KB_REC_TRANSPOSE &&
        k != KB_REC_GATHER && k != KB_REC_DEQUANT &&
        kbt_rng_below(g, 6) == 0 && r.src[0].rows == rows && r.src[0].cols == cols &&
        r.src[0].space == KB_SPACE_MEM)
        r.dst = r.src[0];
    if (!ge->disjoint)
        return r;
    for (int tries = 0; !kbt__disjoint(&r) && tries < 50; tries++)
        r.dst = kbt_rand_place(ge, rows, cols, dt);
    if (!kbt__disjoint(&r)) { /* give up on this one: a fill of a fresh place */
        r = kbt_rec_new(KB_REC_FILL, t);
        r.imm[0] = 1.5f;
        r.dst = kbt_rand_place(ge, 1, 1, KB_F32);
    }
    return r;
}

#endif /* KB_OPLOG_H */

/* ---- configurations (kb_host) ---- */
#ifdef KB_REPLAY_H
/*
 * A backend around another one (`inner`, which does the work and is not destroyed with the
 * wrapper), counting batches, flush ends and syncs; fail_batch / fail_end > 0 make that
 * batch / that flush's end fail with KB_ERR_DEVICE "injected failure" (the end after the
 * inner one ran). kbt_wrap_ops(1) also has a sync, so the runtime takes it for pipelined.
 */
typedef struct kbt_wrap {
    kb_backend inner;
    int batches, ends, syncs;
    int fail_batch, fail_end;
} kbt_wrap;

static inline int kbt_wrap_begin(void *self, uint8_t *arena, uint64_t bytes,
                                 const uint8_t *payload, size_t payload_bytes, kb_errbuf *eb)
{
    kbt_wrap *w = self;
    return w->inner.ops->begin(w->inner.self, arena, bytes, payload, payload_bytes, eb);
}

static inline int kbt_wrap_run(void *self, const kb_rec *recs, size_t n, kb_errbuf *eb)
{
    kbt_wrap *w = self;
    if (++w->batches == w->fail_batch)
        return kb_err_set(eb, KB_ERR_DEVICE, "injected failure");
    return w->inner.ops->run_batch(w->inner.self, recs, n, eb);
}

static inline int kbt_wrap_end(void *self, uint8_t *arena, uint64_t bytes, kb_errbuf *eb)
{
    kbt_wrap *w = self;
    int rc = w->inner.ops->end(w->inner.self, arena, bytes, eb);
    if (rc == 0 && ++w->ends == w->fail_end)
        rc = kb_err_set(eb, KB_ERR_DEVICE, "injected failure");
    return rc;
}

static inline void kbt_wrap_destroy(void *self)
{
    (void)self; /* the inner backend is the test's */
}

static inline struct kb_resident *kbt_wrap_resident(void *self)
{
    kbt_wrap *w = self;
    return w->inner.ops->resident(w->inner.self);
}

static inline int kbt_wrap_sync(void *self, kb_errbuf *eb)
{
    kbt_wrap *w = self;
    (void)eb;
    w->syncs++;
    return 0;
}

static inline const kb_backend_ops *kbt_wrap_ops(int pipelined)
{
    static const kb_backend_ops ops[2] = {
        { "wrapped", kbt_wrap_begin, kbt_wrap_run, kbt_wrap_end, kbt_wrap_destroy,
          kbt_wrap_resident, NULL, KB_BACKEND_OTHER },
        { "wrapped-pipelined", kbt_wrap_begin, kbt_wrap_run, kbt_wrap_end, kbt_wrap_destroy,
          kbt_wrap_resident, kbt_wrap_sync, KB_BACKEND_OTHER },
    };
    return &ops[pipelined != 0];
}
#endif

#ifdef KB_CONFIG_H

/* One `key=value` assignment, as `kbcl run --set` takes it; a refusal fails the test. */
static inline void kbt_config_set(kb_config *cfg, const char *kv)
{
    kb_errbuf eb;
    int rc = kb_config_set(cfg, kv, &eb);
    if (rc != 0)
        fail_msg("%s: %d %s", kv, rc, eb.msg);
}

/* The built-in defaults changed by nsets assignments. */
static inline void kbt_config_with(kb_config *cfg, const char *const *sets, size_t nsets)
{
    kb_config_defaults(cfg);
    for (size_t i = 0; i < nsets; i++)
        kbt_config_set(cfg, sets[i]);
}

/*
 * What kbt_doc_key gathers from a key listing (kb_config_foreach_key,
 * kb_ccl_config_foreach_key) held against a page of docs: how many keys, their paths (the
 * first KBT_DOC_KEYS_MAX), and those the text does not name.
 */
#define KBT_DOC_KEYS_MAX 64
typedef struct kbt_doc_keys {
    const char *text;               /* the page (set by the caller) */
    int nkeys, missing;
    char first_missing[128];
    char keys[KBT_DOC_KEYS_MAX][64];
} kbt_doc_keys;

/* A kb_config_key_fn over a kbt_doc_keys (ud): every key must have a type, a default and a
 * doc line. */
static inline void kbt_doc_key(const char *path, const char *type, const char *dflt,
                               const char *doc, void *ud)
{
    kbt_doc_keys *d = ud;
    assert_non_null(type);
    assert_non_null(dflt);
    assert_true(doc && doc[0]);
    if (d->nkeys < KBT_DOC_KEYS_MAX)
        snprintf(d->keys[d->nkeys], sizeof d->keys[0], "%s", path);
    d->nkeys++;
    if (!strstr(d->text, path) && d->missing++ == 0)
        snprintf(d->first_missing, sizeof d->first_missing, "%s", path);
}

#endif /* KB_CONFIG_H */

/* ---- contexts and the clocks (kb_host) ---- */
#ifdef KB_RUNTIME_H

/* A context over cfg (which it then finalises); a refusal fails the test. */
static inline kb_ctx *kbt_ctx_from(kb_config *cfg, const kb_ctx_opts *opts)
{
    kb_errbuf eb;
    kb_ctx *ctx = NULL;
    int rc = kb_ctx_create(cfg, opts, &ctx, &eb);
    kb_config_fini(cfg);
    if (rc != 0)
        fail_msg("kb_ctx_create: %d %s", rc, eb.msg);
    assert_non_null(ctx);
    return ctx;
}

/* A context over the defaults changed by nsets assignments (owner: the caller). */
static inline kb_ctx *kbt_ctx_new(const char *const *sets, size_t nsets, const kb_ctx_opts *opts)
{
    kb_config cfg;
    kbt_config_with(&cfg, sets, nsets);
    return kbt_ctx_from(&cfg, opts);
}

static inline kb_time kbt_ctx_now(kb_ctx *ctx) { return kb_sim_now(kb_ctx_sim(ctx)); }

#endif /* KB_RUNTIME_H */

/* ---- collective-library configurations (kb_ccl) ---- */
#ifdef KB_CCL_CONFIG_H

/* One `ccl.defaults.<key>=value` or `ccl.algorithms.<name>.<key>=value`; a refusal fails the
 * test. */
static inline void kbt_ccl_config_set(kb_ccl_cfg *c, const char *kv)
{
    kb_errbuf eb;
    int rc = kb_ccl_config_set(c, kv, &eb);
    if (rc != 0)
        fail_msg("%s: %d %s", kv, rc, eb.msg);
}

/* The built-in ccl defaults changed by nsets assignments. */
static inline void kbt_ccl_config_with(kb_ccl_cfg *c, const char *const *sets, size_t nsets)
{
    kb_ccl_config_defaults(c);
    for (size_t i = 0; i < nsets; i++)
        kbt_ccl_config_set(c, sets[i]);
}

#ifdef KB_RUNTIME_H
/* Attaches the ccl defaults changed by nsets assignments to ctx (what kb_ccl_config_of then
 * reads); a refusal fails the test. */
static inline void kbt_ccl_attach(kb_ctx *ctx, const char *const *sets, size_t nsets)
{
    kb_ccl_cfg c;
    kbt_ccl_config_with(&c, sets, nsets);
    if (kb_ccl_config_attach(ctx, &c) != 0)
        fail_msg("kb_ccl_config_attach: %s", kb_ctx_errmsg(ctx));
}
#endif /* KB_RUNTIME_H */

#endif /* KB_CCL_CONFIG_H */

#ifdef KB_TL_H
/* The kernel's clock: its SIP's partition in a forked launch, else the context's. */
static inline kb_time kbt_tl_now(kb_tl *tl) { return kb_sim_now(tl_sim(tl)); }
#endif

#endif /* KB_TEST_UTIL_H */
