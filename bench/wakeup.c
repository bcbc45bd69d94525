/* bench/wakeup.c: the candidate comparison behind the busy / after-idle
 * probes. Built and driven by bench/wakeup (which prints the table); run
 * alone it prints raw records.
 *
 *   wakeup DIR STATFILE ROUNDS LONE BURSTS BURST_LEN B2B_MS PAUSE_MS
 *
 * In DIR: wal.dat (16 MiB, written with zeros and fsynced) takes 8 KiB
 * pwrite + fdatasync "commits", cycling through its blocks like a recycled
 * WAL segment; read.dat (16 MiB, same) takes 8 KiB O_DIRECT reads. STATFILE
 * is the /sys/.../stat of the device holding DIR ("-": none). Candidates,
 * each ROUNDS times, the order reversed every other round:
 *
 *   b2b        commits back to back for B2B_MS
 *   idle       LONE lone commits, each after PAUSE_MS of idle
 *   burst      BURSTS bursts of BURST_LEN commits, each after PAUSE_MS
 *   spin       LONE lone commits after PAUSE_MS, a spinner thread pinned to
 *              each CPU spinning from 1 ms before the commit to its end, and
 *              the submitting thread spinning 1 ms before it
 *   spinburst  BURSTS bursts with the spinners running through the burst
 *   readwarm   LONE times: PAUSE_MS, 16 O_DIRECT reads, one commit
 *   flushwarm  LONE times: PAUSE_MS, 4 fdatasyncs with nothing dirty, one
 *              commit
 *
 * Output, one record a line:
 *   S cand round pos write_ns sync_ns        one commit (pos in its event)
 *   E cand round commits ios cpu_ns dev_writes dev_flushes elapsed_ns
 *                                            one event (a lone probe with
 *                                            its warmers, a burst, the b2b run)
 *   P cand round dev_writes dev_flushes elapsed_ns
 *                                            one pause before an event
 * cpu_ns: getrusage(RUSAGE_SELF) utime + stime over the event, all threads
 * (spinners included, each back asleep before it is read); dev_*: writes
 * and flushes completed on the device over the event (-1: unknown).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define BLOCK 8192
#define FILE_SIZE (16 << 20)
#define BLOCKS (FILE_SIZE / BLOCK)
#define READS_BEFORE 16
#define FLUSHES_BEFORE 4

static int wal_fd, read_fd;
static char *wbuf, *rbuf;
static long wal_block;
static const char *stat_path;
static long pause_ms;

static void die(const char *what) {
    fprintf(stderr, "wakeup: %s: %s\n", what, strerror(errno));
    exit(1);
}

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static int64_t cpu_ns(void) {
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return ((int64_t)r.ru_utime.tv_sec + r.ru_stime.tv_sec) * 1000000000 +
           ((int64_t)r.ru_utime.tv_usec + r.ru_stime.tv_usec) * 1000;
}

/* writes and flushes completed on the device (fields 5 and 16 of
 * Documentation/block/stat.rst), or -1. */
static void dev_stat(long long *writes, long long *flushes) {
    *writes = *flushes = -1;
    if (!stat_path || strcmp(stat_path, "-") == 0) return;
    FILE *f = fopen(stat_path, "r");
    if (!f) return;
    long long v[17];
    int n = 0;
    while (n < 17 && fscanf(f, "%lld", &v[n]) == 1) n++;
    fclose(f);
    if (n >= 5) *writes = v[4];
    if (n >= 16) *flushes = v[15];
}

static void prepare(const char *path, int *fd, int flags) {
    int f = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (f < 0) die(path);
    char *z = calloc(1, 1 << 20);
    for (int i = 0; i < FILE_SIZE / (1 << 20); i++)
        if (write(f, z, 1 << 20) != 1 << 20) die("write");
    free(z);
    if (fsync(f) != 0) die("fsync");
    close(f);
    *fd = open(path, flags);
    if (*fd < 0) die(path);
}

/* ---------------------------------------------------------------- spinners */

static int ncpu;
static atomic_int spin_on, spinning, quit;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;

