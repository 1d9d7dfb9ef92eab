// An experiment on the H200, outside the Rust build: how fast shapes of the
// gather kernel read random 2,883-byte records from registered host memory
// (4 KiB pages, as a registered file mapping is), against the line rate of a
// copy from pinned memory in the same run.
//
//   nvcc -O3 -arch=sm_90 -o /tmp/gather_shapes bench/experiments/gather_shapes.cu
//   /tmp/gather_shapes [GiB of host memory, default 8]
//
// Shapes:
//   library   the library's wirespeed_gather (kernels/gather.cu, included as it
//             is, or with -DWARPS=.. -DROUNDS=.. to try its team size and the
//             rounds a warp loads before it stores), launched as the library
//             launches it (256 threads, a team of WARPS warps per record, up
//             to 4096 blocks)
//   prefetch  the same warp per record, but every round's word loaded before
//             any is stored (records up to 8 rounds, 4 KiB)
//   block     a block of 128 threads per record, one 16-byte load a thread a
//             round, bytes stored one by one (the probe's kernel)
//   perm      the library's wirespeed_gather_perm (the registered way's
//             kernel): each batch the next 4,096 positions of a permutation of
//             the records, computed by the kernel, launched as the library does
//   lib-64reg the library's kernel body held to 64 registers a thread
//             (__launch_bounds__(256, 4)): more warps resident
//
// The library's kernel loads up to eight rounds before it stores since commit
// 40c8b96; "library" then measures that, and "prefetch" is the same idea as
// first tried here.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <random>
#include <sys/mman.h>
#include <cuda_runtime.h>

#include "../../pinned-mem/kernels/gather.cu"

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
  fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)

template <int MAXR>
__device__ __forceinline__ void copy_record_prefetch(u64 d, u64 s, u64 rec, unsigned lane) {
    const u64 d_end = d + rec;
    const u64 s_lo = s & ~(u64)15, s_hi = (s + rec + 15) & ~(u64)15;
    const u64 delta = s - d;
    const unsigned m = (unsigned)(delta & 15);
    const u64 c0 = d & ~(u64)15;
    const unsigned rounds = (unsigned)((d_end - c0 + 511) / 512);
    if (rounds > MAXR) { copy_record<8>(d, s, rec, lane); return; }
    uint4 w[MAXR];
#pragma unroll
    for (int r = 0; r < MAXR; r++)
        if (r < rounds) w[r] = load_within(((c0 + 512 * r + 16 * lane) + delta) & ~(u64)15, s_lo, s_hi);
    // The word after the last round's last lane.
    uint4 tail = make_uint4(0, 0, 0, 0);
    if (lane == 31) tail = load_within(((c0 + 512 * (rounds - 1) + 16 * 31) + delta + 16) & ~(u64)15, s_lo, s_hi);
#pragma unroll
    for (int r = 0; r < MAXR; r++) {
        if (r < rounds) {
            const u64 c = c0 + 512 * r + 16 * (u64)lane;
            uint4 hi = shfl_down16(w[r]);
            const unsigned all = 0xffffffffu;
            uint4 next = tail;
            if (r + 1 < rounds)
                next = make_uint4(__shfl_sync(all, w[(r + 1) % MAXR].x, 0), __shfl_sync(all, w[(r + 1) % MAXR].y, 0),
                                  __shfl_sync(all, w[(r + 1) % MAXR].z, 0), __shfl_sync(all, w[(r + 1) % MAXR].w, 0));
            if (lane == 31) hi = next;
            if (c < d_end) {
                const uint4 v = bytes_at(w[r], hi, m);
                if (c >= d && c + 16 <= d_end) *reinterpret_cast<uint4 *>(c) = v;
                else store_within(c, v, d, d_end);
            }
        }
    }
}

__global__ void __launch_bounds__(256) gather_prefetch(unsigned char *dst, const unsigned char *src, const u64 *offsets, u64 n, u64 rec) {
    const unsigned lane = threadIdx.x & 31;
    const u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
    for (u64 k = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5; k < n; k += warps)
        copy_record_prefetch<8>((u64)dst + k * rec, (u64)src + offsets[k], rec, lane);
}

// The library's kernel body with at most 64 registers a thread (four blocks of 256 a
// multiprocessor), against the register count the library's launch bound allows.
__global__ void __launch_bounds__(256, 4) gather_lb4(unsigned char *dst, const unsigned char *src, const u64 *offsets, u64 n, u64 rec) {
    const unsigned lane = threadIdx.x & 31;
    const u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
    for (u64 k = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5; k < n; k += warps)
        copy_record<ROUNDS>((u64)dst + k * rec, (u64)src + offsets[k], rec, lane);
}

__global__ void gather_block(unsigned char *out, const unsigned char *win, const u64 *offsets, u64 rec) {
    const u64 k = blockIdx.x;
    const unsigned char *src = win + offsets[k];
    unsigned char *o = out + k * rec;
    const u64 a0 = (u64)src & ~(u64)15, a1 = ((u64)src + rec + 15) & ~(u64)15;
    for (u64 a = a0 + 16 * threadIdx.x; a < a1; a += 16 * blockDim.x) {
        uint4 v = *(const uint4 *)a;
        const unsigned char *vb = (const unsigned char *)&v;
        for (int j = 0; j < 16; j++) {
            const u64 p = a + j;
            if (p >= (u64)src && p < (u64)src + rec) o[p - (u64)src] = vb[j];
        }
    }
}

