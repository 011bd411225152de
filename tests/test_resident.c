/*
 * test_resident — device-resident simulated memory (kb_resident) on the reference backend's
 * resident variant, whose "device" is a host buffer: for a known sequence of flushes, host
 * writes and host reads, the exact transfers (uploads, poison fills, device moves, downloads,
 * their bytes), the arena's size and segments, the device-dirty and host-dirty sets, and the
 * values read back; a backend handed from one store to another (the first gets its device
 * data back), a store destroyed while bound, and a failed flush (the device copy is then
 * reported undefined, never silently read).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "kb_replay.h"
#include "kb_resident.h"
#include "kb_test_util.h"

typedef struct fx {
    kb_oplog *log;
    kb_memstore *ms;
    kb_backend be;
    kb_replay_stats st;
} fx;

static int setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    if (!f)
        return -1;
    f->log = kb_oplog_create();
    f->ms = kb_memstore_create();
    if (!f->log || !f->ms || kb_ref_backend_create_resident(&f->be) != 0)
        return -1;
    *state = f;
    return 0;
}

/* The fixture with blocks of at most 4 KiB (KBCL_ARENA_BLOCK, read when the backend is made). */
static int setup_blocks(void **state)
{
    setenv("KBCL_ARENA_BLOCK", "4K", 1);
    int rc = setup(state);
    unsetenv("KBCL_ARENA_BLOCK");
    return rc;
}

static int teardown(void **state)
{
    fx *f = *state;
    kb_oplog_destroy(f->log);
    kb_memstore_destroy(f->ms);
    f->be.ops->destroy(f->be.self);
    free(f);
    return 0;
}

static kb_rec copy_f32(uint64_t dst, uint64_t src, uint32_t n, kb_time t)
{
    kb_rec r = kbt_rec_new(KB_REC_COPY, t);
    r.src[0] = kb_opnd_make(src, 1, n, KB_F32);
    r.dst = kb_opnd_make(dst, 1, n, KB_F32);
    return r;
}

static void flush(fx *f, kb_rec r)
{
    kb_errbuf eb;
    assert_int_equal(kb_oplog_append(f->log, &r, NULL), 0);
    eb.msg[0] = '\0';
    int rc = kb_replay_flush(f->log, f->ms, &f->be, &f->st, &eb);
    if (rc)
        print_error("flush: %s\n", eb.msg);
    assert_int_equal(rc, 0);
}

static void load(kb_memstore *ms, uint64_t pa, void *dst, size_t n)
{
    kb_errbuf eb;
    eb.msg[0] = '\0';
    int rc = kb_memstore_load(ms, pa, dst, n, &eb);
    if (rc)
        print_error("load: %s\n", eb.msg);
    assert_int_equal(rc, 0);
}

static kb_xfer_stats xs(const fx *f)
{
    kb_xfer_stats x;
    kb_backend_xfer_stats(&f->be, &x);
    return x;
}

/* The transfers so far: uploads (count, bytes), fills, moves, downloads. */
static void expect_xfer(const fx *f, uint64_t up, uint64_t upb, uint64_t fi, uint64_t fib,
                        uint64_t mv, uint64_t mvb, uint64_t dn, uint64_t dnb)
{
    kb_xfer_stats x = xs(f);
    assert_int_equal(x.uploads, up);
    assert_int_equal(x.upload_bytes, upb);
    assert_int_equal(x.fills, fi);
    assert_int_equal(x.fill_bytes, fib);
    assert_int_equal(x.moves, mv);
    assert_int_equal(x.move_bytes, mvb);
    assert_int_equal(x.downloads, dn);
    assert_int_equal(x.download_bytes, dnb);
}