static void *spinner(void *arg) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET((int)(intptr_t)arg, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) die("sched_setaffinity");
    for (;;) {
        pthread_mutex_lock(&mu);
        while (!atomic_load(&spin_on) && !atomic_load(&quit)) pthread_cond_wait(&cv, &mu);
        pthread_mutex_unlock(&mu);
        if (atomic_load(&quit)) return NULL;
        atomic_fetch_add(&spinning, 1);
        /* Keep the vCPU out of halt, but give way at once to the submitter
         * when it wakes on this CPU. */
        while (atomic_load(&spin_on)) {
            __builtin_ia32_pause();
            sched_yield();
        }
        atomic_fetch_sub(&spinning, 1);
    }
}

static void spin_start(void) {
    pthread_mutex_lock(&mu);
    atomic_store(&spin_on, 1);
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    /* 1 ms busy on the submitting CPU, while the spinners get going. */
    int64_t end = now_ns() + 1000000;
    while (now_ns() < end) __builtin_ia32_pause();
}

static void spin_stop(void) {
    atomic_store(&spin_on, 0);
    /* Wait until every spinner is back asleep, so its CPU time is in the
     * process's rusage when the caller reads it. */
    while (atomic_load(&spinning) > 0) sched_yield();
}

/* ---------------------------------------------------------------- probes */

/* Samples of the event in progress, printed after it (printing is not
 * part of the CPU measured). */
#define MAX_SAMPLES (1 << 20)
static struct { int pos; int64_t w, s; } samples[MAX_SAMPLES];
static int nsamples;

static void commit(int pos) {
    int64_t t0 = now_ns();
    if (pwrite(wal_fd, wbuf, BLOCK, (off_t)wal_block * BLOCK) != BLOCK) die("pwrite");
    int64_t t1 = now_ns();
    if (fdatasync(wal_fd) != 0) die("fdatasync");
    int64_t t2 = now_ns();
    wal_block = (wal_block + 1) % BLOCKS;
    if (nsamples < MAX_SAMPLES) {
        samples[nsamples].pos = pos;
        samples[nsamples].w = t1 - t0;
        samples[nsamples].s = t2 - t1;
        nsamples++;
    }
}

static unsigned long long rng = 88172645463325252ULL;
static void read_one(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    off_t off = (off_t)(rng % BLOCKS) * BLOCK;
    if (pread(read_fd, rbuf, BLOCK, off) != BLOCK) die("pread");
}

struct ev {
    int64_t t, cpu;
    long long w, f;
};

static void ev_begin(struct ev *e) {
    dev_stat(&e->w, &e->f);
    e->cpu = cpu_ns();
    e->t = now_ns();
}

static void ev_end(struct ev *e, const char *cand, int round, int commits, int ios) {
    int64_t t = now_ns(), c = cpu_ns();
    long long w, f;
    dev_stat(&w, &f);
    printf("E %s %d %d %d %lld %lld %lld %lld\n", cand, round, commits, ios, (long long)(c - e->cpu),
           (w < 0 || e->w < 0) ? -1 : w - e->w, (f < 0 || e->f < 0) ? -1 : f - e->f,
           (long long)(t - e->t));
    for (int i = 0; i < nsamples; i++)
        printf("S %s %d %d %lld %lld\n", cand, round, samples[i].pos, (long long)samples[i].w,
               (long long)samples[i].s);
    nsamples = 0;
}

/* The pause before each event; the device's writes meanwhile (nothing of
 * ours is in flight) are the background the driver subtracts. */
static const char *cur_cand = "";
static int cur_round;
static void pause_idle(void) {
    long long w0, f0, w1, f1;
    dev_stat(&w0, &f0);
    int64_t t0 = now_ns();
    usleep(pause_ms * 1000);
    int64_t t1 = now_ns();
    dev_stat(&w1, &f1);
    printf("P %s %d %lld %lld %lld\n", cur_cand, cur_round, (w1 < 0 || w0 < 0) ? -1 : w1 - w0,
           (f1 < 0 || f0 < 0) ? -1 : f1 - f0, (long long)(t1 - t0));
}

