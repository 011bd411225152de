/*
 * kb_clcache — kbcl's on-disk cache of compiled OpenCL programs (warm start of the Phase-2
 * backends).
 *
 * Where: $KBCL_CACHE_DIR if set (the values "off", "0" and "none" turn the cache off), else
 * $XDG_CACHE_HOME/kbcl, else $HOME/.cache/kbcl — the folder convention PoCL uses for its own
 * kernel cache. Program binaries go to DIR/programs/, one file per key, named by a hash of
 * the key. The key is text the caller composes from everything a binary depends on
 * (platform, device, driver version, a hash of the program source and the build options);
 * the file holds the whole key and a checksum of the binary, so a hash collision, a
 * truncated or a foreign file reads as a miss, never as a wrong program. Entries are written
 * to a temporary file in the same folder and renamed into place, so concurrent processes
 * see either no entry or a whole one. Limits: nothing is ever evicted (one entry per
 * device, driver and kbcl build; delete the folder to reclaim it); binaries larger than
 * 1 GiB are not cached.
 */
#ifndef KB_CLCACHE_H
#define KB_CLCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "kb_err.h"

/*
 * The cache folder into buf (NUL-terminated). Returns 1 when the cache is on, 0 when
 * KBCL_CACHE_DIR turns it off or no folder can be named (no HOME); buf then says why.
 */
int kb_clcache_dir(char *buf, size_t n);

/* Creates path and its missing parents (mode 0700); 0, or -1 with errno set. */
int kb_clcache_mkdir_p(const char *path);

/* 64-bit FNV-1a of data, continuing from h (start with KB_CLCACHE_HASH_INIT). */
#define KB_CLCACHE_HASH_INIT UINT64_C(0xcbf29ce484222325)
uint64_t kb_clcache_hash(const void *data, size_t n, uint64_t h);

/* The entry file of key in dir: "DIR/programs/HHHHHHHHHHHHHHHH.bin". */
void kb_clcache_path(const char *dir, const char *key, char *buf, size_t n);

/*
 * Loads the entry of key: on a hit returns 1 with *data (malloc'd, caller frees) and *n; 0 on
 * a miss (no file, another key, a bad checksum, a short file); KB_ERR_NOMEM.
 */
int kb_clcache_load(const char *dir, const char *key, uint8_t **data, size_t *n);

/*
 * Stores data as the entry of key (creating DIR/programs), atomically (temporary file +
 * rename). KB_ERR_IO with the reason in eb; KB_ERR_RANGE for a binary over 1 GiB.
 */
int kb_clcache_store(const char *dir, const char *key, const void *data, size_t n,
                     kb_errbuf *eb);

#endif
