/*
 * test_memstore — sparse simulated memory: poison for unwritten bytes, reads and writes that
 * cross pages (KB_MEMSTORE_PAGE_BYTES), lazily allocated page counts, many scattered pages
 * (table growth), whole pages over several slabs, and high addresses, with a device mirror too
 * (the dirty sets at the end of the address space).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "kb_memstore.h"

static void test_poison(void **state)
{
    (void)state;
    kb_memstore *ms = kb_memstore_create();
    uint8_t buf[100];
    assert_non_null(ms);
    memset(buf, 0, sizeof buf);
    kb_memstore_read(ms, 0x123456789ull, buf, sizeof buf);
    for (size_t i = 0; i < sizeof buf; i++)
        assert_int_equal(buf[i], KB_MEMSTORE_POISON);
    assert_int_equal(kb_memstore_pages(ms), 0);
    kb_memstore_read(ms, 0, buf, 0);
    assert_int_equal(kb_memstore_write(ms, 0, buf, 0), 0);
    assert_int_equal(kb_memstore_pages(ms), 0);
    kb_memstore_destroy(ms);
    kb_memstore_destroy(NULL);
}

static void test_small_write(void **state)
{
    (void)state;
    kb_memstore *ms = kb_memstore_create();
    const uint8_t data[4] = { 1, 2, 3, 4 };
    uint8_t buf[8];
    assert_non_null(ms);
    assert_int_equal(kb_memstore_write(ms, 0x20002, data, sizeof data), 0);
    assert_int_equal(kb_memstore_pages(ms), 1);
    kb_memstore_read(ms, 0x20000, buf, sizeof buf);
    const uint8_t want[8] = { 0xFF, 0xFF, 1, 2, 3, 4, 0xFF, 0xFF };
    assert_memory_equal(buf, want, sizeof want);
    /* Overwrite part of it. */
    assert_int_equal(kb_memstore_write(ms, 0x20003, data, 1), 0);
    kb_memstore_read(ms, 0x20002, buf, 3);
    assert_int_equal(buf[0], 1);
    assert_int_equal(buf[1], 1);
    assert_int_equal(buf[2], 3);
    assert_int_equal(kb_memstore_pages(ms), 1);
    kb_memstore_destroy(ms);
}

static void test_cross_page(void **state)
{
    (void)state;
    const size_t P = (size_t)KB_MEMSTORE_PAGE_BYTES, N = 3 * P + 100;
    kb_memstore *ms = kb_memstore_create();
    uint8_t *src = malloc(N), *dst = malloc(N + 64);
    assert_non_null(ms);
    assert_non_null(src);
    assert_non_null(dst);
    for (size_t i = 0; i < N; i++)
        src[i] = (uint8_t)(i * 31u + 7u);
    /* Starts 10 bytes before a page boundary: touches 5 pages. */
    uint64_t pa = 0x7000000000ull + P - 10;
    assert_int_equal(kb_memstore_write(ms, pa, src, N), 0);
    assert_int_equal(kb_memstore_pages(ms), 5);
    kb_memstore_read(ms, pa - 32, dst, N + 64);
    for (size_t i = 0; i < 32; i++) {
        assert_int_equal(dst[i], 0xFF);
        assert_int_equal(dst[32 + N + i], 0xFF);
    }
    assert_memory_equal(dst + 32, src, N);
    /* A two-byte write straddling a boundary. */
    const uint8_t two[2] = { 0xAA, 0xBB };
    assert_int_equal(kb_memstore_write(ms, 2 * P - 1, two, 2), 0);
    assert_int_equal(kb_memstore_pages(ms), 7);
    uint8_t back[4];
    kb_memstore_read(ms, 2 * P - 2, back, 4);
    const uint8_t want[4] = { 0xFF, 0xAA, 0xBB, 0xFF };
    assert_memory_equal(back, want, 4);
    free(src);
    free(dst);
    kb_memstore_destroy(ms);
}

static void test_many_pages(void **state)
{
    (void)state;
    enum { NP = 700 }; /* the table grows 64 -> 2048 slots */
    kb_memstore *ms = kb_memstore_create();
    assert_non_null(ms);
    /* Scattered page numbers, including neighbours and far-apart ones. */
    for (uint64_t i = 0; i < NP; i++) {
        uint64_t pa = ((i * 2654435761ull) % 1000003ull) << KB_MEMSTORE_PAGE_SHIFT |
                      (i % KB_MEMSTORE_PAGE_BYTES);
        uint64_t v = i * 0x0101010101010101ull;
        assert_int_equal(kb_memstore_write(ms, pa, &v, sizeof v), 0);
    }
    assert_int_equal(kb_memstore_pages(ms), NP);
    for (uint64_t i = 0; i < NP; i++) {
        uint64_t pa = ((i * 2654435761ull) % 1000003ull) << KB_MEMSTORE_PAGE_SHIFT |
                      (i % KB_MEMSTORE_PAGE_BYTES);
        uint64_t v = 0, want = i * 0x0101010101010101ull;
        kb_memstore_read(ms, pa, &v, sizeof v);
        assert_true(v == want);
        uint8_t before = 0;
        if (i % KB_MEMSTORE_PAGE_BYTES) {
            kb_memstore_read(ms, pa - 1, &before, 1);
            assert_int_equal(before, 0xFF);
        }
    }
    /* An unwritten page between written ones still reads poison. */
    uint64_t probe = 0;
    kb_memstore_read(ms, UINT64_C(0xFFFFFFFF) << KB_MEMSTORE_PAGE_SHIFT, &probe, sizeof probe);
    assert_true(probe == UINT64_MAX);
    kb_memstore_destroy(ms);
}

/* Pages come from slabs of 510 (kb_memstore.c): 1 100 whole pages, three slabs, each page
 * filled with its own byte and read back whole, so that pages sharing memory would show. */
