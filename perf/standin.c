/* standin: a one-queue memcache server in C with Lanner's syscalls and a chosen CPU cost per
 * request, to find how much user CPU per request a throughput target leaves (perf/README.md,
 * "What a target leaves for Python").
 *
 * Lanner's queue worker, serving one queue inline, spends per request the kernel's work (one
 * read, one write of the replies per connection and turn, one journal write and one epoll_wait
 * per turn) plus its own user-space work.  This server does the same syscalls in the same
 * shape on one thread, keeps a real FIFO (a get returns the oldest item, so `mixed`'s payload
 * checks could hold), appends each turn's sets to a journal file with one write, and spends
 * BURN_NS nanoseconds of its CPU per request in a loop in place of Python.  Run against
 * memcached with compare, BURN_NS=0 gives the ceiling of this shape and a sweep gives the user
 * CPU per request a ratio needs.
 *
 * usage: standin PORT BURN_NS JOURNAL_FILE
 * Speaks: set KEY FLAGS EXPTIME BYTES [noreply], get KEY (one key; a get's VALUE line echoes it),
 * version, quit.  Anything else: CLIENT_ERROR and close.  One queue: the key is not looked at.
 * Prints "standin ready PORT" once listening; SIGTERM/SIGINT exit 0.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_EVENTS 1024
#define IN_CAP (16 << 20)

typedef struct item { struct item *next; unsigned flags; size_t len; char data[]; } item;
typedef struct { int fd; char *in; size_t inlen; char *out; size_t outlen, outcap; } conn;

static item *head, *tail;
static long burn_ns;
static volatile sig_atomic_t stopping;
static char *jbuf; static size_t jlen, jcap;

static void on_signal(int sig) { (void)sig; stopping = 1; }

static void die(const char *what) { perror(what); exit(2); }

static void grow(char **buf, size_t *cap, size_t need) {
    if (need <= *cap) return;
    size_t n = *cap ? *cap : 4096;
    while (n < need) n *= 2;
    if (!(*buf = realloc(*buf, n))) die("realloc");
    *cap = n;
}

static void put(conn *c, const char *s, size_t n) {
    grow(&c->out, &c->outcap, c->outlen + n);
    memcpy(c->out + c->outlen, s, n);
    c->outlen += n;
}

/* Spin, as the interpreter would be busy, until this thread has had burn_ns more of CPU: the
 * figure the server's CPU per request is measured in.  A spin timed by the wall clock would
 * cost less CPU whenever the process is descheduled, and a fixed count of iterations more or
 * less CPU as a neighbour on the same core slows it; the CPU clock is read (a syscall) about
 * every microsecond. */
static unsigned long spins_per_check = 1000;
static volatile unsigned long sink;

static void spin(unsigned long n) {
    for (unsigned long i = 0; i < n; i++) sink += i;
}

static long cpu_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

static void calibrate(void) {
    long t0 = cpu_ns();
    spin(10000000);
    long took = cpu_ns() - t0;
    spins_per_check = took > 0 ? (unsigned long)(10000000.0 * 1000 / took) : 1000;
    if (spins_per_check < 1) spins_per_check = 1;
}

static void burn(void) {
    if (burn_ns <= 0) return;
    long end = cpu_ns() + burn_ns;
    while (cpu_ns() < end) spin(spins_per_check);
}