static void test_known_sequence(void **state)
{
    fx *f = *state;
    float x[16], y[4], got[1040];
    for (int i = 0; i < 16; i++)
        x[i] = (float)i + 0.5f;
    for (int i = 0; i < 4; i++)
        y[i] = -(float)i - 100.0f;
    /* The host's bytes before any flush: not tracked (no mirror yet). */
    assert_int_equal(kb_memstore_write(f->ms, 0x1000, x, sizeof x), 0);
    assert_int_equal(kb_memstore_host_dirty(f->ms)->n, 0);

    /* 1. 0x1000 -> 0x2000: both new. The source's 64 bytes go up (the store holds them), the
     * destination is poison-filled on the device. First arena: 2 x (64 + 8) rounded to 4 KiB.
     * Nothing comes down. */
    flush(f, copy_f32(0x2000, 0x1000, 16, 0));
    expect_xfer(f, 1, 64, 1, 64, 0, 0, 0, 0);
    kb_xfer_stats s = xs(f);
    assert_int_equal(s.arena_bytes, 4096);
    assert_int_equal(s.segments, 2);
    assert_int_equal(s.resident_bytes, 128);
    const kb_ivset *dd = kb_memstore_device_dirty(f->ms);
    assert_int_equal(dd->n, 1);
    assert_int_equal(dd->v[0].lo, 0x2000);
    assert_int_equal(dd->v[0].hi, 0x2040);
    assert_int_equal(kb_memstore_pages(f->ms), 1); /* the result is not in the store yet */
    assert_int_equal(kb_memstore_mirror_self(f->ms) != NULL, 1);

    /* A host read pulls exactly the device-dirty bytes it reads, straight into its buffer:
     * they stay device-dirty (the store gets no page), and a second read pulls again. */
    load(f->ms, 0x2000, got, 64);
    assert_memory_equal(got, x, 64);
    expect_xfer(f, 1, 64, 1, 64, 0, 0, 1, 64);
    assert_int_equal(dd->n, 1);
    assert_int_equal(kb_memstore_pages(f->ms), 1);
    load(f->ms, 0x2000, got, 64);
    expect_xfer(f, 1, 64, 1, 64, 0, 0, 2, 128);

    /* 2. The host changes 16 bytes of the resident source; the next flush uploads just them
     * (the arena has room: no growth), then poison-fills the new destination. */
    assert_int_equal(kb_memstore_write(f->ms, 0x1010, y, sizeof y), 0);
    assert_int_equal(kb_memstore_host_dirty(f->ms)->bytes, 16);
    flush(f, copy_f32(0x3000, 0x1000, 16, 1));
    expect_xfer(f, 2, 80, 2, 128, 0, 0, 2, 128);
    assert_int_equal(kb_memstore_host_dirty(f->ms)->n, 0);
    assert_int_equal(xs(f).arena_bytes, 4096);
    load(f->ms, 0x3000, got, 64);
    expect_xfer(f, 2, 80, 2, 128, 0, 0, 3, 192);
    for (int i = 0; i < 16; i++)
        assert_true(got[i] == (i >= 4 && i < 8 ? y[i - 4] : x[i]));

    /* 3. A source spanning both destinations [0x2000, 0x3040) merges them. The first block
     * has 3904 bytes left: the arena grows by a second block for the flush's two new
     * segments (2 x (4160 + 7) -> 12 KiB), and nothing resident moves for that. The two old
     * segments (not end to end in PA) are copied into the merged one (128 bytes) and the 4032
     * bytes between them are poison-filled (the store holds nothing there), as is the new
     * destination (a second fill: the copy in between keeps them apart). */
    flush(f, copy_f32(0x8000, 0x2000, 1040, 2));
    expect_xfer(f, 2, 80, 4, 128 + 4032 + 4160, 2, 128, 3, 192);
    s = xs(f);
    assert_int_equal(s.arena_bytes, 4096 + 12288);
    assert_int_equal(s.blocks, 2);
    assert_int_equal(s.segments, 3);
    assert_int_equal(s.resident_bytes, 64 + 4160 + 4160);
    load(f->ms, 0x8000, got, 1040 * 4);
    for (int i = 0; i < 16; i++) {
        assert_true(got[i] == x[i]);                                         /* from 0x2000 */
        assert_true(got[1024 + i] == (i >= 4 && i < 8 ? y[i - 4] : x[i]));  /* from 0x3000 */
    }
    uint32_t poison;
    memcpy(&poison, &got[16], 4);
    assert_int_equal(poison, 0xFFFFFFFFu);
    expect_xfer(f, 2, 80, 4, 8320, 2, 128, 4, 192 + 4160);
}

