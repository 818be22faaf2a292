/*
 * A wall clock that a test can move, for servers started by lockkit-testkit
 * (LD_PRELOAD). Adds the offset in milliseconds written in the file named by
 * LOCKKIT_CLOCK_OFFSET_FILE to CLOCK_REALTIME (and its coarse variant),
 * gettimeofday and time. Monotonic clocks are left alone: they are what a
 * server uses when it does not want wall-clock jumps.
 *
 * Every clock is read through the raw system call, never through libc or
 * the vDSO, and nothing here allocates: a server whose allocator reads the
 * clock while it initialises (jemalloc in redis-server) must not be called
 * back into. The offset is read again at most once a millisecond; the test
 * replaces the file atomically (rename), so a read sees one whole value.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static int64_t offset_ns;
static int64_t read_at_ns;

static int64_t read_offset_ns(void) {
    const char *path = getenv("LOCKKIT_CLOCK_OFFSET_FILE");
    if (path == NULL) {
        return 0;
    }
    long fd = syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return 0;
    }
    char text[32];
    long n = syscall(SYS_read, fd, text, sizeof text - 1);
    syscall(SYS_close, fd);
    if (n <= 0) {
        return 0;
    }
    int64_t ms = 0;
    int negative = 0;
    long i = 0;
    if (text[0] == '-') {
        negative = 1;
        i = 1;
    }
    for (; i < n && text[i] >= '0' && text[i] <= '9'; i++) {
        ms = ms * 10 + (text[i] - '0');
    }
    return (negative ? -ms : ms) * 1000000;
}

/* The offset, read again when the last read is a millisecond old (by the
 * unshifted clock `now_ns`). */
static int64_t current_offset_ns(int64_t now_ns) {
    int64_t at = __atomic_load_n(&read_at_ns, __ATOMIC_ACQUIRE);
    if (now_ns - at >= 1000000 || now_ns < at) {
        __atomic_store_n(&offset_ns, read_offset_ns(), __ATOMIC_RELAXED);
        __atomic_store_n(&read_at_ns, now_ns, __ATOMIC_RELEASE);
    }
    return __atomic_load_n(&offset_ns, __ATOMIC_RELAXED);
}

static void shift(struct timespec *ts) {
    int64_t now = (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec;
    int64_t shifted = now + current_offset_ns(now);
    ts->tv_sec = shifted / 1000000000;
    ts->tv_nsec = shifted % 1000000000;
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    long result = syscall(SYS_clock_gettime, clock, ts);
    if (result == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) {
        shift(ts);
    }
    return (int)result;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    (void)tz;
    struct timespec ts;
    long result = syscall(SYS_clock_gettime, CLOCK_REALTIME, &ts);
    if (result == 0) {
        shift(&ts);
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return (int)result;
}

time_t time(time_t *out) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) {
        return (time_t)-1;
    }
    if (out != NULL) {
        *out = ts.tv_sec;
    }
    return ts.tv_sec;
}
