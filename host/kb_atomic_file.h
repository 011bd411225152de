/*
 * kb_atomic_file — output files that are never half-written: write to "PATH.tmp.PID", then
 * rename over PATH when everything went well (or remove the temporary file). A PATH that is
 * an existing non-regular file (a device like /dev/stdout, a FIFO) is written in place, since
 * renaming over it would replace the node.
 */
#ifndef KB_ATOMIC_FILE_H
#define KB_ATOMIC_FILE_H

#include <stdio.h>

#include "kb_err.h"

typedef struct kb_atomic_file {
    FILE *f;
    char path[4096];
    char tmp[4096];   /* "" when writing in place */
} kb_atomic_file;

/* Opens the temporary file (or PATH itself, see above). KB_ERR_IO with the reason. */
int kb_atomic_open(kb_atomic_file *af, const char *path, kb_errbuf *eb);
/* Closes; on success (failed == 0 and the close worked) renames into place, else removes the
 * temporary file. Returns 0 or KB_ERR_IO. */
int kb_atomic_commit(kb_atomic_file *af, int failed, kb_errbuf *eb);

#endif