static void test_payload_and_host_writes(void **state)
{
    fx *f = *state;
    float z[12], w[2] = { 7.0f, 8.0f }, got[16];
    uint64_t off;
    for (int i = 0; i < 12; i++)
        z[i] = 10.0f + (float)i;
    /* Host data arrives through the payload: the first flush uploads its 32 bytes, the next
     * only the 16 added since. */
    assert_int_equal(kb_oplog_add_payload(f->log, z, 32, &off), 0);
    kb_rec r = copy_f32(0x1000, off, 8, 0);
    r.src[0].space = KB_SPACE_PAYLOAD;
    flush(f, r);
    expect_xfer(f, 1, 32, 1, 32, 0, 0, 0, 0);
    assert_int_equal(kb_oplog_add_payload(f->log, z + 8, 16, &off), 0);
    assert_int_equal(off, 32);
    r = copy_f32(0x1020, off, 4, 1);
    r.src[0].space = KB_SPACE_PAYLOAD;
    flush(f, r);
    expect_xfer(f, 2, 48, 2, 48, 0, 0, 0, 0);
    /* [0x1000, 0x1020) and [0x1020, 0x1030) are touching segments: one read pulls both. */
    load(f->ms, 0x1000, got, 48);
    assert_memory_equal(got, z, 48);
    expect_xfer(f, 2, 48, 2, 48, 0, 0, 2, 48);

    /* The device writes [0x1000, 0x1040): a merge, in place (the two segments lie end to end,
     * at the end of the block's used part): nothing moves, the 16 new bytes are
     * poison-filled after them. Then the host overwrites 8 bytes in the middle: they stop being
     * device-dirty and become host-dirty. A read pulls the two device-dirty pieces around
     * them and takes the host's 8 bytes from the store. */
    kb_rec fill = kbt_rec_new(KB_REC_FILL, 2);
    fill.imm[0] = 2.0f;
    fill.dst = kb_opnd_make(0x1000, 1, 16, KB_F32);
    flush(f, fill);
    expect_xfer(f, 2, 48, 3, 64, 0, 0, 2, 48);
    assert_int_equal(kb_memstore_write(f->ms, 0x1008, w, 8), 0);
    const kb_ivset *dd = kb_memstore_device_dirty(f->ms);
    assert_int_equal(dd->n, 2);
    assert_int_equal(dd->bytes, 56);
    assert_int_equal(kb_memstore_host_dirty(f->ms)->bytes, 8);
    load(f->ms, 0x1000, got, 64);
    expect_xfer(f, 2, 48, 3, 64, 0, 0, 4, 104);
    for (int i = 0; i < 16; i++)
        assert_true(got[i] == (i == 2 ? 7.0f : i == 3 ? 8.0f : 2.0f));
    /* The next flush uploads the host's 8 bytes before the device reads them. */
    flush(f, copy_f32(0x5000, 0x1000, 16, 3));
    expect_xfer(f, 3, 56, 4, 128, 0, 0, 4, 104);
    load(f->ms, 0x5000, got, 64);
    for (int i = 0; i < 16; i++)
        assert_true(got[i] == (i == 2 ? 7.0f : i == 3 ? 8.0f : 2.0f));
}

/* The new segments of one flush are poison-filled by one fill (the padding between them
 * included), however many there are. */