/* One request from c->in at *off; 0 if incomplete, -1 to close after the replies so far. */
static int request(conn *c, size_t *off) {
    char *line = c->in + *off;
    size_t left = c->inlen - *off;
    char *nl = memmem(line, left, "\r\n", 2);
    if (!nl) return left > 2048 ? (put(c, "CLIENT_ERROR line too long\r\n", 28), -1) : 0;
    size_t llen = (size_t)(nl - line) + 2;
    if (left >= 4 && memcmp(line, "set ", 4) == 0) {
        char key[256]; unsigned flags; long exptime; size_t bytes; char tailw[16] = "";
        char tmp[512];
        size_t l = llen - 2 < sizeof tmp - 1 ? llen - 2 : sizeof tmp - 1;
        memcpy(tmp, line, l); tmp[l] = 0;
        if (sscanf(tmp, "set %255s %u %ld %zu %15s", key, &flags, &exptime, &bytes, tailw) < 4 ||
            bytes > IN_CAP) {
            put(c, "CLIENT_ERROR bad set line\r\n", 27);
            return -1;
        }
        if (left < llen + bytes + 2) return 0;
        item *it = malloc(sizeof(item) + bytes);
        if (!it) die("malloc");
        it->next = NULL; it->flags = flags; it->len = bytes;
        memcpy(it->data, line + llen, bytes);
        if (tail) tail->next = it; else head = it;
        tail = it;
        grow(&jbuf, &jcap, jlen + bytes + 9);          /* a record per set: opcode, length, expiry, data */
        jbuf[jlen] = 2; memcpy(jbuf + jlen + 1, &bytes, 4); memset(jbuf + jlen + 5, 0, 4);
        memcpy(jbuf + jlen + 9, it->data, bytes);
        jlen += bytes + 9;
        *off += llen + bytes + 2;
        burn();
        if (strcmp(tailw, "noreply") != 0) put(c, "STORED\r\n", 8);
        return 1;
    }
    *off += llen;
    if (left >= 4 && memcmp(line, "get ", 4) == 0) {
        burn();
        item *it = head;
        if (it) {
            char hdr[400];
            int kl = (int)(llen - 6 < 256 ? llen - 6 : 256);
            int n = snprintf(hdr, sizeof hdr, "VALUE %.*s %u %zu\r\n", kl, line + 4, it->flags, it->len);
            put(c, hdr, (size_t)n);
            put(c, it->data, it->len);
            put(c, "\r\nEND\r\n", 7);
            head = it->next;
            if (!head) tail = NULL;
            free(it);
            grow(&jbuf, &jcap, jlen + 1);              /* and a byte per get that took one */
            jbuf[jlen++] = 3;
        } else {
            put(c, "END\r\n", 5);
        }
        return 1;
    }
    if (llen == 9 && memcmp(line, "version", 7) == 0) { put(c, "VERSION standin\r\n", 17); return 1; }
    if (llen == 6 && memcmp(line, "quit", 4) == 0) return -1;
    put(c, "CLIENT_ERROR unknown command\r\n", 30);
    return -1;
}

/* Write what is buffered; the clients are closed-loop or pipelined, so a short write only
 * happens under a backlog: then block on it (a benchmark server, not a production one). */
static int flush_out(conn *c) {
    size_t done = 0;
    while (done < c->outlen) {
        ssize_t w = write(c->fd, c->out + done, c->outlen - done);
        if (w < 0 && errno == EAGAIN) {
            fd_set ws; FD_ZERO(&ws); FD_SET(c->fd, &ws);
            select(c->fd + 1, NULL, &ws, NULL, NULL);
            continue;
        }
        if (w <= 0) return -1;
        done += (size_t)w;
    }
    c->outlen = 0;
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: standin PORT BURN_NS JOURNAL_FILE\n"); return 2; }
    int port = atoi(argv[1]);
    burn_ns = atol(argv[2]);
    int jfd = open(argv[3], O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (jfd < 0) die(argv[3]);
    if (burn_ns > 0) calibrate();
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 4096)) die("listen");
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
    printf("standin ready %d\n", port);
    fflush(stdout);

    struct epoll_event evs[MAX_EVENTS];
    conn *ready[MAX_EVENTS];
    while (!stopping) {
        int n = epoll_wait(ep, evs, MAX_EVENTS, -1);
        if (n < 0) { if (errno == EINTR) continue; die("epoll_wait"); }
        int nready = 0;
        for (int i = 0; i < n; i++) {
            conn *c = evs[i].data.ptr;
            if (!c) {
                int fd;
                while ((fd = accept4(ls, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
                    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    conn *nc = calloc(1, sizeof *nc);
                    nc->fd = fd;
                    nc->in = malloc(IN_CAP + 4096);
                    struct epoll_event e = {.events = EPOLLIN, .data.ptr = nc};
                    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e);
                }
                continue;
            }
            ssize_t r = read(c->fd, c->in + c->inlen, IN_CAP + 4096 - c->inlen);
            int close_it = r == 0 || (r < 0 && errno != EAGAIN);
            if (r > 0) {
                c->inlen += (size_t)r;
                size_t off = 0;
                int k = 0;
                while (off < c->inlen && (k = request(c, &off)) > 0) {}
                if (k < 0) close_it = 1;
                memmove(c->in, c->in + off, c->inlen - off);
                c->inlen -= off;
            }
            if (close_it) {
                flush_out(c);
                close(c->fd);               /* also leaves the epoll set */
                free(c->in); free(c->out); free(c);
                continue;
            }
            if (c->outlen) ready[nready++] = c;
        }
        /* the turn's end, as Lanner's: one journal write, then the replies */
        if (jlen) {
            if (write(jfd, jbuf, jlen) != (ssize_t)jlen) die("journal write");
            jlen = 0;
        }
        for (int i = 0; i < nready; i++)
            if (flush_out(ready[i]) < 0) ready[i]->outlen = 0;   /* the read will see the close */
    }
    return 0;
}
