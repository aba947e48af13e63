/*
 * loadgen: a small memcache-dialect load generator for Lanner's perf suite.
 *
 * Why C: a plain Python client spends ~35 us of CPU per 1 KiB set on the 2-core
 * box, more than the server under test.  This program drives N connections from
 * one epoll loop, so one process can saturate a server while using a fraction
 * of one core, and it reports its own CPU (getrusage) so readers can judge.
 *
 * Model.  Every connection has a role:
 *   producer  only sets; the total --sets is split evenly between producers;
 *   consumer  only gets; --gets is split evenly between consumers, or, with
 *             --until-hits, is a shared budget of items to read (misses retry);
 *   mixed     interleaves sets and gets (darner's `db`): each op is a get with
 *             probability gets/(gets+sets) (or --get-ratio in duration mode),
 *             spread evenly by an accumulator, drawn from shared budgets.
 * A connection writes up to --depth requests in one writev ("rollup" in Kestrel's
 * load tests), waits for all of their responses, then writes the next batch:
 * closed loop when depth is 1.  Latency of a response is measured from the
 * write of its batch.  The run ends when every budget is spent (count mode),
 * when --duration has passed or SIGTERM arrives (no new batch starts after
 * either; replies still owed are awaited for --stop-grace seconds, default 5),
 * at --timeout, or when no reply at all has come for --stall seconds (default
 * 30; blocking gets answer within their t=).  Replies never sent count as errors.
 *
 * Payload checks (--verify, queue servers only): a set's value starts with
 * 16 hex digits "PPPPPPPPSSSSSSSS" (producer id, sequence number) followed by a
 * fixed pattern shifted by seq % 61, so a consumer can tell a torn, shifted or
 * foreign payload from a good one.  A bitmap per expected producer catches
 * duplicates; the last sequence seen per (consumer, producer) catches
 * reordering (a FIFO serves each producer's items in order to every consumer;
 * --strict-order additionally demands consecutive numbers, for one consumer).
 *
 * Output: one JSON object on stdout (counts, throughput, latency percentiles
 * for all/set/get, sparse histograms for merging runs, client CPU).  With
 * --progress, "progress <responses> <hits>" lines go to stderr every 250 ms.
 *
 * Pauses (--pause-after N1,N2,...; perf/servegrind.py): the run's requests are issued in
 * phases of these sizes (what is left after them is one last phase).  When a phase's
 * requests are all answered, every connection is idle and stays open: "paused <responses>"
 * goes to stderr and the run waits for a line on stdin before the next phase.  So a tool
 * can read the server's counters between two exact request counts, on the same connections.
 *
 * Build: gcc -O2 -o loadgen loadgen.c   (perf/loadgen.py does this on first use)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define OP_SET 1
#define OP_GET 2
#define OP_CLOSE 3

#define ROLE_PRODUCER 0
#define ROLE_CONSUMER 1
#define ROLE_MIXED 2

#define ST_ACTIVE 0
#define ST_CLOSING 1
#define ST_DONE 2
#define ST_DEAD 3

#define HDR_MAX 320
#define PREFIX 16
#define SHIFT 61

/* ---------- histogram: exact below 1024 us, then 512 sub-buckets per power of two ---------- */

#define H_EXACT 1024
#define H_SUB 512
#define H_MAXEXP 40
#define H_BUCKETS (H_EXACT + (H_MAXEXP - 10 + 1) * H_SUB)

typedef struct {
    uint64_t b[H_BUCKETS];
    uint64_t n;
    double sum;
    uint64_t min, max;
} hist_t;

static int h_index(uint64_t v) {
    if (v < H_EXACT) return (int)v;
    int e = 63 - __builtin_clzll(v);
    if (e > H_MAXEXP) { e = H_MAXEXP; v = (1ULL << (H_MAXEXP + 1)) - 1; }
    int sub = (int)((v >> (e - 9)) & (H_SUB - 1));
    return H_EXACT + (e - 10) * H_SUB + sub;
}

static uint64_t h_lower(int i) {
    if (i < H_EXACT) return (uint64_t)i;
    int e = (i - H_EXACT) / H_SUB + 10;
    int sub = (i - H_EXACT) % H_SUB;
    return (1ULL << e) + ((uint64_t)sub << (e - 9));
}

static void h_add(hist_t *h, uint64_t v) {
    h->b[h_index(v)]++;
    if (h->n == 0 || v < h->min) h->min = v;
    if (v > h->max) h->max = v;
    h->n++;
    h->sum += (double)v;
}

