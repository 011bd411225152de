/*
 * kb_oplog — storage of the op log: records in fixed-size chunks (an array of chunk pointers
 * that grows), so appending never copies or moves earlier records and kb_oplog_at pointers
 * stay valid for the life of the log; host-write bytes live in one growable payload buffer
 * whose offsets are 8-byte aligned (the buffer itself may move when it grows). The payload is
 * a shared-memory file (memfd) mapped here, so that a device server can map the same pages
 * and upload host data without copying it through a socket (kb_oplog_payload_fd); where
 * memfd is refused it is plain heap memory. The log owns everything it stores. Limits: single-threaded; nothing is freed before kb_oplog_destroy, so
 * a long run keeps every record it ever logged.
 */
#include "kb_oplog.h"

#include <assert.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kb_bigmem.h"

/* A chunk fills one 2 MiB huge page (with kb_bigmem's header): big logs page-fault 512x less. */
enum { CHUNK_RECS = (int)(((size_t)2 << 20) - 64) / (int)sizeof(kb_rec) };

struct kb_oplog {
    kb_rec **chunks;    /* each CHUNK_RECS records; owned */
    size_t nchunks, capchunks;
    size_t count;
    size_t replayed;
    uint64_t *cuts;     /* ascending record indices = seqs (kb_oplog_cut); owned */
    size_t ncuts, capcuts;
    uint8_t *payload;   /* owned: mapped from payload_fd, or heap memory when that is -1 */
    size_t payload_size, payload_cap;
    int payload_fd;     /* the memfd behind payload (owned), -1: heap, -2: not decided yet */
};

const char *kb_rec_kind_name(kb_rec_kind k)
{
    static const char *const names[KB_REC_NKINDS] = {
        "copy", "fill", "math1", "math2", "fma", "clamp", "softmax", "reduce", "gemm",
        "transpose", "attn_softmax", "gather",
        /* number formats */
        "dequant",
        /* test data */
        "gen",
    };
    if ((unsigned)k >= KB_REC_NKINDS)
        return "?";
    return names[k];
}

kb_oplog *kb_oplog_create(void)
{
    kb_oplog *log = calloc(1, sizeof(kb_oplog));
    if (log)
        log->payload_fd = -2;
    return log;
}