static void run_b2b(const char *cand, int round, long ms) {
    pause_idle();
    struct ev e;
    ev_begin(&e);
    int n = 0;
    while (now_ns() - e.t < ms * 1000000LL) commit(n++);
    ev_end(&e, cand, round, n, n);
}

/* A lone commit after a pause, with what goes before it. */
static void run_lone(const char *cand, int round, int n) {
    for (int i = 0; i < n; i++) {
        pause_idle();
        struct ev e;
        int spin = strcmp(cand, "spin") == 0;
        int ios = 1;
        ev_begin(&e);
        if (spin) spin_start();
        if (strcmp(cand, "readwarm") == 0) {
            for (int r = 0; r < READS_BEFORE; r++) read_one();
            ios += READS_BEFORE;
        } else if (strcmp(cand, "flushwarm") == 0) {
            for (int r = 0; r < FLUSHES_BEFORE; r++)
                if (fdatasync(wal_fd) != 0) die("fdatasync");
            ios += FLUSHES_BEFORE;
        }
        commit(0);
        if (spin) spin_stop();
        ev_end(&e, cand, round, 1, ios);
    }
}

static void run_bursts(const char *cand, int round, int n, int len) {
    int spin = strcmp(cand, "spinburst") == 0;
    for (int i = 0; i < n; i++) {
        pause_idle();
        struct ev e;
        ev_begin(&e);
        if (spin) spin_start();
        for (int p = 0; p < len; p++) commit(p);
        if (spin) spin_stop();
        ev_end(&e, cand, round, len, len);
    }
}

int main(int argc, char **argv) {
    if (argc != 9) {
        fprintf(stderr, "usage: wakeup DIR STATFILE ROUNDS LONE BURSTS BURST_LEN B2B_MS PAUSE_MS\n");
        return 2;
    }
    const char *dir = argv[1];
    stat_path = argv[2];
    int rounds = atoi(argv[3]), lone = atoi(argv[4]), bursts = atoi(argv[5]),
        burst_len = atoi(argv[6]);
    long b2b_ms = atol(argv[7]);
    pause_ms = atol(argv[8]);
    setvbuf(stdout, NULL, _IOFBF, 1 << 20);

    if (posix_memalign((void **)&wbuf, 4096, BLOCK) || posix_memalign((void **)&rbuf, 4096, BLOCK))
        die("posix_memalign");
    memset(wbuf, 0xa5, BLOCK);
    char path[4096];
    snprintf(path, sizeof path, "%s/wal.dat", dir);
    prepare(path, &wal_fd, O_RDWR);
    snprintf(path, sizeof path, "%s/read.dat", dir);
    prepare(path, &read_fd, O_RDONLY | O_DIRECT);

    ncpu = (int)sysconf(_SC_NPROCESSORS_ONLN);
    pthread_t th[256];
    if (ncpu > 256) ncpu = 256;
    for (int c = 0; c < ncpu; c++)
        if (pthread_create(&th[c], NULL, spinner, (void *)(intptr_t)c) != 0) die("pthread_create");

    const char *cands[] = {"b2b", "idle", "burst", "spin", "spinburst", "readwarm", "flushwarm"};
    int nc = sizeof cands / sizeof *cands;
    for (int r = 0; r < rounds; r++) {
        for (int k = 0; k < nc; k++) {
            const char *c = cands[r % 2 == 0 ? k : nc - 1 - k];
            fprintf(stderr, "  round %d/%d: %s\n", r + 1, rounds, c);
            cur_cand = c;
            cur_round = r;
            if (strcmp(c, "b2b") == 0)
                run_b2b(c, r, b2b_ms);
            else if (strcmp(c, "burst") == 0 || strcmp(c, "spinburst") == 0)
                run_bursts(c, r, bursts, burst_len);
            else
                run_lone(c, r, lone);
            fflush(stdout);
        }
    }
    pthread_mutex_lock(&mu);
    atomic_store(&quit, 1);
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    for (int c = 0; c < ncpu; c++) pthread_join(th[c], NULL);
    close(wal_fd);
    close(read_fd);
    return 0;
}
