/* The disk's ceiling for durable acknowledgements, with no server in the way (issue 8, P5).
 *
 * N closed-loop "clients" (threads) each append a 1 KiB record and wait until it is fdatasynced:
 *   shared  (default)  one file, and a committer thread fdatasyncing it back to back, each fdatasync
 *                      covering every record written before it started: the ideal group commit of
 *                      one queue's journal (put-many -Q 1);
 *   own                a file per client, each fdatasyncing its own (the filesystem merges
 *                      concurrent fdatasyncs into one journal commit): the -Q 10 analogue.
 * Prints acknowledged items/s (and, shared, fdatasyncs/s and items per fdatasync).
 * shared with GATHER and US: before each fdatasync the committer waits until GATHER records are
 * pending or US microseconds passed, the bound of a gathered group commit (the worker's syncer
 * gathers so, storage/syncer.py): on this disk 21.5-21.8k/s at 10 / 100-300 against 13-17k/s.
 *
 *   gcc -O2 -pthread -o fsync_ceiling perf/fsync_ceiling.c
 *   ./fsync_ceiling 10 3 shared DIR   # clients, seconds, mode, directory
 *   ./fsync_ceiling 10 3 shared DIR 10 200   # ... and gather 10 records or 200 us
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>
#include <time.h>

#define RECORD 1024
static const char *dir = ".";      /* the current directory, unless given */
static int shared_fd;
static long written, synced, items, fsyncs, own_counts[256];
static long gather = 1, delay_us = 0;    /* shared: wait for this many pending, at most this long */
static volatile int stop;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t more = PTHREAD_COND_INITIALIZER, done = PTHREAD_COND_INITIALIZER;

static void *shared_client(void *arg) {
    char buf[RECORD];
    memset(buf, 'x', sizeof buf);
    for (;;) {
        pthread_mutex_lock(&mu);
        if (stop) { pthread_mutex_unlock(&mu); return NULL; }
        if (write(shared_fd, buf, sizeof buf) != sizeof buf) abort();
        long mine = ++written;
        pthread_cond_signal(&more);
        while (synced < mine && !stop) pthread_cond_wait(&done, &mu);
        items++;
        pthread_mutex_unlock(&mu);
    }
}

static void *committer(void *arg) {
    for (;;) {
        pthread_mutex_lock(&mu);
        while (written == synced && !stop) pthread_cond_wait(&more, &mu);
        if (gather > 1 && delay_us > 0) {
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_nsec += delay_us * 1000L;
            if (until.tv_nsec >= 1000000000L) { until.tv_sec++; until.tv_nsec -= 1000000000L; }
            while (written - synced < gather && !stop)
                if (pthread_cond_timedwait(&more, &mu, &until)) break;
        }
        if (stop) { pthread_cond_broadcast(&done); pthread_mutex_unlock(&mu); return NULL; }
        long target = written;
        pthread_mutex_unlock(&mu);
        if (fdatasync(shared_fd)) abort();
        pthread_mutex_lock(&mu);
        synced = target;
        fsyncs++;
        pthread_cond_broadcast(&done);
        pthread_mutex_unlock(&mu);
    }
}

static void *own_client(void *arg) {
    long i = (long)arg;
    char path[4096], buf[RECORD];
    memset(buf, 'x', sizeof buf);
    snprintf(path, sizeof path, "%s/fsync_ceiling.%ld", dir, i);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
    if (fd < 0) abort();
    while (!stop) {
        if (write(fd, buf, sizeof buf) != sizeof buf || fdatasync(fd)) abort();
        own_counts[i]++;
    }
    close(fd);
    unlink(path);
    return NULL;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 10;
    double secs = argc > 2 ? atof(argv[2]) : 3;
    int own = argc > 3 && strcmp(argv[3], "own") == 0;
    if (argc > 4) dir = argv[4];
    if (argc > 5) gather = atol(argv[5]);
    if (argc > 6) delay_us = atol(argv[6]);
    if (n < 1 || n > 256) { fprintf(stderr, "1 to 256 clients\n"); return 2; }
    pthread_t t[256], c;
    char path[4096];
    snprintf(path, sizeof path, "%s/fsync_ceiling.shared", dir);
    if (!own) {
        shared_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
        if (shared_fd < 0) { perror(path); return 2; }
        pthread_create(&c, NULL, committer, NULL);
    }
    for (long i = 0; i < n; i++) pthread_create(&t[i], NULL, own ? own_client : shared_client, (void *)i);
    struct timespec ts = {(time_t)secs, (long)((secs - (long)secs) * 1e9)};
    nanosleep(&ts, NULL);
    pthread_mutex_lock(&mu);
    long total = items, commits = fsyncs;
    stop = 1;
    pthread_cond_broadcast(&more);
    pthread_cond_broadcast(&done);
    pthread_mutex_unlock(&mu);
    for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
    if (own) {
        for (int i = 0; i < n; i++) total += own_counts[i];
        printf("%d clients, a file each: %.0f acked items/s\n", n, total / secs);
    } else {
        pthread_join(c, NULL);
        close(shared_fd);
        unlink(path);
        printf("%d clients, one file: %.0f acked items/s, %.0f fdatasyncs/s, %.1f items per fdatasync\n",
               n, total / secs, commits / secs, commits ? (double)total / commits : 0.0);
    }
    return 0;
}
