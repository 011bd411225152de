/* kb_atomic_file — temporary file + rename for outputs (kb_atomic_file.h). */
#include "kb_atomic_file.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int kb_atomic_open(kb_atomic_file *af, const char *path, kb_errbuf *eb)
{
    struct stat st;
    snprintf(af->path, sizeof af->path, "%s", path);
    af->tmp[0] = 0;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        af->f = fopen(path, "w");
        if (!af->f)
            return kb_err_set(eb, KB_ERR_IO, "%s: %s", path, strerror(errno));
        return 0;
    }
    snprintf(af->tmp, sizeof af->tmp, "%s.tmp.%ld", path, (long)getpid());
    af->f = fopen(af->tmp, "w");
    if (!af->f)
        return kb_err_set(eb, KB_ERR_IO, "%s: %s", af->tmp, strerror(errno));
    return 0;
}

int kb_atomic_commit(kb_atomic_file *af, int failed, kb_errbuf *eb)
{
    const char *written = af->tmp[0] ? af->tmp : af->path;
    int closed = fclose(af->f) == 0;
    af->f = NULL;
    if (failed || !closed) {
        if (af->tmp[0])
            remove(af->tmp);
        return kb_err_set(eb, KB_ERR_IO, "%s: write failed", written);
    }
    if (af->tmp[0] && rename(af->tmp, af->path) != 0) {
        int e = errno;
        remove(af->tmp);
        return kb_err_set(eb, KB_ERR_IO, "%s: %s", af->path, strerror(e));
    }
    return 0;
}
