/*
 * sweep_mpi — kbcl's MPI side (kb_cli.h): the points of `kbcl sweep` spread over MPI ranks,
 * and the ranks' collective for `kbcl run` under mpirun (kbcl_mpi_net: one run whose SIPs the
 * ranks share, docs/parallel.md). For a sweep, rank 0 hands out points one at a time (dynamic,
 * so long and short points balance), receives every outcome and alone calls `finish`, which
 * appends the row; it also computes points itself in a helper thread that never calls MPI
 * (MPI_THREAD_FUNNELED). For a run, the collective is called from the thread that runs the
 * simulation (the main thread). MPI is initialised only here, and only when the launcher's
 * environment says there are several ranks, so a run without mpirun never touches MPI. Limits:
 * a point runs inside its rank's process, so a crash in one point ends the whole MPI job (the
 * rows written so far stay valid and --resume continues); a run's collective moves less than
 * 2 GiB at a time; without KBCL_HAVE_MPI the entry points report that this build has no MPI
 * (a launcher with several ranks is refused with exit 2).
 */
#include <assert.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kb_cli.h"
#include "kb_psim.h"

/* Ranks the launcher started, from its environment (Open MPI, MPICH/Hydra, Slurm PMI); 1 if
 * none. */
static int launcher_size(void)
{
    static const char *const vars[] = { "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE" };
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && atoi(v) > 0)
            return atoi(v);
    }
    return 1;
}

#ifdef KBCL_HAVE_MPI

#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include <mpi.h>

enum { TAG_READY = 1, TAG_RESULT = 2, TAG_ASSIGN = 3 };

int kbcl_sweep_mpi_init(int *rank, int *size, kb_errbuf *eb)
{
    int provided = 0;
    *rank = 0;
    *size = 1;
    if (launcher_size() <= 1)
        return 0;
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        return kb_err_set(eb, KB_ERR_IO, "MPI_Init failed");
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, size);
    return 1;
}

void kbcl_sweep_mpi_fini(void)
{
    MPI_Finalize();
}

/* kb_psim_net's collective: the sizes first, then the bytes (MPI counts are ints: a process's
 * share and the whole must stay under 2 GiB). */
static int mpi_allgather(void *ud, const void *mine, size_t n, void **all, size_t *counts)
{
    int size = 0, rc = 0;
    uint64_t me = n, total = 0;
    uint64_t *c = NULL;
    int *cnt = NULL, *disp = NULL;
    uint8_t *buf = NULL;
    (void)ud;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    c = malloc((size_t)size * sizeof *c);
    cnt = malloc((size_t)size * sizeof *cnt);
    disp = malloc((size_t)size * sizeof *disp);
    if (!c || !cnt || !disp) {
        rc = KB_ERR_NOMEM;
        goto done;
    }
    /* every rank calls both collectives whatever fails locally, so none is left waiting */
    if (MPI_Allgather(&me, 1, MPI_UINT64_T, c, 1, MPI_UINT64_T, MPI_COMM_WORLD) != MPI_SUCCESS) {
        rc = KB_ERR_IO;
        goto done;
    }
    for (int r = 0; r < size; r++) {
        if (total > (uint64_t)INT_MAX - c[r]) {
            rc = KB_ERR_RANGE; /* the same on every rank: all leave here */
            goto done;
        }
        disp[r] = (int)total;
        cnt[r] = (int)c[r];
        counts[r] = (size_t)c[r];
        total += c[r];
    }
    int ok = (buf = malloc(total ? (size_t)total : 1)) != NULL, all_ok = 0;
    if (MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD) != MPI_SUCCESS)
        rc = KB_ERR_IO;
    else if (!all_ok)
        rc = KB_ERR_NOMEM; /* on some rank: all leave here */
    else if (MPI_Allgatherv(mine, (int)n, MPI_BYTE, buf, cnt, disp, MPI_BYTE, MPI_COMM_WORLD) !=
             MPI_SUCCESS)
        rc = KB_ERR_IO;
done:
    free(c);
    free(cnt);
    free(disp);
    if (rc) {
        free(buf);
        return rc;
    }
    *all = buf;
    return 0;
}

void kbcl_mpi_net(struct kb_psim_net *net, int rank, int size)
{
    net->rank = rank;
    net->nranks = size;
    net->allgather = mpi_allgather;
    net->ud = NULL;
}

int kbcl_sweep_mpi_share(int **points, int *npoints, int ok, kb_errbuf *eb)
{
    int all_ok = 0, rank, n = *npoints;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all_ok) {
        *npoints = -1;
        return 0;
    }
    MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (rank != 0) {
        free(*points);
        if (!(*points = malloc((size_t)(n > 0 ? n : 1) * sizeof **points)))
            return kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
    }
    if (n > 0)
        MPI_Bcast(*points, n, MPI_INT, 0, MPI_COMM_WORLD);
    *npoints = n;
    return 0;
}

/* Rank 0's own share of the work: shared with its main thread under mu. */
typedef struct sw_queue {
    pthread_mutex_t mu;
    const int *points;
    int npoints, next, stop;
} sw_queue;

typedef struct sw_helper {
    const kbcl_sweep_io *io;
    sw_queue *q;
    int wfd;        /* outcomes go to rank 0's main thread through this pipe (owned) */
} sw_helper;

static int queue_take(sw_queue *q)
{
    int p = -1;
    pthread_mutex_lock(&q->mu);
    if (!q->stop && q->next < q->npoints)
        p = q->points[q->next++];
    pthread_mutex_unlock(&q->mu);
    return p;
}


