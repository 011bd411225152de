/* kb_atomic_file — temporary file + rename for outputs (kb_atomic_file.h). */
#include "kb_atomic_file.h"

#include <assert.h>
#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The folder of path into buf ("." for a bare name, "/" for the root). */
static const char *folder_of(const char *path, char *buf, size_t n)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(buf, n, ".");
    else if (slash == path)
        snprintf(buf, n, "/");
    else
        snprintf(buf, n, "%.*s", (int)(slash - path), path);
    return buf;
}

/* Why PATH cannot be written, when its temporary file could not be created (errno e): errors
 * name the output the user gave, never the temporary file, which is kbcl's business. */
static int open_error(const char *path, int e, kb_errbuf *eb)
{
    char dir[4096];
    struct stat st;
    folder_of(path, dir, sizeof dir);
    if (stat(dir, &st) != 0)
        return kb_err_set(eb, KB_ERR_IO, "%s: cannot write it: its folder %s: %s", path, dir,
                          strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return kb_err_set(eb, KB_ERR_IO, "%s: cannot write it: %s is not a folder", path, dir);
    return kb_err_set(eb, KB_ERR_IO, "%s: cannot write it: cannot create a file in its folder "
                      "%s (%s)", path, dir, strerror(e));
}

int kb_atomic_open(kb_atomic_file *af, const char *path, kb_errbuf *eb)
{
    struct stat st;
    snprintf(af->path, sizeof af->path, "%s", path);
    af->tmp[0] = 0;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return kb_err_set(eb, KB_ERR_IO, "%s: cannot write it: it is a folder", path);
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        af->f = fopen(path, "w");
        if (!af->f)
            return kb_err_set(eb, KB_ERR_IO, "%s: cannot write it: %s", path, strerror(errno));
        return 0;
    }
    snprintf(af->tmp, sizeof af->tmp, "%s.tmp.%ld", path, (long)getpid());
    af->f = fopen(af->tmp, "w");
    if (!af->f)
        return open_error(path, errno, eb);
    return 0;
}

int kb_atomic_commit(kb_atomic_file *af, int failed, kb_errbuf *eb)
{
    int e = 0, closed;
    assert(af->f); /* opened by kb_atomic_open, committed once */
    /* the reason of a failed write: the caller's (its errno, when the stream says it failed)
     * or the flush's */
    if (failed && ferror(af->f))
        e = errno;
    else if (!failed && fflush(af->f) != 0)
        e = errno, failed = 1;
    closed = fclose(af->f) == 0;
    if (!closed && !e)
        e = errno;
    af->f = NULL;
    if (failed || !closed) {
        if (af->tmp[0])
            remove(af->tmp);
        if (e)
            return kb_err_set(eb, KB_ERR_IO, "%s: write failed: %s", af->path, strerror(e));
        return kb_err_set(eb, KB_ERR_IO, "%s: write failed", af->path);
    }
    if (af->tmp[0] && rename(af->tmp, af->path) != 0) {
        int re = errno;
        remove(af->tmp);
        return kb_err_set(eb, KB_ERR_IO, "%s: cannot write it: %s", af->path, strerror(re));
    }
    return 0;
}
