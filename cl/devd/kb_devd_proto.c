/*
 * kb_devd_proto — what the device server (kb_devd.c) and its client (kb_remote.c) share
 * (kb_devd_proto.h): where servers' sockets live and the check of their folder, the socket,
 * and whole-message reads and writes, with a descriptor passed alongside.
 */
#include "kb_devd_proto.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

/* ------------------------------------------------------------------ paths and settings */

int kb_devd_dir(char *buf, size_t n, kb_errbuf *eb)
{
    const char *d = getenv("KBCL_DEVD_DIR"), *x = getenv("XDG_RUNTIME_DIR");
    int k;
    if (d && d[0])
        k = snprintf(buf, n, "%s", d);
    else if (x && x[0])
        k = snprintf(buf, n, "%s/kbcl", x);
    else
        k = snprintf(buf, n, "/tmp/kbcl-devd-%lu", (unsigned long)getuid());
    if (k < 0 || (size_t)k >= n)
        return kb_err_set(eb, KB_ERR_RANGE, "device server folder: path too long");
    return 0;
}

int kb_devd_socket_path(const char *device, char *buf, size_t n, kb_errbuf *eb)
{
    char dir[512];
    struct sockaddr_un sa;
    int rc, k;
    if ((rc = kb_devd_dir(dir, sizeof dir, eb)) != 0)
        return rc;
    k = snprintf(buf, n, "%s/%s.sock", dir, device);
    if (k < 0 || (size_t)k >= n || (size_t)k >= sizeof sa.sun_path)
        return kb_err_set(eb, KB_ERR_RANGE,
                          "device server socket %s/%s.sock: longer than %zu bytes (set "
                          "KBCL_DEVD_DIR to a shorter folder)",
                          dir, device, sizeof sa.sun_path - 1);
    return 0;
}

int kb_devd_enabled(void)
{
    const char *v = getenv("KBCL_DEVD");
    return !(v && (!strcmp(v, "off") || !strcmp(v, "0") || !strcmp(v, "no")));
}

/*
 * Whoever can enter the folder can connect to the socket (or put one of their own there), so
 * the folder is the first gate: the user's alone. The peer check on connect is the second.
 */
int kb_devd_dir_check(const char *path, int make, kb_errbuf *eb)
{
    char dir[600];
    const char *slash = strrchr(path, '/');
    struct stat st;

    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == path)
        snprintf(dir, sizeof dir, "/");
    else if ((size_t)(slash - path) < sizeof dir)
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    else
        return kb_err_set(eb, KB_ERR_RANGE, "device server socket %s: path too long", path);
    if (make && mkdir(dir, 0700) != 0 && errno != EEXIST && errno != ENOTDIR)
        return kb_err_set(eb, KB_ERR_IO, "device server folder %s: cannot make it: %s", dir,
                          strerror(errno));
    if (lstat(dir, &st) != 0) {
        if (errno == ENOENT)
            return kb_err_set(eb, KB_ERR_NOTFOUND, "no device server at %s (no folder %s)",
                              path, dir);
        return kb_err_set(eb, KB_ERR_IO, "device server %s: %s", path, strerror(errno));
    }
    if (S_ISLNK(st.st_mode))
        return kb_err_set(eb, KB_ERR_STATE,
                          "device server folder %s is a symbolic link, which another user may "
                          "have made or may repoint: set KBCL_DEVD_DIR to the folder itself",
                          dir);
    if (!S_ISDIR(st.st_mode))
        return kb_err_set(eb, KB_ERR_IO, "device server %s: %s", path, strerror(ENOTDIR));
    if (st.st_uid != geteuid())
        return kb_err_set(eb, KB_ERR_STATE,
                          "device server folder %s belongs to uid %lu, not to this user (uid "
                          "%lu): remove it, or set KBCL_DEVD_DIR to a folder of your own",
                          dir, (unsigned long)st.st_uid, (unsigned long)geteuid());
    if (st.st_mode & 077)
        return kb_err_set(eb, KB_ERR_STATE,
                          "device server folder %s is open to other users (mode %04o): "
                          "chmod 700 %s",
                          dir, (unsigned)(st.st_mode & 07777), dir);
    return 0;
}

/* ------------------------------------------------------------------ sockets */

