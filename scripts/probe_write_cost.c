/*
 * What buffered log writes cost the machine, by the way the bytes reach the file.
 *
 * Writes TOTAL_MIB in CHUNK-byte pieces at RATE MB/s into a 64 MiB file that was written once
 * before (as a recycled log segment is), fdatasyncs it once a second (as `everysec` does), and
 * prints the CPU time the whole machine was busy meanwhile (from /proc/stat: the kernel's
 * writeback included, whichever thread runs it). Modes:
 *   pwrite  one pwrite per chunk (what the log does, a pass's records per write)
 *   mmap    memcpy into a shared mapping of the file (no system call per chunk)
 *   memory  memcpy into a heap buffer (the copy alone: the floor)
 *
 *   gcc -O2 -o /tmp/probe_write_cost scripts/probe_write_cost.c
 *   /tmp/probe_write_cost pwrite 5000 1000 240 /tmp/probe-segment
 *
 * Bounded: it stops after TOTAL_MIB, and deletes its file. Run it on a quiet machine; compare
 * the modes side by side in one sitting.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define SEGMENT_BYTES ((size_t)64 << 20)
#define PACE_EVERY_CHUNKS 200

static double now_seconds(void) {
    struct timespec time;
    clock_gettime(CLOCK_MONOTONIC, &time);
    return (double)time.tv_sec + (double)time.tv_nsec * 1e-9;
}

/* Busy ticks of all CPUs (user, nice, system, irq, softirq, steal). */
static long long busy_ticks(void) {
    long long user, nice, system, idle, iowait, irq, softirq, steal;
    FILE *stat = fopen("/proc/stat", "r");
    if (stat == NULL || fscanf(stat, "cpu %lld %lld %lld %lld %lld %lld %lld %lld", &user, &nice, &system, &idle,
                               &iowait, &irq, &softirq, &steal) != 8) {
        fprintf(stderr, "cannot read /proc/stat\n");
        exit(1);
    }
    fclose(stat);
    return user + nice + system + irq + softirq + steal;
}

static void fail(const char *what) {
    perror(what);
    exit(1);
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s pwrite|mmap|memory CHUNK_BYTES TOTAL_MIB RATE_MB_S FILE\n", argv[0]);
        return 2;
    }
    const char *mode = argv[1];
    size_t chunk = (size_t)atol(argv[2]);
    long long total = atoll(argv[3]) << 20;
    double rate = atof(argv[4]);
    const char *path = argv[5];
    int by_pwrite = strcmp(mode, "pwrite") == 0, by_mmap = strcmp(mode, "mmap") == 0;
    int to_file = by_pwrite || by_mmap;
    if ((!to_file && strcmp(mode, "memory") != 0) || chunk == 0 || chunk > SEGMENT_BYTES / 2 ||
        total <= 0 || rate <= 0) {
        fprintf(stderr, "bad arguments\n");
        return 2;
    }
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) fail("open");
    char *piece = malloc(chunk), *scratch = calloc(1, 1 << 20), *heap = malloc(SEGMENT_BYTES);
    if (piece == NULL || scratch == NULL || heap == NULL) fail("malloc");
    memset(piece, 7, chunk);
    memset(heap, 0, SEGMENT_BYTES);
    for (size_t offset = 0; offset < SEGMENT_BYTES; offset += 1 << 20) {
        if (pwrite(fd, scratch, 1 << 20, (off_t)offset) != 1 << 20) fail("pwrite (preparing)");
    }
    if (fdatasync(fd) != 0) fail("fdatasync");
    char *map = NULL;
    if (by_mmap) {
        map = mmap(NULL, SEGMENT_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (map == MAP_FAILED) fail("mmap");
    }
    long long busy_before = busy_ticks();
    double started = now_seconds(), last_sync = started;
    size_t offset = 0;
    long long chunks = 0;
    for (long long done = 0; done < total; done += (long long)chunk, chunks++) {
        if (offset + chunk > SEGMENT_BYTES) offset = 0;
        piece[0]++;
        if (by_pwrite) {
            if (pwrite(fd, piece, chunk, (off_t)offset) != (ssize_t)chunk) fail("pwrite");
        } else {
            memcpy((by_mmap ? map : heap) + offset, piece, chunk);
        }
        offset += chunk;
        double at = now_seconds();
        if (chunks % PACE_EVERY_CHUNKS == 0) {
            double ahead = started + (double)done / (rate * 1e6) - at;
            if (ahead > 0) {
                time_t whole = (time_t)ahead;
                struct timespec pause = {whole, (long)((ahead - (double)whole) * 1e9)};
                nanosleep(&pause, NULL);
            }
            at = now_seconds();
        }
        if (to_file && at - last_sync >= 1.0) {
            if (fdatasync(fd) != 0) fail("fdatasync");
            last_sync = at;
        }
    }
    if (to_file && fdatasync(fd) != 0) fail("fdatasync");
    double elapsed = now_seconds() - started;
    long long busy = busy_ticks() - busy_before;
    double cpu = (double)busy / (double)sysconf(_SC_CLK_TCK);
    printf("%-6s chunk %zu B: %.0f MB/s for %.2f s, machine busy %.2f CPU-s (%.1f%% of one CPU)\n", mode, chunk,
           (double)total / 1e6 / elapsed, elapsed, cpu, 100.0 * cpu / elapsed);
    if (map != NULL) munmap(map, SEGMENT_BYTES);
    close(fd);
    unlink(path);
    return 0;
}