static void test_fill_coalescing(void **state)
{
    fx *f = *state;
    float z[16] = { 0 };
    uint64_t off;
    assert_int_equal(kb_oplog_add_payload(f->log, z, sizeof z, &off), 0);
    for (int i = 0; i < 4; i++) {
        /* destinations at PAs 4 mod 8 apart from the first: 4 bytes of padding before each */
        kb_rec r = copy_f32(0x10000 * (uint64_t)(i + 1) + (i ? 4 : 0), off, 16, 0);
        r.src[0].space = KB_SPACE_PAYLOAD;
        assert_int_equal(kb_oplog_append(f->log, &r, NULL), 0);
    }
    assert_int_equal(kb_replay_flush(f->log, f->ms, &f->be, &f->st, NULL), 0);
    /* offsets 0, 68, 132, 196: one fill of 260 bytes */
    expect_xfer(f, 1, 64, 1, 260, 0, 0, 0, 0);
    assert_int_equal(xs(f).segments, 4);
}

/* One backend, two stores in turn, and a store destroyed while bound. */
static void test_rebind(void **state)
{
    fx *f = *state;
    float x[4] = { 1, 2, 3, 4 }, got[4];
    kb_errbuf eb;
    assert_int_equal(kb_memstore_write(f->ms, 0x1000, x, 16), 0);
    flush(f, copy_f32(0x2000, 0x1000, 4, 0));
    assert_int_equal(kb_memstore_device_dirty(f->ms)->bytes, 16);
    /* Another store on the same backend: the first one gets its device data back (pulled
     * before the arena is reused) and loses its mirror. */
    fx g = { kb_oplog_create(), kb_memstore_create(), f->be, { 0 } };
    assert_non_null(g.log);
    assert_non_null(g.ms);
    assert_int_equal(kb_memstore_write(g.ms, 0x1000, x + 2, 8), 0);
    flush(&g, copy_f32(0x9000, 0x1000, 2, 0));
    assert_null(kb_memstore_mirror_self(f->ms));
    assert_int_equal(kb_memstore_device_dirty(f->ms)->n, 0);
    kb_xfer_stats s = xs(f);
    assert_int_equal(s.downloads, 1);
    assert_int_equal(s.download_bytes, 16);
    assert_int_equal(s.segments, 2); /* g's */
    load(f->ms, 0x2000, got, 16);
    assert_memory_equal(got, x, 16);
    load(g.ms, 0x9000, got, 8);
    assert_memory_equal(got, x + 2, 8);
    /* g's store goes away while bound: the backend forgets it, transfers nothing. */
    kb_memstore_write(g.ms, 0x9000, x, 4); /* (host-dirty, never uploaded) */
    flush(&g, copy_f32(0x9100, 0x9000, 2, 1));
    kb_memstore_destroy(g.ms);
    kb_oplog_destroy(g.log);
    s = xs(f);
    assert_int_equal(s.segments, 0);
    assert_int_equal(s.downloads, 2); /* the read of 0x9000 above */
    /* The first store binds again and replays on. */
    flush(f, copy_f32(0x3000, 0x2000, 4, 1));
    load(f->ms, 0x3000, got, 16);
    assert_memory_equal(got, x, 16);
    /* Switching such a store back to a host backend pulls its device data first. */
    kb_backend ref;
    assert_int_equal(kb_ref_backend_create(&ref), 0);
    fx h = { f->log, f->ms, ref, { 0 } };
    flush(&h, copy_f32(0x4000, 0x1000, 4, 2));
    assert_null(kb_memstore_mirror_self(f->ms));
    eb.msg[0] = '\0';
    assert_int_equal(kb_memstore_load(f->ms, 0x4000, got, 16, &eb), 0);
    assert_memory_equal(got, x, 16);
    ref.ops->destroy(ref.self);
}

