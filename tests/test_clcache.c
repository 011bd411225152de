/*
 * test_clcache — the on-disk program cache: the folder convention (KBCL_CACHE_DIR, "off",
 * XDG_CACHE_HOME, HOME), store then load of the same key, another key is a miss, damaged
 * entries (truncated, one flipped byte, trailing bytes, a foreign file) are misses, a store
 * replaces an entry atomically and leaves no temporary file, and errors name the folder.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kb_clcache.h"
#include "kb_test_util.h"

static int setup(void **state)
{
    (void)state;
    return kbt_workdir_make("kbcl-clcache");
}

static int teardown(void **state)
{
    (void)state;
    return kbt_workdir_remove();
}

static void test_dir_convention(void **state)
{
    char buf[512], want[512];
    (void)state;
    setenv("KBCL_CACHE_DIR", "/some/where", 1);
    setenv("XDG_CACHE_HOME", "/xdg", 1);
    setenv("HOME", "/home/u", 1);
    assert_int_equal(kb_clcache_dir(buf, sizeof buf), 1);
    assert_string_equal(buf, "/some/where");
    static const char *const offs[] = { "off", "0", "none" };
    for (size_t i = 0; i < sizeof offs / sizeof offs[0]; i++) {
        setenv("KBCL_CACHE_DIR", offs[i], 1);
        assert_int_equal(kb_clcache_dir(buf, sizeof buf), 0);
        assert_non_null(strstr(buf, "off"));
    }
    unsetenv("KBCL_CACHE_DIR");
    assert_int_equal(kb_clcache_dir(buf, sizeof buf), 1);
    assert_string_equal(buf, "/xdg/kbcl");
    setenv("KBCL_CACHE_DIR", "", 1); /* empty: as if unset */
    setenv("XDG_CACHE_HOME", "relative", 1); /* not absolute: ignored, as the XDG spec says */
    assert_int_equal(kb_clcache_dir(buf, sizeof buf), 1);
    assert_string_equal(buf, "/home/u/.cache/kbcl");
    unsetenv("XDG_CACHE_HOME");
    unsetenv("HOME");
    assert_int_equal(kb_clcache_dir(buf, sizeof buf), 0);
    kb_clcache_path("/c", "key", buf, sizeof buf);
    snprintf(want, sizeof want, "/c/programs/%016llx.bin",
             (unsigned long long)kb_clcache_hash("key", 3, KB_CLCACHE_HASH_INIT));
    assert_string_equal(buf, want);
    /* FNV-1a's published test vectors */
    assert_true(kb_clcache_hash("", 0, KB_CLCACHE_HASH_INIT) == UINT64_C(0xcbf29ce484222325));
    assert_true(kb_clcache_hash("a", 1, KB_CLCACHE_HASH_INIT) == UINT64_C(0xaf63dc4c8601ec8c));
}

/* Number of entries in DIR/programs whose name contains part. */
static int count_files(const char *dir, const char *part)
{
    char sub[512];
    int n = 0;
    snprintf(sub, sizeof sub, "%s/programs", dir);
    DIR *d = opendir(sub);
    if (!d)
        return 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (e->d_name[0] != '.' && strstr(e->d_name, part))
            n++;
    closedir(d);
    return n;
}

static void rewrite(const char *path, const uint8_t *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

static uint8_t *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(*n + 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, *n, f), *n);
    fclose(f);
    return b;
}

static void test_store_load(void **state)
{
    char dir[512], path[600];
    uint8_t bin[3000], *got = NULL;
    size_t n = 0;
    kb_errbuf eb;
    (void)state;
    kbt_path(dir, sizeof dir, "cache/deeper"); /* created on the first store */
    for (size_t i = 0; i < sizeof bin; i++)
        bin[i] = (uint8_t)(i * 7 + 1);
    const char *key = "kbcl replay program v1\ndevice: X\n";
    assert_int_equal(kb_clcache_load(dir, key, &got, &n), 0); /* no folder yet: a miss */
    assert_null(got);
    assert_int_equal(kb_clcache_store(dir, key, bin, sizeof bin, &eb), 0);
    assert_int_equal(count_files(dir, ".bin"), 1);
    assert_int_equal(count_files(dir, ".tmp"), 0);
    assert_int_equal(kb_clcache_load(dir, key, &got, &n), 1);
    assert_int_equal(n, sizeof bin);
    assert_memory_equal(got, bin, sizeof bin);
    free(got);
    /* Another key is a miss, even one whose file name would collide (checked by content). */
    assert_int_equal(kb_clcache_load(dir, "kbcl replay program v1\ndevice: Y\n", &got, &n), 0);
    kb_clcache_path(dir, key, path, sizeof path);
    size_t fn;
    uint8_t *file = slurp(path, &fn);
    assert_int_equal(fn, 32 + strlen(key) + sizeof bin);
    /* Damaged entries are misses: truncated, a flipped data byte, trailing bytes, a foreign
     * magic. */
    rewrite(path, file, fn - 1);
    assert_int_equal(kb_clcache_load(dir, key, &got, &n), 0);
    file[fn - 10] ^= 1;
    rewrite(path, file, fn);
    assert_int_equal(kb_clcache_load(dir, key, &got, &n), 0);
    file[fn - 10] ^= 1;
    file = realloc(file, fn + 1);
    assert_non_null(file);
    file[fn] = 0;
    rewrite(path, file, fn + 1);
    assert_int_equal(kb_clcache_load(dir, key, &got, &n), 0);
    file[0] = 'X';
    rewrite(path, file, fn);
    assert_int_equal(kb_clcache_load(dir, key, &got, &n), 0);
    assert_null(got);
    /* A store replaces whatever is there. */
    bin[0] ^= 0xFF;
    assert_int_equal(kb_clcache_store(dir, key, bin, 100, &eb), 0);
    assert_int_equal(kb_clcache_load(dir, key, &got, &n), 1);
    assert_int_equal(n, 100);
    assert_memory_equal(got, bin, 100);
    free(got);
    assert_int_equal(count_files(dir, ".tmp"), 0);
    free(file);
}

static void test_store_errors(void **state)
{
    char dir[512];
    kb_errbuf eb;
    uint8_t b = 1;
    (void)state;
    /* A folder that cannot be created: a regular file stands where it should be. */
    kbt_write_file("blocker", "x");
    kbt_path(dir, sizeof dir, "blocker/cache");
    eb.msg[0] = '\0';
    assert_int_equal(kb_clcache_store(dir, "k", &b, 1, &eb), KB_ERR_IO);
    assert_non_null(strstr(eb.msg, "blocker/cache/programs"));
    assert_int_equal(kb_clcache_store(dir, "k", &b, 0, &eb), KB_ERR_RANGE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dir_convention),
        cmocka_unit_test(test_store_load),
        cmocka_unit_test(test_store_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
