/*
 * kb_clcache — the on-disk program cache (kb_clcache.h). An entry file is a 32-byte header
 * (magic "KBCLPRG1", key length, data length, FNV-1a of the data; little-endian u64s), the key
 * text and the data. A load checks all of it; a store writes DIR/programs/NAME.tmp.PID.N with
 * O_EXCL (the first
 * N not taken) and renames it over NAME.
 */
#include "kb_clcache.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define MAGIC "KBCLPRG1"
#define HDR 32u
#define MAX_DATA (UINT64_C(1) << 30)

int kb_clcache_dir(char *buf, size_t n)
{
    const char *k = getenv("KBCL_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME"),
               *home = getenv("HOME");

    if (k && *k) {
        if (!strcmp(k, "off") || !strcmp(k, "0") || !strcmp(k, "none")) {
            snprintf(buf, n, "off (KBCL_CACHE_DIR=%s)", k);
            return 0;
        }
        snprintf(buf, n, "%s", k);
        return 1;
    }
    if (xdg && xdg[0] == '/') {
        snprintf(buf, n, "%s/kbcl", xdg);
        return 1;
    }
    if (home && *home) {
        snprintf(buf, n, "%s/.cache/kbcl", home);
        return 1;
    }
    snprintf(buf, n, "off (no KBCL_CACHE_DIR, XDG_CACHE_HOME or HOME)");
    return 0;
}

uint64_t kb_clcache_hash(const void *data, size_t n, uint64_t h)
{
    const uint8_t *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= UINT64_C(0x100000001b3);
    }
    return h;
}

void kb_clcache_path(const char *dir, const char *key, char *buf, size_t n)
{
    snprintf(buf, n, "%s/programs/%016llx.bin", dir,
             (unsigned long long)kb_clcache_hash(key, strlen(key), KB_CLCACHE_HASH_INIT));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (unsigned i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* read(2) until n bytes or end of file; bytes read, or -1. */
static ssize_t read_full(int fd, void *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (uint8_t *)buf + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -1;
        if (r == 0)
            break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

static int write_full(int fd, const void *buf, size_t n)
{
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(fd, (const uint8_t *)buf + done, n - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        done += (size_t)w;
    }
    return 0;
}

int kb_clcache_load(const char *dir, const char *key, uint8_t **data, size_t *n)
{
    char path[4096];
    uint8_t hdr[HDR];
    size_t klen = strlen(key);
    char *kbuf = NULL;
    uint8_t *d = NULL;
    int fd, rc = 0;

    *data = NULL;
    *n = 0;
    kb_clcache_path(dir, key, path, sizeof path);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    if (read_full(fd, hdr, HDR) != (ssize_t)HDR || memcmp(hdr, MAGIC, 8) != 0 ||
        get64(hdr + 8) != klen || get64(hdr + 16) == 0 || get64(hdr + 16) > MAX_DATA)
        goto out;
    uint64_t dlen = get64(hdr + 16);
    kbuf = malloc(klen + 1);
    d = malloc((size_t)dlen);
    if (!kbuf || !d) {
        rc = KB_ERR_NOMEM;
        goto out;
    }
    if (read_full(fd, kbuf, klen) != (ssize_t)klen || memcmp(kbuf, key, klen) != 0)
        goto out;
    if (read_full(fd, d, (size_t)dlen) != (ssize_t)dlen ||
        kb_clcache_hash(d, (size_t)dlen, KB_CLCACHE_HASH_INIT) != get64(hdr + 24))
        goto out;
    uint8_t extra;
    if (read_full(fd, &extra, 1) != 0) /* longer than it says: not ours */
        goto out;
    *data = d;
    *n = (size_t)dlen;
    d = NULL;
    rc = 1;
out:
    close(fd);
    free(kbuf);
    free(d);
    return rc;
}

int kb_clcache_mkdir_p(const char *path)
{
    char buf[4096];
    size_t n = strlen(path);

    if (n == 0 || n >= sizeof buf)
        return -1;
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0')
            continue;
        char c = buf[i];
        buf[i] = '\0';
        if (mkdir(buf, 0700) != 0 && errno != EEXIST)
            return -1;
        buf[i] = c;
    }
    return 0;
}

int kb_clcache_store(const char *dir, const char *key, const void *data, size_t n,
                     kb_errbuf *eb)
{
    char sub[4096], path[4096], tmp[4200];
    uint8_t hdr[HDR];
    size_t klen = strlen(key);
    int fd = -1, e;

    if ((uint64_t)n > MAX_DATA || n == 0)
        return kb_err_set(eb, KB_ERR_RANGE, "program cache: a binary of %zu bytes is not cached",
                          n);
    snprintf(sub, sizeof sub, "%s/programs", dir);
    if (kb_clcache_mkdir_p(sub) != 0)
        return kb_err_set(eb, KB_ERR_IO, "program cache: cannot create %s: %s", sub,
                          strerror(errno));
    kb_clcache_path(dir, key, path, sizeof path);
    /* One process may store from several backends: the first free suffix. */
    for (unsigned i = 0; fd < 0 && i < 64; i++) {
        snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%u", path, (long)getpid(), i);
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0 && errno != EEXIST)
            break;
    }
    if (fd < 0)
        return kb_err_set(eb, KB_ERR_IO, "program cache: %s: %s", tmp, strerror(errno));
    memcpy(hdr, MAGIC, 8);
    put64(hdr + 8, klen);
    put64(hdr + 16, n);
    put64(hdr + 24, kb_clcache_hash(data, n, KB_CLCACHE_HASH_INIT));
    if (write_full(fd, hdr, HDR) != 0 || write_full(fd, key, klen) != 0 ||
        write_full(fd, data, n) != 0)
        goto fail;
    if (close(fd) != 0) {
        fd = -1;
        goto fail;
    }
    fd = -1;
    if (rename(tmp, path) != 0)
        goto fail;
    return 0;
fail:
    e = errno;
    if (fd >= 0)
        close(fd);
    remove(tmp);
    return kb_err_set(eb, KB_ERR_IO, "program cache: writing %s: %s", path, strerror(e));
}
