// The gather kernel of wirespeed-pinned's shuffled batches.
//
// wirespeed_gather(dst, src, offsets, n, rec): record k of the batch, the `rec`
// bytes at dst + k * rec, becomes a copy of the `rec` bytes at src + offsets[k].
// wirespeed_gather_perm(dst, src, n, rec, first, count, key, bits): the same,
// with record k at src + perm((first + k) mod count) * rec, the permutation
// computed here (wirespeed-pinned's `Permutation`), so that a batch of a full
// shuffle costs the host one launch and no upload.
// These two read host memory the device can read (a registered, mapped file
// range); wirespeed_gather_dev and wirespeed_gather_perm_dev, with the same
// parameters, read device memory (a pool of file blocks, or a whole file on
// the device). `dst` is device memory, `offsets` device memory or pinned host
// memory. Records are of any size and alignment.
//
// A team of warps copies one record at a time (a grid-stride loop over
// records): WARPS warps (4) for host memory, whose reads take microseconds
// over the bus, so that a record's reads are all in flight at once on warps of
// few registers; one warp for device memory, which answers sooner. Each warp
// copies a stretch of whole 512-byte rounds of the record, in 16-byte
// chunks aligned in the destination: lane i owns the chunk at
// align_down(dst_k, 16) + 16 * i (and 512 bytes on each round), and reads the
// one aligned 16-byte word of the source where that chunk's bytes start; the
// bytes after it come from the next lane's word (a shuffle), so every source
// word is read once. A warp loads up to ROUNDS rounds' words (2 for host
// memory, 8 for device memory) before it stores any. Words that hold
// no byte of the record are not read: an aligned word holding one byte of a
// record lies in the same page as that byte, so the kernel never touches a page
// the record does not (registered host memory is registered by whole pages).
// Whole chunks are stored as one 16-byte store, the record's first and last
// chunks byte by byte.
//
// Built to PTX by scripts/gen-ptx.py with NVRTC of CUDA 12.0 for compute_70,
// so the PTX loads on every driver of CUDA 12.0 and later (the driver compiles
// it for the GPU at load time). No headers: NVRTC defines the vector types.

typedef unsigned long long u64;

// The 16 bytes at byte offset `m` (0..15) of the 32 bytes lo:hi.
__device__ __forceinline__ uint4 bytes_at(uint4 lo, uint4 hi, unsigned m) {
    unsigned w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    // Shift by whole words (m / 4 of them), with selects rather than an
    // indexed array, so that everything stays in registers.
    if (m & 8) {
#pragma unroll
        for (int i = 0; i < 6; i++) w[i] = w[i + 2];
    }
    if (m & 4) {
#pragma unroll
        for (int i = 0; i < 5; i++) w[i] = w[i + 1];
    }
    const unsigned s = 8 * (m & 3);
    return make_uint4(__funnelshift_r(w[0], w[1], s), __funnelshift_r(w[1], w[2], s),
                      __funnelshift_r(w[2], w[3], s), __funnelshift_r(w[3], w[4], s));
}

// The aligned word at `a` if it lies within [lo, hi), else zeros.
__device__ __forceinline__ uint4 load_within(u64 a, u64 lo, u64 hi) {
    if (a < lo || a >= hi) return make_uint4(0, 0, 0, 0);
    return __ldg(reinterpret_cast<const uint4 *>(a));
}

__device__ __forceinline__ uint4 shfl_down16(uint4 v) {
    const unsigned all = 0xffffffffu;
    return make_uint4(__shfl_down_sync(all, v.x, 1), __shfl_down_sync(all, v.y, 1), __shfl_down_sync(all, v.z, 1),
                      __shfl_down_sync(all, v.w, 1));
}

// Stores the bytes of `v` (the chunk at `c`) that fall within [lo, hi).
__device__ __forceinline__ void store_within(u64 c, uint4 v, u64 lo, u64 hi) {
    const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 16; j++) {
        const u64 a = c + j;
        if (a >= lo && a < hi) *reinterpret_cast<unsigned char *>(a) = (unsigned char)(w[j / 4] >> (8 * (j % 4)));
    }
}