static void test_failed_flush(void **state)
{
    fx *f = *state;
    kbt_wrap fb = { f->be, 0, 0, 0, 2, 0 }; /* the second batch fails */
    float x[4] = { 1, 2, 3, 4 }, got[4];
    kb_errbuf eb;
    assert_int_equal(kb_memstore_write(f->ms, 0x1000, x, 16), 0);
    flush(f, copy_f32(0x2000, 0x1000, 4, 0)); /* device-dirty, not read yet */
    fx g = { f->log, f->ms, { kbt_wrap_ops(0), &fb }, { 0 } };
    kb_rec a = copy_f32(0x3000, 0x2000, 4, 1), b = copy_f32(0x4000, 0x3000, 4, 2);
    assert_int_equal(kb_oplog_append(f->log, &a, NULL), 0);
    assert_int_equal(kb_oplog_append(f->log, &b, NULL), 0);
    eb.msg[0] = '\0';
    assert_int_equal(kb_replay_flush(f->log, f->ms, &g.be, &g.st, &eb), KB_ERR_DEVICE);
    assert_non_null(strstr(eb.msg, "injected failure"));
    assert_int_equal(kb_oplog_replayed(f->log), 1);
    assert_true(kb_resident_broken(kbt_wrap_resident(&fb)));
    /* From now on the device copy is undefined: flushes and reads of device data say so. */
    assert_int_equal(kb_replay_flush(f->log, f->ms, &f->be, &f->st, &eb), KB_ERR_STATE);
    assert_non_null(strstr(eb.msg, "undefined"));
    assert_int_equal(kb_memstore_load(f->ms, 0x2000, got, 16, &eb), KB_ERR_STATE);
    /* What the host holds is still readable. */
    assert_int_equal(kb_memstore_load(f->ms, 0x1000, got, 16, &eb), 0);
    assert_memory_equal(got, x, 16);
}

/*
 * Growth and merges keep every byte: a chain of copies, each a new segment, every 8th one
 * spanning the last four (a merge of segments and the poison between them), replayed flush by
 * flush on resident memory and on the plain ref backend: the same memory everywhere.
 */
static void test_growth(void **state)
{
    fx *f = *state;
    enum { N = 40, SPAN = 0x30000 / 4 + N };
    const uint64_t base = 0x100000, end = base + 0x10000 * (uint64_t)N + 4 * (uint64_t)SPAN;
    float v[N];
    kb_backend ref;
    kb_replay_stats rst;
    kb_oplog *log2 = kb_oplog_create();
    kb_memstore *ms2 = kb_memstore_create();
    uint8_t *a = malloc(end - base), *b = malloc(end - base);
    assert_non_null(log2);
    assert_non_null(ms2);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(kb_ref_backend_create(&ref), 0);
    memset(&rst, 0, sizeof rst);
    for (int i = 0; i < N; i++)
        v[i] = (float)i * 3.0f;
    assert_int_equal(kb_memstore_write(f->ms, base, v, sizeof v), 0);
    assert_int_equal(kb_memstore_write(ms2, base, v, sizeof v), 0);
    for (int k = 1; k < N; k++) {
        uint64_t dst = base + 0x10000 * (uint64_t)k;
        kb_rec r = copy_f32(dst, dst - 0x10000, N, k);
        if (k % 8 == 0)
            r = copy_f32(dst, dst - 0x40000, SPAN, k);
        flush(f, r);
        assert_int_equal(kb_oplog_append(log2, &r, NULL), 0);
        assert_int_equal(kb_replay_flush(log2, ms2, &ref, &rst, NULL), 0);
    }
    kb_xfer_stats x = xs(f);
    assert_true(x.moves > 0);
    assert_true(x.arena_bytes >= x.resident_bytes);
    load(f->ms, base, a, end - base);
    load(ms2, base, b, end - base);
    assert_memory_equal(a, b, end - base);
    float got[N];
    memcpy(got, a + 0x10000, sizeof got);
    assert_memory_equal(got, v, sizeof v);
    ref.ops->destroy(ref.self);
    kb_oplog_destroy(log2);
    kb_memstore_destroy(ms2);
    free(a);
    free(b);
}

static kb_rec fill_f32(uint64_t dst, uint32_t n, float v, kb_time t)
{
    kb_rec r = kbt_rec_new(KB_REC_FILL, t);
    r.imm[0] = v;
    r.dst = kb_opnd_make(dst, 1, n, KB_F32);
    return r;
}

