/*
 * kb_test_net — a run spread over several processes without MPI, for tests: kbt_net_start
 * forks the processes (star-connected over socketpairs to rank 0) and kbt_net_allgather is the
 * collective kb_psim_net asks for. What kbcl does under mpirun, checked where CI has no
 * launcher. Children must leave through kbt_net_finish (they never return to cmocka); rank 0
 * waits for them there. Header-only like kb_test_util.h.
 */
#ifndef KB_TEST_NET_H
#define KB_TEST_NET_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define KBT_NET_MAX 8

typedef struct kbt_net {
    int rank, nranks;
    int fd[KBT_NET_MAX]; /* rank 0: fd[r] to rank r; a child: fd[0] to rank 0 */
    pid_t pid[KBT_NET_MAX];
} kbt_net;

static inline int kbt_net_io(int fd, void *p, size_t n, int wr)
{
    uint8_t *b = p;
    while (n > 0) {
        ssize_t k = wr ? write(fd, b, n) : read(fd, b, n);
        if (k <= 0)
            return -1;
        b += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Forks nranks - 1 children; returns 0 in every process, with n->rank its rank. */
static inline int kbt_net_start(kbt_net *n, int nranks)
{
    memset(n, 0, sizeof *n);
    n->nranks = nranks;
    for (int r = 1; r < nranks; r++) {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
            return -1;
        pid_t p = fork();
        if (p < 0)
            return -1;
        if (p == 0) {
            close(sv[0]);
            for (int k = 1; k < r; k++)
                close(n->fd[k]);
            n->rank = r;
            n->fd[0] = sv[1];
            return 0;
        }
        close(sv[1]);
        n->fd[r] = sv[0];
        n->pid[r] = p;
    }
    return 0;
}

static inline int kbt_net_allgather(void *ud, const void *mine, size_t len, void **all,
                                    size_t *counts)
{
    kbt_net *n = ud;
    uint64_t c[KBT_NET_MAX];
    size_t total = 0;
    uint8_t *buf;
    if (n->rank != 0) {
        uint64_t l = len;
        if (kbt_net_io(n->fd[0], &l, sizeof l, 1) || kbt_net_io(n->fd[0], (void *)mine, len, 1) ||
            kbt_net_io(n->fd[0], c, sizeof c, 0))
            return -1;
        for (int r = 0; r < n->nranks; r++)
            total += (counts[r] = (size_t)c[r]);
        if (!(buf = malloc(total ? total : 1)) || kbt_net_io(n->fd[0], buf, total, 0))
            return -1;
        *all = buf;
        return 0;
    }
    uint8_t *part[KBT_NET_MAX] = { 0 };
    c[0] = len;
    for (int r = 1; r < n->nranks; r++) {
        if (kbt_net_io(n->fd[r], &c[r], sizeof c[r], 0) || !(part[r] = malloc(c[r] ? c[r] : 1)) ||
            kbt_net_io(n->fd[r], part[r], c[r], 0))
            return -1;
    }
    for (int r = 0; r < n->nranks; r++)
        total += (counts[r] = (size_t)c[r]);
    if (!(buf = malloc(total ? total : 1)))
        return -1;
    size_t off = 0;
    for (int r = 0; r < n->nranks; r++) {
        memcpy(buf + off, r ? part[r] : mine, c[r]);
        off += c[r];
        free(part[r]);
    }
    for (int r = 1; r < n->nranks; r++)
        if (kbt_net_io(n->fd[r], c, sizeof c, 1) || kbt_net_io(n->fd[r], buf, total, 1))
            return -1;
    *all = buf;
    return 0;
}

/* A child exits with `code`; rank 0 waits for every child: 0 when all exited 0. */
static inline int kbt_net_finish(kbt_net *n, int code)
{
    if (n->rank != 0)
        _exit(code);
    int bad = 0;
    for (int r = 1; r < n->nranks; r++) {
        int st = 0;
        close(n->fd[r]);
        if (waitpid(n->pid[r], &st, 0) != n->pid[r] || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
            bad++;
    }
    return bad;
}

#endif