// The host-memory kernels' team size and rounds (a build may set them, as the
// shapes experiment does); the device-memory kernels' are fixed below.
#ifndef ROUNDS
#define ROUNDS 2
#endif
#ifndef WARPS
#define WARPS 4
#endif

// Copies the `rec` bytes at `s` to `d`, with the lanes of one warp, ROUNDS
// rounds at a time: every load of those rounds is issued before the first
// store, so that a warp has several rounds of reads in flight, not one.
template <int ROUNDS_>
__device__ __forceinline__ void copy_record(u64 d, u64 s, u64 rec, unsigned lane) {
    const u64 d_end = d + rec;
    const u64 s_lo = s & ~(u64)15, s_hi = (s + rec + 15) & ~(u64)15; // the words holding the record
    const u64 delta = s - d;                                         // source = destination + delta (mod 2^64)
    const unsigned m = (unsigned)(delta & 15);
    const unsigned all = 0xffffffffu;
    for (u64 base = d & ~(u64)15; base < d_end; base += 16 * 32 * ROUNDS_) {
        // The rounds of this stretch that hold bytes of the record (the same for every lane).
        const u64 left = (d_end - base + 16 * 32 - 1) / (16 * 32);
        const unsigned rounds = left < ROUNDS_ ? (unsigned)left : ROUNDS_;
        uint4 w[ROUNDS_];
#pragma unroll
        for (int r = 0; r < ROUNDS_; r++) {
            const u64 c = base + 16 * 32 * r + 16 * (u64)lane; // this lane's destination chunk
            w[r] = r < rounds ? load_within((c + delta) & ~(u64)15, s_lo, s_hi) : make_uint4(0, 0, 0, 0);
        }
        // The word after the stretch's last one (lane 31's next), if it holds a byte.
        uint4 after = make_uint4(0, 0, 0, 0);
        if (lane == 31) after = load_within(((base + 16 * 32 * rounds) + delta) & ~(u64)15, s_lo, s_hi);
#pragma unroll
        for (int r = 0; r < ROUNDS_; r++) {
            if (r < rounds) {
                const u64 c = base + 16 * 32 * r + 16 * (u64)lane;
                // The next lane's word; lane 31's is lane 0's of the next round.
                uint4 hi = shfl_down16(w[r]);
                uint4 next = after;
                if (r + 1 < ROUNDS_) {
                    const uint4 n0 = w[(r + 1) % ROUNDS_];
                    const uint4 first = make_uint4(__shfl_sync(all, n0.x, 0), __shfl_sync(all, n0.y, 0),
                                                   __shfl_sync(all, n0.z, 0), __shfl_sync(all, n0.w, 0));
                    if (r + 1 < (int)rounds) next = first;
                }
                if (lane == 31) hi = next;
                if (c < d_end) {
                    const uint4 v = bytes_at(w[r], hi, m);
                    if (c >= d && c + 16 <= d_end) *reinterpret_cast<uint4 *>(c) = v;
                    else store_within(c, v, d, d_end);
                }
            }
        }
    }
}

// Warp `w` of a team of W's share of the record of `rec` bytes at `s` to `d`:
// the rounds [T * w / W, T * (w + 1) / W) of the record's T rounds,
// counted from align_down(d, 16). A share starts at a 16-byte boundary of
// the destination (or at `d`), so the chunks of every share are the record's
// own chunks, and every word the share reads holds a byte of the record.
template <int W, int R>
__device__ __forceinline__ void copy_share(u64 d, u64 s, u64 rec, unsigned w, unsigned lane) {
    const u64 base = d & ~(u64)15;
    const u64 rounds = (d + rec - base + 16 * 32 - 1) / (16 * 32);
    const u64 r0 = rounds * w / W, r1 = rounds * (w + 1) / W;
    const u64 lo = base + 16 * 32 * r0 > d ? base + 16 * 32 * r0 : d;
    const u64 hi = base + 16 * 32 * r1 < d + rec ? base + 16 * 32 * r1 : d + rec;
    if (lo < hi) copy_record<R>(lo, s + (lo - d), hi - lo, lane);
}

