// An experiment on the H200, outside the Rust build: how fast a thread registers
// and unregisters 64 MiB blocks of host memory in a second CUDA context (as the
// streamer's window agent does) while the primary context is idle, runs gather
// kernels over device memory (as a shuffle pool's batches do: back to back, or one
// every 2 ms), or copies from pinned memory (as the streamer's ring does).
//
//   nvcc -O3 -arch=sm_90 -o /tmp/register_under_kernels bench/experiments/register_under_kernels.cu -lcuda -lpthread
//   /tmp/register_under_kernels
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>
#include <sys/mman.h>
#include <cuda_runtime.h>

#include "../../pinned-mem/kernels/gather.cu"

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
  fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)
#define DK(x) do { int e_ = (x); if (e_ != 0) { fprintf(stderr, "%s:%d %s: driver error %d\n", __FILE__, __LINE__, #x, e_); exit(1); } } while (0)

// The driver API, declared here (no cuda.h), as the library's second context uses it.
extern "C" int cuInit(unsigned);
extern "C" int cuCtxCreate_v2(void **, unsigned, int);
extern "C" int cuCtxSetCurrent(void *);
extern "C" int cuMemHostRegister_v2(void *, size_t, unsigned);
extern "C" int cuMemHostUnregister(void *);
static const unsigned REG = 0x01 | 0x02 | 0x08; // PORTABLE | DEVICEMAP | READ_ONLY

static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

int main() {
    const size_t host_len = 4ull << 30, blk = 64ull << 20, R = 2883, B = 4096, dev_len = 8ull << 30;
    CK(cudaSetDevice(0));
    CK(cudaFree(0));
    DK(cuInit(0));
    void *second = nullptr;
    DK(cuCtxCreate_v2(&second, 0, 0));
    CK(cudaSetDevice(0)); // the primary context, current again on this thread
    unsigned char *h = (unsigned char *)mmap(nullptr, host_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (h == MAP_FAILED) { perror("mmap"); return 1; }
    madvise(h, host_len, MADV_NOHUGEPAGE);
    memset(h, 3, host_len);
    // Device memory of records, batches' offsets, a batch; a pinned buffer to copy from.
    unsigned char *pool, *out, *dst;
    u64 *offs;
    CK(cudaMalloc(&pool, dev_len + 64));
    CK(cudaMemset(pool, 1, dev_len));
    CK(cudaMalloc(&out, B * R + 64));
    const size_t nb = 64;
    std::vector<u64> o(B * nb);
    std::mt19937_64 rng(5);
    for (auto &x : o) x = (rng() % (dev_len / R)) * R;
    CK(cudaMalloc(&offs, o.size() * 8));
    CK(cudaMemcpy(offs, o.data(), o.size() * 8, cudaMemcpyHostToDevice));
    void *pin;
    CK(cudaMallocHost(&pin, 256 << 20));
    CK(cudaMalloc(&dst, 256 << 20));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const char *names[] = {"idle", "gathers back to back", "a gather every 2 ms", "copies from pinned memory"};
    for (int mode = 0; mode < 4; mode++) {
        std::atomic<bool> stop{false};
        std::atomic<long> work{0};
        std::thread load([&] {
            CK(cudaSetDevice(0));
            size_t k = 0;
            while (!stop.load()) {
                if (mode == 0) { std::this_thread::sleep_for(std::chrono::milliseconds(1)); continue; }
                if (mode == 3) {
                    CK(cudaMemcpyAsync(dst, pin, 256 << 20, cudaMemcpyHostToDevice, st));
                    CK(cudaStreamSynchronize(st));
                    work += 1;
                    continue;
                }
                wirespeed_gather_dev<<<(unsigned)((B + 7) / 8), 256, 0, st>>>(out, pool, offs + (k++ % nb) * B, B, R);
                CK(cudaGetLastError());
                work += 1;
                if (mode == 2) { CK(cudaStreamSynchronize(st)); std::this_thread::sleep_for(std::chrono::microseconds(2000)); }
                else if (k % 32 == 0) CK(cudaStreamSynchronize(st));
            }
            CK(cudaStreamSynchronize(st));
        });
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        DK(cuCtxSetCurrent(second));
        double t0 = now(), bytes = 0;
        size_t off = 0;
        while (now() - t0 < 1.5) {
            if (off + blk > host_len) off = 0;
            DK(cuMemHostRegister_v2(h + off, blk, REG));
            DK(cuMemHostUnregister(h + off));
            bytes += blk;
            off += blk;
        }
        const double secs = now() - t0;
        stop = true;
        load.join();
        CK(cudaSetDevice(0));
        printf("%-26s registering + unregistering 64 MiB blocks in a second context: %6.2f GB/s (%ld kernels or copies meanwhile)\n",
               names[mode], bytes / secs / 1e9, work.load());
    }
    return 0;
}