static void test_slab_pages(void **state)
{
    (void)state;
    enum { NP = 1100 };
    static uint8_t buf[KB_MEMSTORE_PAGE_BYTES], back[KB_MEMSTORE_PAGE_BYTES];
    kb_memstore *ms = kb_memstore_create();
    assert_non_null(ms);
    for (uint64_t i = 0; i < NP; i++) {
        memset(buf, (int)((i * 7u + 1u) & 0xFFu), sizeof buf);
        assert_int_equal(kb_memstore_write(ms, (i * 3u) << KB_MEMSTORE_PAGE_SHIFT, buf,
                                           sizeof buf), 0);
    }
    assert_int_equal(kb_memstore_pages(ms), NP);
    for (uint64_t i = 0; i < NP; i++) {
        memset(buf, (int)((i * 7u + 1u) & 0xFFu), sizeof buf);
        kb_memstore_read(ms, (i * 3u) << KB_MEMSTORE_PAGE_SHIFT, back, sizeof back);
        assert_memory_equal(back, buf, sizeof buf);
    }
    kb_memstore_destroy(ms);
}

static void test_high_address(void **state)
{
    (void)state;
    kb_memstore *ms = kb_memstore_create();
    const uint8_t d[3] = { 9, 8, 7 };
    uint8_t b[3];
    assert_non_null(ms);
    assert_int_equal(kb_memstore_write(ms, UINT64_MAX - 2, d, 3), 0);
    kb_memstore_read(ms, UINT64_MAX - 2, b, 3);
    assert_memory_equal(b, d, 3);
    assert_int_equal(kb_memstore_write(ms, UINT64_MAX - 1, d, 3), KB_ERR_INVAL); /* wraps */
    kb_memstore_destroy(ms);
}

/* A device mirror over the last 64 bytes of the address space, for the dirty-set tests. */
#define TOP_BYTES 64
static uint8_t top_dev[TOP_BYTES];

static int top_pull(void *self, uint64_t pa, void *dst, size_t n, kb_errbuf *eb)
{
    (void)self;
    (void)eb;
    assert_true(pa >= UINT64_MAX - (TOP_BYTES - 1) && n <= UINT64_MAX - pa + 1);
    memcpy(dst, top_dev + (pa - (UINT64_MAX - (TOP_BYTES - 1))), n);
    return 0;
}

/*
 * Ranges that end at the last byte of the address space, with a mirror (found by the replay
 * fuzz target, tests/fuzz/): the dirty sets' intervals cannot end at 2^64, so such a write
 * used to change neither set (the device's older bytes still read through) and such a load
 * saw no device-dirty byte (the host's stale copy came back).
 */
static void test_top_of_space_dirty(void **state)
{
    (void)state;
    kb_memstore *ms = kb_memstore_create();
    const uint64_t base = UINT64_MAX - (TOP_BYTES - 1);
    kb_memstore_mirror m = { top_dev, top_pull, NULL };
    uint8_t host[TOP_BYTES], got[TOP_BYTES];
    kb_range dirty = { base + 8, base + 24 };
    kb_errbuf eb;

    assert_non_null(ms);
    memset(host, 0x11, sizeof host);
    memset(top_dev, 0x22, sizeof top_dev);
    kb_memstore_set_mirror(ms, &m);
    assert_int_equal(kb_memstore_write(ms, base, host, sizeof host), 0);
    /* host-dirty up to the last byte, which no device holds */
    assert_int_equal(kb_memstore_host_dirty(ms)->n, 1);
    assert_true(kb_memstore_host_dirty(ms)->v[0].lo == base &&
                kb_memstore_host_dirty(ms)->v[0].hi == UINT64_MAX);
    kb_memstore_host_clean(ms);
    /* a load ending at 2^64 reads the device-dirty bytes through */
    assert_int_equal(kb_memstore_mark_device(ms, &dirty, 1), 0);
    assert_int_equal(kb_memstore_load(ms, base, got, sizeof got, &eb), 0);
    for (size_t i = 0; i < sizeof got; i++)
        assert_int_equal(got[i], i >= 8 && i < 24 ? 0x22 : 0x11);
    /* a write ending at 2^64 makes the host's bytes the newer ones again */
    assert_int_equal(kb_memstore_write(ms, base + 16, host, TOP_BYTES - 16), 0);
    assert_int_equal(kb_memstore_load(ms, base, got, sizeof got, &eb), 0);
    for (size_t i = 0; i < sizeof got; i++)
        assert_int_equal(got[i], i >= 8 && i < 16 ? 0x22 : 0x11);
    /* sync up to the end pulls them into the host copy */
    assert_int_equal(kb_memstore_sync(ms, base, TOP_BYTES, &eb), 0);
    assert_int_equal(kb_memstore_device_dirty(ms)->n, 0);
    kb_memstore_read(ms, base, got, sizeof got);
    assert_int_equal(got[8], 0x22);
    /* ranges that wrap are refused with a message */
    eb.msg[0] = '\0';
    assert_int_equal(kb_memstore_load(ms, base, got, TOP_BYTES + 1, &eb), KB_ERR_INVAL);
    assert_non_null(strstr(eb.msg, "wrap"));
    assert_int_equal(kb_memstore_sync(ms, base, TOP_BYTES + 1, &eb), KB_ERR_INVAL);
    kb_memstore_set_mirror(ms, NULL);
    kb_memstore_destroy(ms);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_poison),
        cmocka_unit_test(test_small_write),
        cmocka_unit_test(test_cross_page),
        cmocka_unit_test(test_many_pages),
        cmocka_unit_test(test_slab_pages),
        cmocka_unit_test(test_high_address),
        cmocka_unit_test(test_top_of_space_dirty),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
