/*
 * fuzz_util — what the fuzz targets (tests/fuzz/fuzz_*.c) share: the input cap, a scratch
 * folder of this process for the loaders that read a path, and checks whose failure is a
 * finding. Header-only (static inline functions), like tests/kb_test_util.h, but without cmocka: a
 * fuzz binary links the kbcl libraries and their system libraries only (docs/reliability.md).
 *
 * A target's LLVMFuzzerTestOneInput returns 0 for every input the product handles, error or
 * not; a crash, a sanitizer report, a leak or a failed KBF_CHECK (abort) is a finding.
 */
#ifndef KB_FUZZ_UTIL_H
#define KB_FUZZ_UTIL_H

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Larger inputs return at once: every file kbcl reads is far smaller, and the fuzzer's time
 * is better spent on many small inputs than on a few slow ones. */
#define KBF_MAX_INPUT (64 * 1024)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A finding: the message on stderr, then abort() so that libFuzzer keeps the input. */
#define KBF_CHECK(cond, ...)                                                          \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);  \
            fprintf(stderr, __VA_ARGS__);                                             \
            fputc('\n', stderr);                                                      \
            abort();                                                                  \
        }                                                                             \
    } while (0)

/* Not a finding: the harness itself cannot go on (no temporary folder, disk full). */
#define KBF_ENV_FAIL(...)                                                             \
    do {                                                                              \
        fprintf(stderr, "fuzz harness: ");                                            \
        fprintf(stderr, __VA_ARGS__);                                                 \
        fputc('\n', stderr);                                                          \
        exit(2);                                                                      \
    } while (0)

#define KBF_MAX_FILES 8

static char kbf_dir_[4096];
static char kbf_files_[KBF_MAX_FILES][4200];
static int kbf_nfiles_;

static inline void kbf_cleanup_(void)
{
    for (int i = 0; i < kbf_nfiles_; i++)
        unlink(kbf_files_[i]);
    if (kbf_dir_[0])
        rmdir(kbf_dir_);
}

/* The scratch folder: $TMPDIR/kbcl-fuzz.XXXXXX, made on first use, removed at exit. */
static inline const char *kbf_dir(void)
{
    if (!kbf_dir_[0]) {
        const char *t = getenv("TMPDIR");
        snprintf(kbf_dir_, sizeof kbf_dir_, "%s/kbcl-fuzz.XXXXXX", t && *t ? t : "/tmp");
        if (!mkdtemp(kbf_dir_))
            KBF_ENV_FAIL("mkdtemp %s: %s", kbf_dir_, strerror(errno));
        atexit(kbf_cleanup_);
    }
    return kbf_dir_;
}

/* Writes data[0..size) to the scratch file `name` (a plain name) and returns its path, which
 * stays the same for the process: loaders see the same path for every input. */
static inline const char *kbf_file(const char *name, const void *data, size_t size)
{
    char path[sizeof kbf_files_[0]];
    const char *d = kbf_dir();
    int i, fd;

    snprintf(path, sizeof path, "%s/%s", d, name);
    for (i = 0; i < kbf_nfiles_ && strcmp(kbf_files_[i], path); i++)
        ;
    if (i == kbf_nfiles_) {
        if (kbf_nfiles_ == KBF_MAX_FILES)
            KBF_ENV_FAIL("more than %d scratch files", KBF_MAX_FILES);
        snprintf(kbf_files_[kbf_nfiles_++], sizeof kbf_files_[0], "%s", path);
    }
    fd = open(kbf_files_[i], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        KBF_ENV_FAIL("%s: %s", kbf_files_[i], strerror(errno));
    for (size_t done = 0; done < size;) {
        ssize_t w = write(fd, (const char *)data + done, size - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            KBF_ENV_FAIL("%s: write: %s", kbf_files_[i], strerror(errno));
        done += (size_t)w;
    }
    if (close(fd) != 0)
        KBF_ENV_FAIL("%s: close: %s", kbf_files_[i], strerror(errno));
    return kbf_files_[i];
}

/* An error must say what went wrong: a code without a message is a finding. */
#define KBF_CHECK_ERR(rc, eb) \
    KBF_CHECK((rc) < 0 && (eb).msg[0], "error %d with message '%s'", (rc), (eb).msg)

#endif