static uint64_t h_pct(const hist_t *h, double p) {
    if (h->n == 0) return 0;
    /* nearest rank: the smallest value with at least p*n values at or below it */
    double want = p * (double)h->n - 1e-9;
    uint64_t rank = (uint64_t)want;
    if ((double)rank < want) rank++;
    rank = rank > 0 ? rank - 1 : 0;
    if (rank >= h->n) rank = h->n - 1;
    uint64_t seen = 0;
    for (int i = 0; i < H_BUCKETS; i++) {
        seen += h->b[i];
        if (seen > rank) {
            uint64_t lo = h_lower(i);
            return lo > h->max ? h->max : lo;
        }
    }
    return h->max;
}

/* ---------- options and global state ---------- */

static const char *o_host = "127.0.0.1";
static const char *o_port = "22133";
static int o_producers = 0, o_consumers = 0, o_mixed = 0;
static long long o_sets = -1, o_gets = -1; /* -1: unlimited (duration mode) */
static double o_get_ratio = 0.5;
static double o_duration = 0, o_timeout = 0;
static int o_depth = 1;
static long long o_value_size = 64;
static const char *o_queue = "spam";
static int o_queues = 1;
static const char *o_get_suffix = "";
static int o_until_hits = 0, o_verify = 0, o_strict = 0, o_progress = 0;
static int o_producer_base = 0;
static long long o_seq_base = 0, o_expect_seq_base = 0, o_expect_count = 0;
static int o_expect_producers = 0;
static int o_connect_retries = 50;
static double o_stop_grace = 5.0;
static double o_stall = 30.0;
#define MAX_PAUSES 64
static long long o_pause[MAX_PAUSES];
static int o_npause = 0;

static long long g_sets_left = -1, g_gets_left = -1;
static long long g_phase_left = -1;   /* requests left in this phase (-1: no pauses left) */
static int g_pause_i = 0, g_parked = 0;
static volatile sig_atomic_t g_stop = 0;
static int g_timed_out = 0;
static uint64_t g_start_ns, g_last_reply_ns;

static struct {
    uint64_t sets, stored, not_stored, gets, hits, misses, errors, closes;
    uint64_t bytes_out, bytes_in, connect_failures;
    uint64_t checked, bad_payload, duplicates, out_of_order, unexpected;
} st;
static char g_first_error[256] = "";
static hist_t h_set, h_get;

static char *g_pattern;       /* fill pattern, value_size + SHIFT bytes */
static uint8_t **g_seen;      /* one bitmap per expected producer */

typedef struct {
    int fd, role, index, state, qlen, producer;
    char queue[256];
    long long quota, seq;
    double acc;
    uint8_t *pend; int pend_head, pend_n;
    uint64_t batch_ns;
    struct iovec *iov; int iov_n, iov_i;
    char *arena; size_t arena_used;
    int want_out;
    char *in; size_t in_len, in_cap;
    long long *last_seq;
    int parked;                /* idle at the end of a phase (--pause-after) */
} conn_t;

static conn_t *g_conns;
static int g_nconns, g_active, g_ep;

/* SIGTERM/SIGINT end the run like --duration does: no new batches, outstanding replies are read. */
static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static void note_error(const char *fmt, const char *detail, int len) {
    st.errors++;
    if (g_first_error[0] == 0) {
        snprintf(g_first_error, sizeof g_first_error, fmt, len, detail);
        for (char *p = g_first_error; *p; p++)
            if (*p == '"' || *p == '\\' || (unsigned char)*p < 0x20) *p = '?';
    }
}

static void die(const char *msg) {
    printf("{\"error\": \"%s\"}\n", msg);
    fflush(stdout);
    exit(3);
}

/* ---------- connection setup ---------- */

static int open_conn(void) {
    struct addrinfo hints = {0}, *res, *ai;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(o_host, o_port, &hints, &res);
    if (rc != 0) return -1;
    int fd = -1;
    for (ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
        if (fd < 0) continue;
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) break;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) return -1;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    return fd;
}