// Record k of the batch is the record at src + offsets[k], copied by teams of
// W warps (the launch's block size, 256 threads, is a multiple of 32 * W, so a
// team lies in one block).
template <int W, int R>
__device__ __forceinline__ void gather(unsigned char *__restrict__ dst, const unsigned char *__restrict__ src,
                                       const u64 *__restrict__ offsets, u64 n, u64 rec) {
    const unsigned lane = threadIdx.x & 31;
    const u64 warp = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const unsigned w = (unsigned)(warp % W);
    const u64 teams = (((u64)gridDim.x * blockDim.x) >> 5) / W;
    for (u64 k = warp / W; k < n; k += teams) copy_share<W, R>((u64)dst + k * rec, (u64)src + offsets[k], rec, w, lane);
}

extern "C" __global__ void __launch_bounds__(256)
wirespeed_gather(unsigned char *__restrict__ dst, const unsigned char *__restrict__ src,
                 const u64 *__restrict__ offsets, u64 n, u64 rec) {
    gather<WARPS, ROUNDS>(dst, src, offsets, n, rec);
}

extern "C" __global__ void __launch_bounds__(256)
wirespeed_gather_dev(unsigned char *__restrict__ dst, const unsigned char *__restrict__ src,
                     const u64 *__restrict__ offsets, u64 n, u64 rec) {
    gather<1, 8>(dst, src, offsets, n, rec);
}

// SplitMix64's finalizer, as wirespeed-pinned's `Permutation` mixes.
__host__ __device__ __forceinline__ u64 mix(u64 x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// Element i of the permutation of 0..count that `key` selects: a Feistel
// network of four rounds over hi_bits + lo_bits bits, walked until it lands
// below `count`; exactly `Permutation::at` of wirespeed-pinned. With no bits
// it is the identity. (On the host too: the shapes experiment checks the
// bytes of a permuted batch with it.)
__host__ __device__ __forceinline__ u64 permute(u64 i, u64 count, u64 key, unsigned hi_bits, unsigned lo_bits) {
    if (hi_bits + lo_bits == 0) return i;
    u64 x = i;
    do {
        unsigned a = hi_bits, b = lo_bits;
        u64 hi = x >> b, lo = x & ((1ull << b) - 1);
        for (u64 round = 0; round < 4; round++) {
            const u64 f = mix(key ^ ((round + 1) * 0x9e3779b97f4a7c15ull) ^ lo) & ((1ull << a) - 1);
            const u64 t = lo;
            lo = hi ^ f;
            hi = t;
            const unsigned w = a;
            a = b;
            b = w;
        }
        x = (hi << b) | lo;
    } while (x >= count);
    return x;
}

// Record k of the batch is record perm((first + k) mod count) of `src` (the
// records, packed): the batch of an epoch's shuffled order, positions
// first .. first + n of it, its indices computed here rather than uploaded.
template <int W, int R>
__device__ __forceinline__ void gather_perm(unsigned char *__restrict__ dst, const unsigned char *__restrict__ src,
                                            u64 n, u64 rec, u64 first, u64 count, u64 key, u64 bits) {
    const unsigned lane = threadIdx.x & 31;
    const unsigned hi_bits = (unsigned)(bits >> 8), lo_bits = (unsigned)(bits & 0xff);
    const u64 warp = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const unsigned w = (unsigned)(warp % W);
    const u64 teams = (((u64)gridDim.x * blockDim.x) >> 5) / W;
    for (u64 k = warp / W; k < n; k += teams) {
        const u64 r = permute((first + k) % count, count, key, hi_bits, lo_bits);
        copy_share<W, R>((u64)dst + k * rec, (u64)src + r * rec, rec, w, lane);
    }
}

extern "C" __global__ void __launch_bounds__(256)
wirespeed_gather_perm(unsigned char *__restrict__ dst, const unsigned char *__restrict__ src, u64 n, u64 rec,
                      u64 first, u64 count, u64 key, u64 bits) {
    gather_perm<WARPS, ROUNDS>(dst, src, n, rec, first, count, key, bits);
}

extern "C" __global__ void __launch_bounds__(256)
wirespeed_gather_perm_dev(unsigned char *__restrict__ dst, const unsigned char *__restrict__ src, u64 n, u64 rec,
                          u64 first, u64 count, u64 key, u64 bits) {
    gather_perm<1, 8>(dst, src, n, rec, first, count, key, bits);
}