/* Grows the payload to cap bytes (contents kept). */
static int payload_grow(kb_oplog *log, size_t cap)
{
    if (log->payload_fd == -2) { /* the first growth decides */
        /* a device server maps it: sealed so that it can never shrink under that mapping
         * (the server refuses a file that is not) */
        log->payload_fd = memfd_create("kbcl-payload", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (log->payload_fd >= 0 && fcntl(log->payload_fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
            close(log->payload_fd);
            log->payload_fd = -1;
        }
    }
    if (log->payload_fd >= 0) {
        void *p;
        if (ftruncate(log->payload_fd, (off_t)cap) != 0)
            return KB_ERR_NOMEM;
        p = log->payload ? mremap(log->payload, log->payload_cap, cap, MREMAP_MAYMOVE)
                         : mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_SHARED, log->payload_fd, 0);
        if (p == MAP_FAILED)
            return KB_ERR_NOMEM;
        log->payload = p;
    } else {
        uint8_t *p = realloc(log->payload, cap);
        if (!p)
            return KB_ERR_NOMEM;
        log->payload = p;
    }
    log->payload_cap = cap;
    return 0;
}

void kb_oplog_destroy(kb_oplog *log)
{
    if (!log)
        return;
    for (size_t i = 0; i < log->nchunks; i++)
        kb_bigmem_free(log->chunks[i]);
    free(log->chunks);
    free(log->cuts);
    if (log->payload_fd >= 0) {
        if (log->payload)
            munmap(log->payload, log->payload_cap);
        close(log->payload_fd);
    } else {
        free(log->payload);
    }
    free(log);
}

int kb_oplog_append(kb_oplog *log, const kb_rec *r, uint64_t *seq)
{
    size_t ci = log->count / CHUNK_RECS;

    if (ci == log->nchunks) {
        if (log->nchunks == log->capchunks) {
            size_t cap = log->capchunks ? log->capchunks * 2 : 16;
            kb_rec **p = realloc(log->chunks, cap * sizeof *p);
            if (!p)
                return KB_ERR_NOMEM;
            log->chunks = p;
            log->capchunks = cap;
        }
        kb_rec *c = kb_bigmem_alloc(CHUNK_RECS * sizeof *c);
        if (!c)
            return KB_ERR_NOMEM;
        log->chunks[log->nchunks++] = c;
    }
    kb_rec *dst = &log->chunks[ci][log->count % CHUNK_RECS];
    *dst = *r;
    dst->seq = (uint64_t)log->count;
    if (seq)
        *seq = dst->seq;
    log->count++;
    return 0;
}

int kb_oplog_add_payload(kb_oplog *log, const void *data, size_t n, uint64_t *off)
{
    uint8_t *at;
    int rc;
    if (n > 0 && !data)
        return KB_ERR_INVAL;
    if ((rc = kb_oplog_reserve_payload(log, n, off, &at)) != 0)
        return rc;
    if (n > 0)
        memcpy(at, data, n);
    return 0;
}

int kb_oplog_reserve_payload(kb_oplog *log, size_t n, uint64_t *off, uint8_t **at)
{
    /* 8-byte aligned offsets keep every element type naturally aligned inside the payload. */
    size_t start = (log->payload_size + 7u) & ~(size_t)7u;

    if (n > SIZE_MAX - start)
        return KB_ERR_NOMEM;
    if (start + n > log->payload_cap) {
        size_t cap = log->payload_cap ? log->payload_cap : 4096;
        while (cap < start + n) {
            if (cap > SIZE_MAX / 2) {
                cap = start + n;
                break;
            }
            cap *= 2;
        }
        int rc = payload_grow(log, cap);
        if (rc)
            return rc;
    }
    if (start > log->payload_size)
        memset(log->payload + log->payload_size, 0, start - log->payload_size);
    log->payload_size = start + n;
    if (off)
        *off = (uint64_t)start;
    if (at)
        *at = log->payload + start;
    return 0;
}

size_t kb_oplog_count(const kb_oplog *log)
{
    return log->count;
}

const kb_rec *kb_oplog_at(const kb_oplog *log, size_t i)
{
    assert(i < log->count);
    return &log->chunks[i / CHUNK_RECS][i % CHUNK_RECS];
}

const uint8_t *kb_oplog_payload(const kb_oplog *log)
{
    return log->payload;
}

size_t kb_oplog_payload_size(const kb_oplog *log)
{
    return log->payload_size;
}

int kb_oplog_payload_fd(const kb_oplog *log)
{
    return log->payload_fd >= 0 ? log->payload_fd : -1;
}

size_t kb_oplog_replayed(const kb_oplog *log)
{
    return log->replayed;
}

void kb_oplog_set_replayed(kb_oplog *log, size_t n)
{
    assert(n <= log->count);
    log->replayed = n <= log->count ? n : log->count;
}

int kb_oplog_cut(kb_oplog *log)
{
    if (log->count == 0 || (log->ncuts > 0 && log->cuts[log->ncuts - 1] == log->count))
        return 0;
    if (log->ncuts == log->capcuts) {
        size_t c = log->capcuts ? 2 * log->capcuts : 16;
        uint64_t *t = realloc(log->cuts, c * sizeof *t);
        if (!t)
            return KB_ERR_NOMEM;
        log->cuts = t;
        log->capcuts = c;
    }
    log->cuts[log->ncuts++] = log->count;
    return 0;
}

size_t kb_oplog_cuts_in(const kb_oplog *log, size_t first, size_t end, const uint64_t **cuts)
{
    size_t lo = 0, hi = log->ncuts;
    /* the first cut > first */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (log->cuts[mid] <= first)
            lo = mid + 1;
        else
            hi = mid;
    }
    size_t k = lo;
    while (k < log->ncuts && log->cuts[k] < end)
        k++;
    *cuts = log->cuts ? log->cuts + lo : NULL;
    return k - lo;
}