/* The arena so far: bytes, blocks, segments, device moves. */
static void expect_arena(const fx *f, uint64_t bytes, uint64_t blocks, uint64_t segs,
                         uint64_t moves, uint64_t move_bytes)
{
    kb_xfer_stats x = xs(f);
    assert_int_equal(x.arena_bytes, bytes);
    assert_int_equal(x.blocks, blocks);
    assert_int_equal(x.segments, segs);
    assert_int_equal(x.moves, moves);
    assert_int_equal(x.move_bytes, move_bytes);
}

/*
 * The arena grows by blocks (here of at most 4 KiB: KBCL_ARENA_BLOCK) and nothing resident
 * ever moves for it; records read and write across blocks; a merge whose parts lie end to end
 * at the end of a block's used part is made in place, one whose parts do not is copied (the
 * one kind of device move left). The ref backend's "device" checks that every primitive's
 * range lies in one block.
 */
static void test_blocks(void **state)
{
    fx *f = *state;
    float x[16], got[1500];
    for (int i = 0; i < 16; i++)
        x[i] = (float)i - 7.5f;
    assert_int_equal(kb_memstore_write(f->ms, 0x1000, x, sizeof x), 0);
    /* 1. Two 64-byte segments: a first block of 2 x (64 + 7) bytes, rounded to 4 KiB. */
    flush(f, copy_f32(0x2000, 0x1000, 16, 0));
    expect_arena(f, 4096, 1, 2, 0, 0);
    /* 2. 3000 bytes fit the first block's 3968 left. */
    flush(f, fill_f32(0x10000, 750, 1.0f, 1));
    expect_arena(f, 4096, 1, 3, 0, 0);
    /* 3. 3000 more do not (968 left): a second block, of 4 KiB; nothing moves. */
    flush(f, fill_f32(0x20000, 750, 2.0f, 2));
    expect_arena(f, 8192, 2, 4, 0, 0);
    /* 4. A segment larger than the cap gets a block of its own size (6007 -> 8 KiB). */
    flush(f, fill_f32(0x30000, 1500, 3.0f, 3));
    expect_arena(f, 16384, 3, 5, 0, 0);
    /* 5. Records across blocks: block 0 -> block 2, blocks 1 and 2 -> block 1. */
    flush(f, copy_f32(0x30000 + 400, 0x1000, 16, 4));
    kb_rec add = kbt_rec_new(KB_REC_MATH2, 5);
    add.op = KB_M2_ADD;
    add.nsrc = 2;
    add.src[0] = kb_opnd_make(0x30000, 1, 100, KB_F32);
    add.src[1] = kb_opnd_make(0x20000, 1, 100, KB_F32);
    add.dst = kb_opnd_make(0x20000, 1, 100, KB_F32);
    flush(f, add);
    expect_arena(f, 16384, 3, 5, 0, 0);
    load(f->ms, 0x30000 + 400, got, 64);
    assert_memory_equal(got, x, 64);
    load(f->ms, 0x20000, got, 400);
    for (int i = 0; i < 100; i++)
        assert_true(got[i] == 5.0f);
    /* 6. [0x10000, +3200) extends the 3000-byte segment that ends block 0's used part (128 +
     * 3000 of 4096): in place, no move, the 200 new bytes poison-filled after it. */
    kb_xfer_stats before = xs(f);
    flush(f, fill_f32(0x10000, 800, 4.0f, 6));
    expect_arena(f, 16384, 3, 5, 0, 0);
    assert_int_equal(xs(f).fill_bytes - before.fill_bytes, 200);
    /* 7. [0x1000, 0x2040) merges two segments that are not end to end in PA: copied (128
     * bytes) into a new block (4160 + 7 -> 8 KiB), the 4032 bytes between them filled. */
    flush(f, fill_f32(0x1000, 1040, 6.0f, 7));
    expect_arena(f, 16384 + 8192, 4, 4, 2, 128);
    load(f->ms, 0x1000, got, 1040 * 4);
    for (int i = 0; i < 1040; i++)
        assert_true(got[i] == 6.0f);
    load(f->ms, 0x10000, got, 3200);
    for (int i = 0; i < 800; i++)
        assert_true(got[i] == 4.0f);
    load(f->ms, 0x30000, got, 6000);
    for (int i = 0; i < 1500; i++)
        assert_true(got[i] == (i >= 100 && i < 116 ? x[i - 100] : 3.0f));
}

