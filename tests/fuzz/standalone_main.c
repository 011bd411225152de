/*
 * standalone_main — a main() for a fuzz target in builds without libFuzzer (gcc, the ASan
 * build): runs LLVMFuzzerTestOneInput once on every file named, and on every regular file of
 * every folder named (in name order, so a failure names the same file every time). CTest runs
 * it on the target's seed corpus (tests/fuzz/CMakeLists.txt): the harnesses keep compiling
 * and the corpus keeps passing in every build, sanitizers included.
 *
 * Exit status: 0 when every input ran (a finding aborts the program), 2 when an argument or
 * file could not be read or no input was found: an empty corpus must not pass silently.
 */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Runs the target on one file; 0, or -1 (message printed) when the file cannot be read. */
static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0;
    int rc = -1;

    if (!f) {
        fprintf(stderr, "%s: %s\n", path, strerror(errno));
        return -1;
    }
    for (;;) {
        if (len == cap) {
            size_t ncap = cap ? 2 * cap : 4096;
            uint8_t *nb = realloc(buf, ncap);
            if (!nb) {
                fprintf(stderr, "%s: out of memory\n", path);
                goto out;
            }
            buf = nb;
            cap = ncap;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0)
            break;
    }
    if (ferror(f)) {
        fprintf(stderr, "%s: read error\n", path);
        goto out;
    }
    /* an exact-size copy, as libFuzzer passes it: a read past the input is an ASan report */
    {
        uint8_t *exact = malloc(len ? len : 1);
        if (!exact) {
            fprintf(stderr, "%s: out of memory\n", path);
            goto out;
        }
        memcpy(exact, buf, len);
        LLVMFuzzerTestOneInput(exact, len);
        free(exact);
    }
    rc = 0;
out:
    free(buf);
    fclose(f);
    return rc;
}

static int not_hidden(const struct dirent *e)
{
    return e->d_name[0] != '.';
}

/* Every regular file of dir, in name order; the count run, or -1. */
static int run_dir(const char *dir)
{
    struct dirent **ents = NULL;
    int n = scandir(dir, &ents, not_hidden, alphasort), ran = 0, rc = 0;

    if (n < 0) {
        fprintf(stderr, "%s: %s\n", dir, strerror(errno));
        return -1;
    }
    for (int i = 0; i < n; i++) {
        char path[4096];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, ents[i]->d_name);
        if (rc == 0 && stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
            if (run_file(path) != 0)
                rc = -1;
            else
                ran++;
        }
        free(ents[i]);
    }
    free(ents);
    return rc ? rc : ran;
}

int main(int argc, char **argv)
{
    int total = 0;

    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE|FOLDER...\n", argv[0]);
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        struct stat st;
        int n;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "%s: %s\n", argv[i], strerror(errno));
            return 2;
        }
        n = S_ISDIR(st.st_mode) ? run_dir(argv[i]) : run_file(argv[i]) == 0 ? 1 : -1;
        if (n < 0)
            return 2;
        total += n;
    }
    if (total == 0) {
        fprintf(stderr, "%s: no input files\n", argv[0]);
        return 2;
    }
    printf("%s: %d inputs, no finding\n", argv[0], total);
    return 0;
}