int main(int argc, char **argv) {
    const size_t gib = argc > 1 ? atoi(argv[1]) : 8;
    const size_t len = gib << 30, R = 2883, B = 4096, BATCHES = 400;
    const size_t count = len / R;
    CK(cudaSetDevice(0));
    // Host memory of 4 KiB pages, written, then registered in place.
    unsigned char *h = (unsigned char *)mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (h == MAP_FAILED) { perror("mmap"); return 1; }
    madvise(h, len, MADV_NOHUGEPAGE);
    for (size_t i = 0; i < len; i += 8) *(u64 *)(h + i) = i * 0x9e3779b97f4a7c15ull;
    CK(cudaHostRegister(h, len, cudaHostRegisterMapped | cudaHostRegisterReadOnly | cudaHostRegisterPortable));
    unsigned char *hd = nullptr;
    CK(cudaHostGetDevicePointer((void **)&hd, h, 0));
    // The line rate: 1 GiB from pinned memory, best of 5.
    void *pin, *dev;
    CK(cudaMallocHost(&pin, 1 << 30));
    memset(pin, 1, 1 << 30);
    CK(cudaMalloc(&dev, 1 << 30));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float best = 1e9, ms;
    for (int i = 0; i < 5; i++) {
        CK(cudaEventRecord(e0, st));
        CK(cudaMemcpyAsync(dev, pin, 1 << 30, cudaMemcpyHostToDevice, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (ms < best) best = ms;
    }
    const double line = (1 << 30) / (best / 1e3) / 1e9;
    printf("line rate (1 GiB from pinned memory): %.2f GB/s; host memory %zu GiB registered, %zu records of %zu B, batches of %zu; "
           "library: WARPS=%d ROUNDS=%d\n",
           line, gib, count, R, B, WARPS, ROUNDS);
    // Random records, each batch's offsets uploaded once for all shapes.
    std::mt19937_64 rng(7);
    std::vector<u64> offs(B * BATCHES);
    for (auto &o : offs) o = (rng() % count) * R;
    u64 *doffs;
    unsigned char *out;
    CK(cudaMalloc(&doffs, offs.size() * 8));
    CK(cudaMemcpy(doffs, offs.data(), offs.size() * 8, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&out, B * R + 64));
    std::vector<unsigned char> back(B * R);
    const char *names[] = {"library", "prefetch", "block", "lib-64reg", "perm"};
    // The permutation's bits: the fewest covering the record count, split in two halves.
    unsigned bits_all = 0;
    while ((1ull << bits_all) < count) bits_all++;
    const unsigned hi_bits = bits_all / 2, lo_bits = bits_all - bits_all / 2;
    const u64 key = 0x5eed;
    for (int shape = 0; shape < 5; shape++) {
        for (int rep = 0; rep < 3; rep++) {
            CK(cudaEventRecord(e0, st));
            for (size_t b = 0; b < BATCHES; b++) {
                const u64 *o = doffs + b * B;
                if (shape == 0) {
                    const u64 per_block = 8 / WARPS;
                    unsigned blocks = (unsigned)std::min<u64>((B + per_block - 1) / per_block, 4096);
                    wirespeed_gather<<<blocks, 256, 0, st>>>(out, hd, o, B, R);
                } else if (shape == 1) {
                    unsigned blocks = (unsigned)std::min<u64>((B + 7) / 8, 4096);
                    gather_prefetch<<<blocks, 256, 0, st>>>(out, hd, o, B, R);
                } else if (shape == 2) {
                    gather_block<<<(unsigned)B, 128, 0, st>>>(out, hd, o, R);
                } else if (shape == 3) {
                    unsigned blocks = (unsigned)std::min<u64>((B + 7) / 8, 4096);
                    gather_lb4<<<blocks, 256, 0, st>>>(out, hd, o, B, R);
                } else {
                    const u64 per_block = 8 / WARPS;
                    unsigned blocks = (unsigned)std::min<u64>((B + per_block - 1) / per_block, 4096);
                    wirespeed_gather_perm<<<blocks, 256, 0, st>>>(out, hd, B, R, b * B, count, key,
                                                                  ((u64)hi_bits << 8) | lo_bits);
                }
            }
            CK(cudaGetLastError());
            CK(cudaEventRecord(e1, st));
            CK(cudaEventSynchronize(e1));
            CK(cudaEventElapsedTime(&ms, e0, e1));
            const double gbs = (double)B * R * BATCHES / (ms / 1e3) / 1e9;
            // The last batch's bytes against the host's.
            CK(cudaMemcpy(back.data(), out, B * R, cudaMemcpyDeviceToHost));
            const u64 *lo = offs.data() + (BATCHES - 1) * B;
            bool ok = true;
            for (size_t k = 0; k < B && ok; k++) {
                const u64 at = shape == 4 ? permute(((BATCHES - 1) * B + k) % count, count, key, hi_bits, lo_bits) * R
                                          : lo[k];
                ok = memcmp(back.data() + k * R, h + at, R) == 0;
            }
            printf("%-9s rep %d: %.2f GB/s = %.3f of the line rate, %.2f M records/s, data %s\n", names[shape], rep, gbs,
                   gbs / line, B * BATCHES / (ms / 1e3) / 1e6, ok ? "ok" : "MISMATCH");
        }
    }
    CK(cudaHostUnregister(h));
    return 0;
}