static void *helper_main(void *arg)
{
    sw_helper *h = arg;
    void *o = malloc(h->io->outcome_size);
    int p;
    while (o && (p = queue_take(h->q)) >= 0) {
        h->io->run(h->io->ctx, p, o);
        if (kbcl_write_all(h->wfd, o, h->io->outcome_size) != 0)
            break;
    }
    free(o);
    close(h->wfd); /* EOF tells the main thread this helper is done */
    return NULL;
}

static int run_worker(const kbcl_sweep_io *io, kb_errbuf *eb)
{
    void *o = malloc(io->outcome_size);
    int p;
    if (!o)
        return kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
    MPI_Send(NULL, 0, MPI_BYTE, 0, TAG_READY, MPI_COMM_WORLD);
    for (;;) {
        MPI_Recv(&p, 1, MPI_INT, 0, TAG_ASSIGN, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        if (p < 0)
            break;
        io->run(io->ctx, p, o);
        MPI_Send(o, (int)io->outcome_size, MPI_BYTE, 0, TAG_RESULT, MPI_COMM_WORLD);
    }
    free(o);
    return 0;
}

static int run_root(const kbcl_sweep_io *io, const int *points, int npoints, int size,
                    kb_errbuf *eb)
{
    sw_queue q;
    sw_helper h;
    pthread_t th;
    char *buf = malloc(io->outcome_size), *local = malloc(io->outcome_size);
    size_t got = 0;
    int pfd[2] = { -1, -1 }, active = size - 1, helper = 0, rc = 0;

    memset(&q, 0, sizeof q);
    pthread_mutex_init(&q.mu, NULL);
    q.points = points;
    q.npoints = npoints;
    if (!buf || !local) {
        rc = kb_err_set(eb, KB_ERR_NOMEM, "out of memory");
        q.stop = 1; /* the other ranks are still served: each gets "no more points" */
    } else if (pipe2(pfd, O_CLOEXEC) == 0) {
        h.io = io;
        h.q = &q;
        h.wfd = pfd[1];
        helper = pthread_create(&th, NULL, helper_main, &h) == 0;
        if (!helper)
            close(pfd[1]);
    }
    /* until every other rank was told to stop and the helper's pipe reached EOF */
    while (active > 0 || helper) {
        int flag = 0, busy = 0;
        MPI_Status st;
        MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &st);
        if (flag) {
            int p;
            busy = 1;
            if (st.MPI_TAG == TAG_RESULT && buf) {
                MPI_Recv(buf, (int)io->outcome_size, MPI_BYTE, st.MPI_SOURCE, TAG_RESULT,
                         MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                if (io->finish(io->ctx, buf) != 0) {
                    pthread_mutex_lock(&q.mu);
                    q.stop = 1;
                    pthread_mutex_unlock(&q.mu);
                }
            } else {
                MPI_Recv(NULL, 0, MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG, MPI_COMM_WORLD,
                         MPI_STATUS_IGNORE);
            }
            p = queue_take(&q);
            MPI_Send(&p, 1, MPI_INT, st.MPI_SOURCE, TAG_ASSIGN, MPI_COMM_WORLD);
            if (p < 0)
                active--;
        }
        if (helper) {
            struct pollfd pf = { pfd[0], POLLIN, 0 };
            /* the poll timeout is also the idle wait between MPI probes */
            if (poll(&pf, 1, busy ? 0 : 2) > 0) {
                ssize_t r = read(pfd[0], local + got, io->outcome_size - got);
                if (r > 0) {
                    got += (size_t)r;
                    if (got == io->outcome_size) {
                        got = 0;
                        if (io->finish(io->ctx, local) != 0) {
                            pthread_mutex_lock(&q.mu);
                            q.stop = 1;
                            pthread_mutex_unlock(&q.mu);
                        }
                    }
                } else if (r == 0 || errno != EINTR) {
                    pthread_join(th, NULL);
                    helper = 0;
                }
            }
        } else if (!busy) {
            struct timespec ts = { 0, 2000000 };
            nanosleep(&ts, NULL);
        }
    }
    if (pfd[0] >= 0)
        close(pfd[0]);
    pthread_mutex_destroy(&q.mu);
    free(buf);
    free(local);
    return rc;
}

int kbcl_sweep_mpi_run(const kbcl_sweep_io *io, const int *points, int npoints, kb_errbuf *eb)
{
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (rank != 0)
        return run_worker(io, eb);
    return run_root(io, points, npoints, size, eb);
}

#else /* !KBCL_HAVE_MPI */

int kbcl_sweep_mpi_init(int *rank, int *size, kb_errbuf *eb)
{
    int n = launcher_size();
    *rank = 0;
    *size = 1;
    if (n > 1)
        return kb_err_set(eb, KB_ERR_UNSUPPORTED, "started by an MPI launcher as one of %d "
                          "ranks, but this kbcl was built without MPI (install libopenmpi-dev "
                          "and configure with -DKBCL_MPI=ON), or run it without mpirun (kbcl "
                          "sweep: --jobs N)", n);
    return 0;
}

void kbcl_sweep_mpi_fini(void)
{
}

void kbcl_mpi_net(struct kb_psim_net *net, int rank, int size)
{
    (void)net;
    (void)rank;
    (void)size;
    assert(!"kbcl_mpi_net without MPI: kbcl_sweep_mpi_init never returns 1 here");
}

int kbcl_sweep_mpi_share(int **points, int *npoints, int ok, kb_errbuf *eb)
{
    (void)points;
    (void)npoints;
    (void)ok;
    return kb_err_set(eb, KB_ERR_UNSUPPORTED, "built without MPI");
}

int kbcl_sweep_mpi_run(const kbcl_sweep_io *io, const int *points, int npoints, kb_errbuf *eb)
{
    (void)io;
    (void)points;
    (void)npoints;
    return kb_err_set(eb, KB_ERR_UNSUPPORTED, "built without MPI");
}

#endif