static void conn_init(conn_t *c, int role, int index, int ordinal) {
    memset(c, 0, sizeof *c);
    c->role = role;
    c->index = index;
    int q = o_queues > 1 ? index % o_queues : -1;
    if (q >= 0) c->qlen = snprintf(c->queue, sizeof c->queue, "%s%d", o_queue, q);
    else c->qlen = snprintf(c->queue, sizeof c->queue, "%s", o_queue);
    c->producer = o_producer_base + (role == ROLE_MIXED ? o_producers + index : index);
    c->seq = o_seq_base;
    c->acc = 0.5;
    c->quota = o_duration > 0 ? -1 : 0;
    if (role == ROLE_PRODUCER && o_sets >= 0)
        c->quota = o_sets / o_producers + (index < o_sets % o_producers ? 1 : 0);
    if (role == ROLE_CONSUMER && o_gets >= 0)
        c->quota = o_gets / o_consumers + (index < o_gets % o_consumers ? 1 : 0);
    c->pend = calloc((size_t)o_depth + 1, 1);
    c->iov = calloc((size_t)o_depth * 3 + 4, sizeof(struct iovec));
    c->arena = malloc((size_t)(o_depth + 1) * HDR_MAX);
    c->in_cap = 16384;
    c->in = malloc(c->in_cap);
    if (o_verify && role != ROLE_PRODUCER && o_expect_producers > 0) {
        c->last_seq = malloc(sizeof(long long) * (size_t)o_expect_producers);
        for (int i = 0; i < o_expect_producers; i++) c->last_seq[i] = -1;
    }
    int tries = 0;
    for (;;) {
        c->fd = open_conn();
        if (c->fd >= 0) break;
        st.connect_failures++;
        if (++tries > o_connect_retries) {
            char msg[512];
            snprintf(msg, sizeof msg, "cannot connect to %s:%s (connection %d): %s", o_host, o_port,
                     ordinal, strerror(errno));
            for (char *p = msg; *p; p++) if (*p == '"' || *p == '\\') *p = '?';
            die(msg);
        }
        struct timespec ts = {0, 20 * 1000000};
        nanosleep(&ts, NULL);
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
    epoll_ctl(g_ep, EPOLL_CTL_ADD, c->fd, &ev);
}

/* ---------- requests ---------- */

static int next_op(conn_t *c) {
    if (c->role == ROLE_PRODUCER) {
        if (c->quota == 0) return 0;
        if (c->quota > 0) c->quota--;
        return OP_SET;
    }
    if (c->role == ROLE_CONSUMER) {
        if (!o_until_hits) {
            if (c->quota == 0) return 0;
            if (c->quota > 0) c->quota--;
            return OP_GET;
        }
        if (g_gets_left == 0) return 0;
        if (g_gets_left > 0) g_gets_left--;
        return OP_GET;
    }
    int want_get;
    c->acc += o_get_ratio;
    if (c->acc >= 1.0) { c->acc -= 1.0; want_get = 1; } else want_get = 0;
    if (want_get && g_gets_left == 0) want_get = 0;
    if (!want_get && g_sets_left == 0) {
        if (g_gets_left == 0) return 0;
        want_get = 1;
    }
    if (want_get) { if (g_gets_left > 0) g_gets_left--; return OP_GET; }
    if (g_sets_left > 0) g_sets_left--;
    return OP_SET;
}

static void push_iov(conn_t *c, const void *p, size_t n) {
    c->iov[c->iov_n].iov_base = (void *)p;
    c->iov[c->iov_n].iov_len = n;
    c->iov_n++;
}

static void pend_push(conn_t *c, int op) {
    c->pend[(c->pend_head + c->pend_n) % (o_depth + 1)] = (uint8_t)op;
    c->pend_n++;
}

static void add_request(conn_t *c, int op) {
    char *h = c->arena + c->arena_used;
    int n;
    if (op == OP_SET) {
        n = snprintf(h, HDR_MAX, "set %s 0 0 %lld\r\n", c->queue, o_value_size);
        if (o_verify) {
            n += snprintf(h + n, HDR_MAX - n, "%08x%08llx", (unsigned)c->producer,
                          (unsigned long long)c->seq);
            push_iov(c, h, (size_t)n);
            push_iov(c, g_pattern + PREFIX + c->seq % SHIFT, (size_t)(o_value_size - PREFIX));
        } else {
            push_iov(c, h, (size_t)n);
            push_iov(c, g_pattern, (size_t)o_value_size);
        }
        push_iov(c, "\r\n", 2);
        c->seq++;
        st.sets++;
    } else if (op == OP_GET) {
        n = snprintf(h, HDR_MAX, "get %s%s\r\n", c->queue, o_get_suffix);
        push_iov(c, h, (size_t)n);
        st.gets++;
    } else {
        n = snprintf(h, HDR_MAX, "get %s/close\r\n", c->queue);
        push_iov(c, h, (size_t)n);
    }
    c->arena_used += (size_t)n;
    pend_push(c, op);
}

static void conn_kill(conn_t *c, int st_new) {
    if (c->state == ST_DONE || c->state == ST_DEAD) return;
    epoll_ctl(g_ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    c->state = st_new;
    g_active--;
}

static void flush_out(conn_t *c) {
    while (c->iov_i < c->iov_n) {
        int cnt = c->iov_n - c->iov_i;
        if (cnt > IOV_MAX) cnt = IOV_MAX;
        ssize_t w = writev(c->fd, c->iov + c->iov_i, cnt);
        if (w < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            if (errno == EINTR) continue;
            note_error("write failed: %.*s", strerror(errno), 200);
            conn_kill(c, ST_DEAD);
            return;
        }
        st.bytes_out += (uint64_t)w;
        while (w > 0 && c->iov_i < c->iov_n) {
            struct iovec *v = &c->iov[c->iov_i];
            if ((size_t)w >= v->iov_len) { w -= (ssize_t)v->iov_len; c->iov_i++; }
            else { v->iov_base = (char *)v->iov_base + w; v->iov_len -= (size_t)w; w = 0; }
        }
    }
    int want = c->iov_i < c->iov_n;
    if (want != c->want_out) {
        struct epoll_event ev = {.events = EPOLLIN | (want ? EPOLLOUT : 0), .data.ptr = c};
        epoll_ctl(g_ep, EPOLL_CTL_MOD, c->fd, &ev);
        c->want_out = want;
    }
}

static int wants_close(const conn_t *c) {
    return c->role != ROLE_PRODUCER && strstr(o_get_suffix, "open") != NULL;
}

static void issue_batch(conn_t *c) {
    c->iov_n = c->iov_i = 0;
    c->arena_used = 0;
    int n = 0;
    if (c->state == ST_ACTIVE && !g_stop) {
        while (n < o_depth && g_phase_left != 0) {
            int op = next_op(c);
            if (!op) break;
            add_request(c, op);
            n++;
            if (g_phase_left > 0) g_phase_left--;
        }
    }
    if (n == 0 && g_phase_left == 0 && c->state == ST_ACTIVE && !g_stop) {
        c->parked = 1;         /* the phase is spent: wait for the pause to end */
        g_parked++;
        return;
    }
    if (n == 0) {
        if (c->state == ST_ACTIVE && wants_close(c) && !g_timed_out) {
            c->state = ST_CLOSING;
            add_request(c, OP_CLOSE);
        } else {
            conn_kill(c, ST_DONE);
            return;
        }
    }
    c->batch_ns = now_ns();
    flush_out(c);
}

/* ---------- responses ---------- */

static int hexval(const char *p, int n, unsigned long long *out) {
    unsigned long long v = 0;
    for (int i = 0; i < n; i++) {
        char ch = p[i];
        int d;
        if (ch >= '0' && ch <= '9') d = ch - '0';
        else if (ch >= 'a' && ch <= 'f') d = ch - 'a' + 10;
        else return -1;
        v = v * 16 + (unsigned)d;
    }
    *out = v;
    return 0;
}

static void check_payload(conn_t *c, const char *data, long long len) {
    st.checked++;
    unsigned long long pid, seq;
    if (len != o_value_size || hexval(data, 8, &pid) || hexval(data + 8, 8, &seq) ||
        memcmp(data + PREFIX, g_pattern + PREFIX + seq % SHIFT, (size_t)(len - PREFIX)) != 0) {
        st.bad_payload++;
        return;
    }
    long long rel = (long long)seq - o_expect_seq_base;
    if (pid < (unsigned)o_producer_base || pid - (unsigned)o_producer_base >= (unsigned)o_expect_producers ||
        rel < 0 || rel >= o_expect_count) {
        st.unexpected++;
        return;
    }
    int p = (int)(pid - (unsigned)o_producer_base);
    uint8_t *bm = g_seen[p];
    if (bm[rel >> 3] & (1u << (rel & 7))) st.duplicates++;
    bm[rel >> 3] |= (uint8_t)(1u << (rel & 7));
    long long last = c->last_seq[p];
    if (last >= 0 && (rel <= last || (o_strict && rel != last + 1))) st.out_of_order++;
    else if (last < 0 && o_strict && rel != 0) st.out_of_order++;
    c->last_seq[p] = rel;
}

/* Parses as many complete responses as the buffer holds; returns bytes used, -1 on a protocol error. */
static long parse(conn_t *c) {
    size_t pos = 0;
    uint64_t t = now_ns();
    g_last_reply_ns = t;
    uint64_t lat = (t - c->batch_ns) / 1000;
    while (c->pend_n > 0) {
        char *line = c->in + pos;
        size_t avail = c->in_len - pos;
        char *nl = memchr(line, '\n', avail);
        if (!nl) break;
        size_t llen = (size_t)(nl - line) + 1;
        int op = c->pend[c->pend_head];
        if (llen >= 6 && memcmp(line, "VALUE ", 6) == 0) {
            /* VALUE <key> <flags> <bytes>[ <cas>] : the length is the 4th token */
            char *p = line + 6;
            int tok = 1;
            long long n = -1;
            while (p < nl) {
                if (*p == ' ') {
                    tok++;
                    if (tok == 3) n = strtoll(p + 1, NULL, 10);
                }
                p++;
            }
            if (n < 0) { note_error("bad VALUE line: %.*s", line, (int)(llen < 80 ? llen : 80)); return -1; }
            size_t need = llen + (size_t)n + 2 + 5;
            if (avail < need) {
                if (need > c->in_cap) {
                    size_t cap = c->in_cap;
                    while (cap < need + pos) cap *= 2;
                    if (pos > 0) { memmove(c->in, c->in + pos, c->in_len - pos); c->in_len -= pos; pos = 0; }
                    c->in = realloc(c->in, cap);
                    c->in_cap = cap;
                }
                break;
            }
            if (memcmp(line + llen + n + 2, "END\r\n", 5) != 0) {
                note_error("VALUE block not followed by END: %.*s", line, (int)(llen < 80 ? llen : 80));
                return -1;
            }
            if (op != OP_GET) {
                note_error("item where a set reply was expected: %.*s", line, (int)(llen < 80 ? llen : 80));
                return -1;
            }
            st.hits++;
            if (o_verify && c->last_seq) check_payload(c, line + llen, n);
            h_add(&h_get, lat);
            pos += need;
        } else if (llen == 5 && memcmp(line, "END\r\n", 5) == 0) {
            if (op == OP_GET) {
                st.misses++;
                if (o_until_hits && g_gets_left >= 0) g_gets_left++;
                h_add(&h_get, lat);
            } else if (op == OP_CLOSE) {
                st.closes++;
            } else { note_error("END where a set reply was expected%.*s", "", 0); return -1; }
            pos += llen;
        } else if (llen == 8 && memcmp(line, "STORED\r\n", 8) == 0 && op == OP_SET) {
            st.stored++;
            h_add(&h_set, lat);
            pos += llen;
        } else if (llen == 12 && memcmp(line, "NOT_STORED\r\n", 12) == 0 && op == OP_SET) {
            st.not_stored++;
            h_add(&h_set, lat);
            pos += llen;
        } else {
            int n = (int)(llen > 2 ? llen - 2 : llen);
            note_error("server answered: %.*s", line, n > 120 ? 120 : n);
            return -1;
        }
        c->pend_head = (c->pend_head + 1) % (o_depth + 1);
        c->pend_n--;
    }
    return (long)pos;
}

static void on_readable(conn_t *c) {
    for (;;) {
        if (c->in_len == c->in_cap) {
            c->in_cap *= 2;
            c->in = realloc(c->in, c->in_cap);
        }
        ssize_t r = read(c->fd, c->in + c->in_len, c->in_cap - c->in_len);
        if (r < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            if (errno == EINTR) continue;
            note_error("read failed: %.*s", strerror(errno), 200);
            conn_kill(c, ST_DEAD);
            return;
        }
        if (r == 0) {
            if (c->pend_n > 0) note_error("connection closed by the server %.*s", "", 0);
            conn_kill(c, c->pend_n > 0 ? ST_DEAD : ST_DONE);
            return;
        }
        st.bytes_in += (uint64_t)r;
        c->in_len += (size_t)r;
        if ((size_t)r < c->in_cap - (c->in_len - (size_t)r)) break;
    }
    long used = parse(c);
    if (used < 0) { conn_kill(c, ST_DEAD); return; }
    if (used > 0) {
        memmove(c->in, c->in + used, c->in_len - (size_t)used);
        c->in_len -= (size_t)used;
    }
    if (c->pend_n == 0) {
        if (c->state == ST_CLOSING) conn_kill(c, ST_DONE);
        else issue_batch(c);
    }
}

/* ---------- output ---------- */

/* Every connection is idle at the end of a phase: say so, wait for a line on stdin, go on. */
static void pause_here(void) {
    fprintf(stderr, "paused %llu\n", (unsigned long long)(h_set.n + h_get.n));
    fflush(stderr);
    char line[64];
    if (!fgets(line, sizeof line, stdin)) g_stop = 1;      /* nobody to resume us: end the run */
    g_pause_i++;
    g_phase_left = g_pause_i < o_npause ? o_pause[g_pause_i] : -1;
    g_parked = 0;
    g_last_reply_ns = now_ns();                             /* a pause is not a stall */
    for (int i = 0; i < g_nconns; i++)
        if (g_conns[i].parked) {
            g_conns[i].parked = 0;
            issue_batch(&g_conns[i]);
        }
}

static void print_pcts(const char *name, const hist_t *h) {
    printf("\"%s\": {\"n\": %llu, \"min\": %llu, \"mean\": %.1f, \"p50\": %llu, \"p75\": %llu, \"p90\": %llu, "
           "\"p95\": %llu, \"p99\": %llu, \"p999\": %llu, \"p9999\": %llu, \"max\": %llu}",
           name, (unsigned long long)h->n, (unsigned long long)h->min, h->n ? h->sum / (double)h->n : 0.0,
           (unsigned long long)h_pct(h, 0.5), (unsigned long long)h_pct(h, 0.75),
           (unsigned long long)h_pct(h, 0.9), (unsigned long long)h_pct(h, 0.95),
           (unsigned long long)h_pct(h, 0.99), (unsigned long long)h_pct(h, 0.999),
           (unsigned long long)h_pct(h, 0.9999), (unsigned long long)h->max);
}

static void print_sparse(const char *name, const hist_t *h) {
    printf("\"%s\": [", name);
    int first = 1;
    for (int i = 0; i < H_BUCKETS; i++) {
        if (!h->b[i]) continue;
        printf("%s[%llu, %llu]", first ? "" : ", ", (unsigned long long)h_lower(i), (unsigned long long)h->b[i]);
        first = 0;
    }
    printf("]");
}

static double tv_s(struct timeval tv) { return (double)tv.tv_sec + (double)tv.tv_usec / 1e6; }

/* ---------- main ---------- */

static void usage(void) {
    fprintf(stderr,
        "usage: loadgen [--host H] [--port P] [--producers N] [--consumers N] [--conns N]\n"
        "  [--sets N] [--gets N] [--get-ratio F] [--duration S] [--timeout S] [--depth D]\n"
        "  [--value-size B] [--queue NAME] [--queues Q] [--get-suffix STR] [--until-hits]\n"
        "  [--verify --expect-producers P --expect-count N [--expect-seq-base N] [--strict-order]]\n"
        "  [--producer-base N] [--seq-base N] [--connect-retries N] [--stop-grace S]\n"
        "  [--stall S] [--progress] [--pause-after N1,N2,...]\n");
    exit(2);
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
#define ARG (i + 1 < argc ? argv[++i] : (usage(), ""))
        if (!strcmp(a, "--host")) o_host = ARG;
        else if (!strcmp(a, "--port")) o_port = ARG;
        else if (!strcmp(a, "--producers")) o_producers = atoi(ARG);
        else if (!strcmp(a, "--consumers")) o_consumers = atoi(ARG);
        else if (!strcmp(a, "--conns")) o_mixed = atoi(ARG);
        else if (!strcmp(a, "--sets")) o_sets = atoll(ARG);
        else if (!strcmp(a, "--gets")) o_gets = atoll(ARG);
        else if (!strcmp(a, "--get-ratio")) o_get_ratio = atof(ARG);
        else if (!strcmp(a, "--duration")) o_duration = atof(ARG);
        else if (!strcmp(a, "--timeout")) o_timeout = atof(ARG);
        else if (!strcmp(a, "--depth")) o_depth = atoi(ARG);
        else if (!strcmp(a, "--value-size")) o_value_size = atoll(ARG);
        else if (!strcmp(a, "--queue")) o_queue = ARG;
        else if (!strcmp(a, "--queues")) o_queues = atoi(ARG);
        else if (!strcmp(a, "--get-suffix")) o_get_suffix = ARG;
        else if (!strcmp(a, "--until-hits")) o_until_hits = 1;
        else if (!strcmp(a, "--verify")) o_verify = 1;
        else if (!strcmp(a, "--strict-order")) o_strict = 1;
        else if (!strcmp(a, "--expect-producers")) o_expect_producers = atoi(ARG);
        else if (!strcmp(a, "--expect-count")) o_expect_count = atoll(ARG);
        else if (!strcmp(a, "--expect-seq-base")) o_expect_seq_base = atoll(ARG);
        else if (!strcmp(a, "--producer-base")) o_producer_base = atoi(ARG);
        else if (!strcmp(a, "--seq-base")) o_seq_base = atoll(ARG);
        else if (!strcmp(a, "--connect-retries")) o_connect_retries = atoi(ARG);
        else if (!strcmp(a, "--stop-grace")) o_stop_grace = atof(ARG);
        else if (!strcmp(a, "--stall")) o_stall = atof(ARG);
        else if (!strcmp(a, "--progress")) o_progress = 1;
        else if (!strcmp(a, "--pause-after")) {
            char *list = strdup(ARG), *save = NULL;
            for (char *t = strtok_r(list, ",", &save); t && o_npause < MAX_PAUSES; t = strtok_r(NULL, ",", &save))
                o_pause[o_npause++] = atoll(t);
            free(list);
        }
        else usage();
#undef ARG
    }
    if (o_depth < 1 || o_queues < 1 || o_value_size < 0 || strlen(o_queue) > 200 || strlen(o_get_suffix) > 60)
        die("bad option value (depth >= 1, queues >= 1, value-size >= 0, queue <= 200 chars, get-suffix <= 60 chars)");
    if (o_producers + o_consumers + o_mixed <= 0) die("no connections: give --producers, --consumers or --conns");
    if (o_verify && o_value_size < PREFIX) die("--verify needs --value-size >= 16");
    if (o_sets < 0 && o_gets < 0 && o_duration <= 0) die("give --sets/--gets counts or a --duration");
    if (o_mixed > 0 && o_sets >= 0 && o_gets >= 0 && o_sets + o_gets > 0)
        o_get_ratio = (double)o_gets / (double)(o_sets + o_gets);
    g_sets_left = o_sets;
    g_gets_left = o_gets;
    if (o_duration > 0 && o_sets < 0 && o_producers == 0 && o_mixed == 0) g_sets_left = 0;
    if (o_sets < 0 && o_duration <= 0) g_sets_left = 0;
    if (o_gets < 0 && o_duration <= 0) g_gets_left = 0;
    if (o_npause) g_phase_left = o_pause[0];

    signal(SIGPIPE, SIG_IGN);
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }

    g_pattern = malloc((size_t)o_value_size + SHIFT + PREFIX + 1);
    static const char alpha[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    for (long long i = 0; i < o_value_size + SHIFT + PREFIX; i++) g_pattern[i] = alpha[i % 62];
    if (o_verify && o_expect_producers > 0) {
        g_seen = calloc((size_t)o_expect_producers, sizeof(uint8_t *));
        for (int i = 0; i < o_expect_producers; i++) g_seen[i] = calloc((size_t)(o_expect_count / 8 + 1), 1);
    }

    g_ep = epoll_create1(0);
    g_nconns = o_producers + o_consumers + o_mixed;
    g_conns = calloc((size_t)g_nconns, sizeof(conn_t));
    int k = 0;
    for (int i = 0; i < o_producers; i++, k++) conn_init(&g_conns[k], ROLE_PRODUCER, i, k);
    for (int i = 0; i < o_consumers; i++, k++) conn_init(&g_conns[k], ROLE_CONSUMER, i, k);
    for (int i = 0; i < o_mixed; i++, k++) conn_init(&g_conns[k], ROLE_MIXED, i, k);
    g_active = g_nconns;

    struct rusage ru0, ru1;
    getrusage(RUSAGE_SELF, &ru0);
    g_start_ns = g_last_reply_ns = now_ns();
    for (int i = 0; i < g_nconns; i++) issue_batch(&g_conns[i]);

    struct epoll_event evs[512];
    uint64_t next_progress = g_start_ns + 250000000ULL;
    uint64_t deadline = o_duration > 0 ? g_start_ns + (uint64_t)(o_duration * 1e9) : 0;
    uint64_t hard = o_timeout > 0 ? g_start_ns + (uint64_t)(o_timeout * 1e9) : 0;
    uint64_t stop_at = 0; /* once stopping (duration or SIGTERM): give up on replies after --stop-grace */
    while (g_active > 0) {
        int n = epoll_wait(g_ep, evs, 512, 50);
        for (int i = 0; i < n; i++) {
            conn_t *c = evs[i].data.ptr;
            if (c->state == ST_DONE || c->state == ST_DEAD) continue;
            if (evs[i].events & EPOLLOUT) flush_out(c);
            if (c->state == ST_DONE || c->state == ST_DEAD) continue;
            if (evs[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) on_readable(c);
        }
        if (g_parked && g_parked == g_active) pause_here();
        uint64_t t = now_ns();
        if (deadline && t >= deadline) g_stop = 1;
        if (g_stop && !stop_at) stop_at = t + (uint64_t)(o_stop_grace * 1e9);
        int stalled = o_stall > 0 && t - g_last_reply_ns > (uint64_t)(o_stall * 1e9);
        if ((hard && t >= hard) || (stop_at && t >= stop_at) || stalled) {
            /* the server owes replies it is not sending: report it, don't wait forever */
            g_stop = 1;
            g_timed_out = 1;
            for (int i = 0; i < g_nconns; i++) {
                conn_t *c = &g_conns[i];
                if (c->state != ST_DONE && c->state != ST_DEAD && c->pend_n > 0)
                    note_error("%.*s", "replies still owed at the deadline: the server stopped answering", 64);
                conn_kill(c, ST_DONE);
            }
        }
        if (o_progress && t >= next_progress) {
            fprintf(stderr, "progress %llu %llu\n", (unsigned long long)(h_set.n + h_get.n),
                    (unsigned long long)st.hits);
            next_progress = t + 250000000ULL;
        }
    }
    uint64_t end_ns = now_ns();
    getrusage(RUSAGE_SELF, &ru1);

    double elapsed = (double)(end_ns - g_start_ns) / 1e9;
    uint64_t ops = h_set.n + h_get.n;
    double cpu_user = tv_s(ru1.ru_utime) - tv_s(ru0.ru_utime);
    double cpu_sys = tv_s(ru1.ru_stime) - tv_s(ru0.ru_stime);
    hist_t all = h_set;
    for (int i = 0; i < H_BUCKETS; i++) all.b[i] += h_get.b[i];
    all.n += h_get.n;
    all.sum += h_get.sum;
    if (h_get.n && (h_get.min < all.min || h_set.n == 0)) all.min = h_get.min;
    if (h_get.max > all.max) all.max = h_get.max;

    long long distinct = 0;
    if (g_seen)
        for (int p = 0; p < o_expect_producers; p++)
            for (long long s = 0; s < o_expect_count; s++)
                if (g_seen[p][s >> 3] & (1u << (s & 7))) distinct++;

    printf("{\"ops\": %llu, \"elapsed_s\": %.6f, \"ops_per_s\": %.1f, \"items_per_s\": %.1f, ",
           (unsigned long long)ops, elapsed, elapsed > 0 ? (double)ops / elapsed : 0.0,
           elapsed > 0 ? (double)st.hits / elapsed : 0.0);
    printf("\"conns\": %d, \"depth\": %d, \"value_size\": %lld, \"sets\": %llu, \"stored\": %llu, "
           "\"not_stored\": %llu, \"gets\": %llu, \"hits\": %llu, \"misses\": %llu, \"closes\": %llu, "
           "\"errors\": %llu, \"first_error\": \"%s\", \"timed_out\": %s, \"connect_failures\": %llu, "
           "\"bytes_out\": %llu, \"bytes_in\": %llu, ",
           g_nconns, o_depth, o_value_size, (unsigned long long)st.sets, (unsigned long long)st.stored,
           (unsigned long long)st.not_stored, (unsigned long long)st.gets, (unsigned long long)st.hits,
           (unsigned long long)st.misses, (unsigned long long)st.closes, (unsigned long long)st.errors,
           g_first_error, g_timed_out ? "true" : "false", (unsigned long long)st.connect_failures,
           (unsigned long long)st.bytes_out, (unsigned long long)st.bytes_in);
    printf("\"cpu_user_s\": %.6f, \"cpu_sys_s\": %.6f, \"cpu_us_per_op\": %.3f, ", cpu_user, cpu_sys,
           ops ? (cpu_user + cpu_sys) * 1e6 / (double)ops : 0.0);
    printf("\"verify\": {\"enabled\": %s, \"checked\": %llu, \"bad_payload\": %llu, \"duplicates\": %llu, "
           "\"out_of_order\": %llu, \"unexpected\": %llu, \"distinct\": %lld}, ",
           o_verify ? "true" : "false", (unsigned long long)st.checked, (unsigned long long)st.bad_payload,
           (unsigned long long)st.duplicates, (unsigned long long)st.out_of_order,
           (unsigned long long)st.unexpected, distinct);
    print_pcts("latency_us", &all);
    printf(", ");
    print_pcts("set_latency_us", &h_set);
    printf(", ");
    print_pcts("get_latency_us", &h_get);
    printf(", ");
    print_sparse("hist_set", &h_set);
    printf(", ");
    print_sparse("hist_get", &h_get);
    printf("}\n");
    fflush(stdout);
    return 0;
}
