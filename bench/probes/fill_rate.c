// How fast a thread fills 4 MiB ring slots from a page-cached file mapping,
// and at what CPU cost: glibc memcpy, rep movsb, AVX2 stores and AVX2
// non-temporal stores, into slots of 4 KiB pages or of transparent huge pages,
// with 1, 4 and 8 threads. No GPU: it measures the CPU half of the ring.
//
//   cc -O2 -pthread -o fill_rate bench/probes/fill_rate.c
//   ./fill_rate [DIR]     # writes a 4 GiB file in DIR (default /tmp), removes it
//
// x86-64 with AVX2 only.
#define _GNU_SOURCE
#include <immintrin.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define MiB (1ul << 20)
#define SLOT (4 * MiB)
#define SLOTS 4
static size_t FSZ = 4096 * MiB;
static const uint8_t *src;
static int method, thp;
static size_t per_thread = 2048 * MiB;

static double now(clockid_t c) { struct timespec t; clock_gettime(c, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

__attribute__((target("avx2"))) static void nt_copy(uint8_t *d, const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n; i += 128) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(s + i));
        __m256i b = _mm256_loadu_si256((const __m256i *)(s + i + 32));
        __m256i c = _mm256_loadu_si256((const __m256i *)(s + i + 64));
        __m256i e = _mm256_loadu_si256((const __m256i *)(s + i + 96));
        _mm256_stream_si256((__m256i *)(d + i), a);
        _mm256_stream_si256((__m256i *)(d + i + 32), b);
        _mm256_stream_si256((__m256i *)(d + i + 64), c);
        _mm256_stream_si256((__m256i *)(d + i + 96), e);
    }
    _mm_sfence();
}
__attribute__((target("avx2"))) static void avx_copy(uint8_t *d, const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n; i += 128) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(s + i));
        __m256i b = _mm256_loadu_si256((const __m256i *)(s + i + 32));
        __m256i c = _mm256_loadu_si256((const __m256i *)(s + i + 64));
        __m256i e = _mm256_loadu_si256((const __m256i *)(s + i + 96));
        _mm256_store_si256((__m256i *)(d + i), a);
        _mm256_store_si256((__m256i *)(d + i + 32), b);
        _mm256_store_si256((__m256i *)(d + i + 64), c);
        _mm256_store_si256((__m256i *)(d + i + 96), e);
    }
}
static void movsb(uint8_t *d, const uint8_t *s, size_t n) { __asm__ volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory"); }

struct res { double wall, cpu; };
static void *worker(void *arg) {
    long k = (long)arg;
    size_t len = SLOT * SLOTS + 2 * MiB;
    uint8_t *raw = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) abort();
    uint8_t *dst = (uint8_t *)(((uintptr_t)raw + 2 * MiB - 1) & ~(2 * MiB - 1));
    madvise(dst, SLOT * SLOTS, thp ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    memset(dst, 0, SLOT * SLOTS);
    size_t off = (k * 512 * MiB) % FSZ;
    double w0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_THREAD_CPUTIME_ID);
    for (size_t done = 0, i = 0; done < per_thread; done += SLOT, i++) {
        uint8_t *d = dst + (i % SLOTS) * SLOT;
        const uint8_t *s = src + off;
        if (method == 0) memcpy(d, s, SLOT);
        else if (method == 1) movsb(d, s, SLOT);
        else if (method == 2) nt_copy(d, s, SLOT);
        else avx_copy(d, s, SLOT);
        off = (off + SLOT) % FSZ;
    }
    struct res *r = malloc(sizeof *r);
    if (!r) abort();
    r->wall = now(CLOCK_MONOTONIC) - w0; r->cpu = now(CLOCK_THREAD_CPUTIME_ID) - c0;
    munmap(raw, len);
    return r;
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "/tmp";
    char path[4096]; snprintf(path, sizeof path, "%s/memprobe.bin", dir);
    int fd = open(path, O_CREAT | O_TRUNC | O_RDWR, 0600);
    if (fd < 0) { perror(path); return 1; }
    uint8_t *buf = malloc(64 * MiB);
    if (!buf) return 1;
    for (size_t i = 0; i < 64 * MiB; i++) buf[i] = (uint8_t)(i * 2654435761u >> 13);
    for (size_t o = 0; o < FSZ; o += 64 * MiB) { buf[0] = (uint8_t)o; if (write(fd, buf, 64 * MiB) != (ssize_t)(64 * MiB)) { perror("write"); return 1; } }
    src = mmap(NULL, FSZ, PROT_READ, MAP_SHARED, fd, 0);
    if (src == MAP_FAILED) { perror("mmap"); return 1; }
    madvise((void *)src, FSZ, 22 /* MADV_POPULATE_READ */);
    const char *names[] = {"glibc memcpy", "rep movsb", "avx2 non-temporal", "avx2 stores"};
    int threads[] = {1, 4, 8};
    for (int t = 0; t < 3; t++)
        for (thp = 0; thp < 2; thp++)
            for (method = 0; method < 4; method++) {
                int n = threads[t];
                pthread_t th[16];
                double w0 = now(CLOCK_MONOTONIC);
                for (long k = 0; k < n; k++) pthread_create(&th[k], NULL, worker, (void *)k);
                double cpu = 0, maxw = 0;
                for (int k = 0; k < n; k++) { struct res *r; pthread_join(th[k], (void **)&r); cpu += r->cpu; if (r->wall > maxw) maxw = r->wall; free(r); }
                double wall = now(CLOCK_MONOTONIC) - w0, gb = (double)per_thread * n / 1e9;
                printf("%d thread(s) %-18s slots %-4s: %6.1f GB/s in all, %5.1f GB/s per thread, %.3f CPU s/GB\n",
                       n, names[method], thp ? "THP" : "4K", gb / wall, gb / n / maxw, cpu / gb);
                fflush(stdout);
            }
    unlink(path);
    return 0;
}