/* A footprint announced before the first flush (kb_backend_reserve) sizes the first block:
 * the run's later segments need no other. */
static void test_reserve(void **state)
{
    fx *f = *state;
    const uint64_t fp = 1 << 20, first = fp + fp / 16 + (16 << 20);
    kb_backend_reserve(&f->be, fp);
    for (int k = 0; k < 16; k++)
        flush(f, fill_f32(0x100000 + 0x10000 * (uint64_t)k, 16384, (float)k, k));
    expect_arena(f, first, 1, 16, 0, 0);
    /* More than announced: one more block, for the flush's need or a quarter of the arena. */
    flush(f, fill_f32(0x4000000, 5 << 20, 1.0f, 20));
    expect_arena(f, first + (20 << 20) + 4096, 2, 17, 0, 0);
}

/*
 * A store that binds a backend whose arena is empty but too small for its announced footprint
 * (a sweep's worker keeps its backend from point to point, sizes growing) gets one block of
 * its own size, the old blocks released, instead of the old blocks and one for the rest; a
 * store that fits the kept arena keeps it.
 */
static void test_rebind_outgrown(void **state)
{
    fx *f = *state;
    const uint64_t fa = 1 << 20, fb = 64 << 20;
    const uint64_t first_a = fa + fa / 16 + (16 << 20), first_b = fb + fb / 16 + (16 << 20);
    float got[4];
    kb_backend_reserve(&f->be, fa);
    flush(f, fill_f32(0x100000, 16384, 1.0f, 0));
    expect_arena(f, first_a, 1, 1, 0, 0);
    fx g = { kb_oplog_create(), kb_memstore_create(), f->be, { 0 } };
    assert_non_null(g.log);
    assert_non_null(g.ms);
    kb_backend_reserve(&g.be, fb);
    flush(&g, fill_f32(0x200000, 16384, 2.0f, 0));
    expect_arena(&g, first_b, 1, 1, 0, 0);
    load(g.ms, 0x200000, got, sizeof got);
    for (int i = 0; i < 4; i++)
        assert_true(got[i] == 2.0f);
    load(f->ms, 0x100000, got, sizeof got); /* pulled back before the arena was reused */
    for (int i = 0; i < 4; i++)
        assert_true(got[i] == 1.0f);
    kb_memstore_destroy(g.ms);
    kb_oplog_destroy(g.log);
    /* a smaller footprint keeps the arena it finds */
    fx h = { kb_oplog_create(), kb_memstore_create(), f->be, { 0 } };
    assert_non_null(h.log);
    assert_non_null(h.ms);
    kb_backend_reserve(&h.be, fa);
    flush(&h, fill_f32(0x300000, 16384, 3.0f, 0));
    expect_arena(&h, first_b, 1, 1, 0, 0);
    kb_memstore_destroy(h.ms);
    kb_oplog_destroy(h.log);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_known_sequence, setup, teardown),
        cmocka_unit_test_setup_teardown(test_payload_and_host_writes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fill_coalescing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rebind, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failed_flush, setup, teardown),
        cmocka_unit_test_setup_teardown(test_growth, setup, teardown),
        cmocka_unit_test_setup_teardown(test_growth, setup_blocks, teardown),
        cmocka_unit_test_setup_teardown(test_blocks, setup_blocks, teardown),
        cmocka_unit_test_setup_teardown(test_reserve, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rebind_outgrown, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