int kb_devd_socket(const char *path, struct sockaddr_un *sa, kb_errbuf *eb)
{
    int fd;
    memset(sa, 0, sizeof *sa);
    sa->sun_family = AF_UNIX;
    if (strlen(path) >= sizeof sa->sun_path)
        return kb_err_set(eb, KB_ERR_RANGE, "device server socket %s: path too long", path);
    memcpy(sa->sun_path, path, strlen(path));
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return kb_err_set(eb, KB_ERR_IO, "socket: %s", strerror(errno));
    return fd;
}

/* Waits up to ms (< 0: as long as it takes) for fd to be readable: 0, or -1 when it was not. */
static int wait_in(int fd, int ms)
{
    struct pollfd p = { fd, POLLIN, 0 };
    int n;
    if (ms < 0)
        return 0;
    do
        n = poll(&p, 1, ms);
    while (n < 0 && errno == EINTR);
    return n > 0 ? 0 : -1;
}

/* Whole reads; each wait for more bytes lasts at most ms (< 0: no limit). 0; -1 the peer is
 * gone or the call failed; -2 it stalled. */
int kb_devd_read_timed(int fd, void *p, size_t n, int ms)
{
    size_t got = 0;
    while (got < n) {
        if (wait_in(fd, ms) != 0)
            return -2;
        ssize_t r = read(fd, (char *)p + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        got += (size_t)r;
    }
    return 0;
}

int kb_devd_read_full(int fd, void *p, size_t n)
{
    return kb_devd_read_timed(fd, p, n, -1) == 0 ? 0 : -1;
}

int kb_devd_write_full(int fd, const void *p, size_t n)
{
    size_t put = 0;
    while (put < n) {
        ssize_t w = send(fd, (const char *)p + put, n - put, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        put += (size_t)w;
    }
    return 0;
}

int kb_devd_send_fd(int fd, const void *p, size_t n, int passfd)
{
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    struct iovec iov = { (void *)p, n };
    struct msghdr mh;
    ssize_t w;

    if (passfd < 0)
        return kb_devd_write_full(fd, p, n);
    memset(&mh, 0, sizeof mh);
    memset(&ctl, 0, sizeof ctl);
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = ctl.buf;
    mh.msg_controllen = sizeof ctl.buf;
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &passfd, sizeof passfd);
    do
        w = sendmsg(fd, &mh, MSG_NOSIGNAL);
    while (w < 0 && errno == EINTR);
    if (w <= 0)
        return -1;
    /* the descriptor went with the first byte; the rest is plain data */
    return (size_t)w == n ? 0 : kb_devd_write_full(fd, (const char *)p + w, n - (size_t)w);
}

/*
 * n bytes that may carry a descriptor, the first wait at most first_ms, later ones rest_ms
 * (< 0: no limit). 0; -1 the peer is gone (*got_some says whether it sent a part); -2 stalled.
 */
int kb_devd_recv_fd_timed(int fd, void *p, size_t n, int *gotfd, int first_ms, int rest_ms,
                          int *got_some)
{
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    struct iovec iov = { p, n };
    struct msghdr mh;
    ssize_t r;
    int rc;

    if (gotfd)
        *gotfd = -1;
    *got_some = 0;
    if (wait_in(fd, first_ms) != 0)
        return -2;
    memset(&mh, 0, sizeof mh);
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = ctl.buf;
    mh.msg_controllen = sizeof ctl.buf;
    do
        r = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
    while (r < 0 && errno == EINTR);
    if (r <= 0)
        return -1;
    *got_some = 1;
    /* more descriptors than one do not fit ctl: the kernel closes those (MSG_CTRUNC) */
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
            c->cmsg_len >= CMSG_LEN(sizeof(int))) {
            int got;
            memcpy(&got, CMSG_DATA(c), sizeof got);
            if (gotfd && *gotfd < 0)
                *gotfd = got;
            else
                close(got);
        }
    if ((size_t)r < n &&
        (rc = kb_devd_read_timed(fd, (char *)p + r, n - (size_t)r, rest_ms)) != 0) {
        if (gotfd && *gotfd >= 0) {
            close(*gotfd);
            *gotfd = -1;
        }
        return rc;
    }
    return 0;
}

int kb_devd_recv_fd(int fd, void *p, size_t n, int *gotfd)
{
    int some;
    return kb_devd_recv_fd_timed(fd, p, n, gotfd, -1, -1, &some) == 0 ? 0 : -1;
}
