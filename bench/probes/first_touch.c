// What the first pass over a fresh mapping of a page-cached file costs: one
// thread copies the file in 4 MiB pieces from a new mapping (its page tables
// empty), then again from the same mapping, then from another new mapping
// populated first with MADV_POPULATE_READ; with 1 and 4 threads. Prints the
// rates, CPU s/GB, and how much of the mapping the kernel mapped with 2 MiB
// entries (FilePmdMapped). No GPU.
//
//   cc -O2 -pthread -o first_touch bench/probes/first_touch.c
//   ./first_touch [DIR]     # writes a 4 GiB file in DIR (default /tmp), removes it
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#define MiB (1ul << 20)
#define PIECE (4 * MiB)
static const size_t FSZ = 4096 * MiB;

static double now(clockid_t c) { struct timespec t; clock_gettime(c, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

struct job { const char *src; size_t len; };

static void *copy(void *arg) {
    struct job *j = arg;
    char *buf = aligned_alloc(4096, PIECE);
    memset(buf, 0, PIECE);
    for (size_t o = 0; o < j->len; o += PIECE) {
        size_t k = j->len - o < PIECE ? j->len - o : PIECE;
        memcpy(buf, j->src + o, k);
        __asm__ volatile("" ::"r"(buf) : "memory");
    }
    free(buf);
    return 0;
}

// Copies [p, p + FSZ) with `threads` threads, each its own contiguous part.
static void pass(const char *what, const char *p, int threads, double populate_s) {
    pthread_t t[16];
    struct job j[16];
    double w0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
    for (int i = 0; i < threads; i++) {
        j[i] = (struct job){p + FSZ / threads * i, FSZ / threads};
        pthread_create(&t[i], 0, copy, &j[i]);
    }
    for (int i = 0; i < threads; i++) pthread_join(t[i], 0);
    double w = now(CLOCK_MONOTONIC) - w0, c = now(CLOCK_PROCESS_CPUTIME_ID) - c0;
    long pmd = -1;
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "FilePmdMapped:", 14)) pmd = atol(line + 14) / 1024;
    if (f) fclose(f);
    printf("%d thread(s) %-34s %6.1f GB/s  %.3f CPU s/GB  FilePmdMapped %ld MiB", threads, what,
           FSZ / w / 1e9, c / (FSZ / 1e9), pmd);
    if (populate_s > 0) printf("  (populating took %.1f ms before, not in the rate)", populate_s * 1e3);
    printf("\n");
}

int main(int argc, char **argv) {
    char path[4096];
    snprintf(path, sizeof path, "%s/first_touch.XXXXXX", argc > 1 ? argv[1] : "/tmp");
    int fd = mkstemp(path);
    if (fd < 0) { perror("mkstemp"); return 1; }
    unlink(path);
    char *chunk = malloc(64 * MiB);
    for (size_t i = 0; i < 64 * MiB; i++) chunk[i] = (char)(i * 2654435761u >> 13);
    for (size_t o = 0; o < FSZ; o += 64 * MiB)
        if (pwrite(fd, chunk, 64 * MiB, o) != (ssize_t)(64 * MiB)) { perror("pwrite"); return 1; }
    free(chunk);
    for (int threads = 1; threads <= 4; threads *= 4) {
        char *p = mmap(0, FSZ, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) { perror("mmap"); return 1; }
        pass("new mapping (first touch)", p, threads, 0);
        pass("same mapping again", p, threads, 0);
        munmap(p, FSZ);
        p = mmap(0, FSZ, PROT_READ, MAP_SHARED, fd, 0);
        double w0 = now(CLOCK_MONOTONIC);
        madvise(p, FSZ, MADV_POPULATE_READ);
        double pop = now(CLOCK_MONOTONIC) - w0;
        pass("new mapping, MADV_POPULATE_READ", p, threads, pop);
        munmap(p, FSZ);
    }
    close(fd);
    return 0;
}
