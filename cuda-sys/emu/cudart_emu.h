/* cudart_emu: a host-only stand-in for the CUDA runtime (libcudart), for tests
 * and CI on machines without a GPU. It exports the runtime functions that
 * cuda-sys binds, with the same C ABI and error codes, the few driver API
 * functions cuda-sys binds (contexts and host registration, also reachable
 * through cudaGetDriverEntryPointByVersion), plus the control functions
 * declared here (accounting, delays, fault injection). Kernels: a library
 * loaded from PTX (cudaLibraryLoadData) offers the entries its text declares,
 * and the emulator runs the ones it knows (the workspace's own, by name; see
 * DIFFERENCES.md) on the stream's worker thread, on the host.
 *
 * Environment variables read at load time:
 *   CUDA_EMU_DEVICES      number of devices (default 1; 0 makes cudaGetDeviceCount fail with cudaErrorNoDevice)
 *   CUDA_EMU_DEVICE_MEM   bytes of memory per device (default 16 GiB; allocations are made lazily)
 *   CUDA_EMU_VERSION      runtime version reported (default 13000; 12090 makes it behave as CUDA 12.9)
 *   CUDA_EMU_DELAY_US     microseconds each stream operation waits before it runs (default 0)
 *   CUDA_EMU_FAULTS       comma-separated faults, each NAME:NTH:ERROR[:sticky]
 */
#ifndef CUDART_EMU_H
#define CUDART_EMU_H
#include <stddef.h>
#include <stdint.h>

/* Live resources; tests assert that these return to zero. */
typedef struct cudaEmuCounters {
    uint64_t device_allocs;     /* live cudaMalloc allocations */
    uint64_t device_bytes;
    uint64_t pinned_allocs;     /* live cudaHostAlloc allocations */
    uint64_t pinned_bytes;
    uint64_t registrations;     /* live cudaHostRegister ranges */
    uint64_t registered_bytes;  /* after rounding out to pages */
    uint64_t streams;           /* live created streams (not the default ones) */
    uint64_t events;            /* live events */
    uint64_t ops_executed;      /* stream operations executed so far (monotonic) */
    uint64_t bytes_copied;      /* bytes moved by memcpy operations so far (monotonic) */
    uint64_t contexts;          /* live contexts made with cuCtxCreate (not the primary ones) */
    uint64_t unregister_violations; /* cuMemHostUnregister calls refused in a created context
                                       because a queued or running copy still used the memory
                                       (monotonic; also counts cuCtxDestroy dropping such a range) */
    uint64_t libraries;         /* live libraries loaded with cudaLibraryLoadData */
    uint64_t kernel_launches;   /* kernels run so far (monotonic) */
} cudaEmuCounters;

/* Fills *out. Returns 0. */
int cudaEmuGetCounters(cudaEmuCounters *out);
/* Sets the per-operation delay in microseconds for operations enqueued later. Returns 0. */
int cudaEmuSetDelayUs(unsigned int us);
/* on != 0: stream workers start no further operation (an operation already
 * running finishes) until cudaEmuHold(0) or cudaEmuReset; a test's way of
 * keeping work provably unfinished. Returns 0. */
int cudaEmuHold(int on);
/* Makes the nth call (1-based, counted from now) of the function named `name`
 * return `error` without any other effect. With `sticky` set, that call and every
 * later call of every function return `error` until cudaEmuReset (a lost context).
 * Returns 0, or -1 for an unknown function name. */
int cudaEmuInjectFault(const char *name, unsigned int nth, int error, int sticky);
/* Removes pending faults, clears a sticky error and every thread's last error,
 * and lets held workers go on (cudaEmuHold). Leaves resources alone. Returns 0. */
int cudaEmuReset(void);
/* Number of calls made so far to the function named `name` (monotonic; -1 if unknown). */
long long cudaEmuCallCount(const char *name);
/* Makes every cuCtxCreate_v2 from now on fail with the CUresult `error`, without
 * creating anything (as exclusive-process compute mode or an MPS client would);
 * 0 lets them succeed again. cudaEmuReset also clears it. Returns 0. */
int cudaEmuSetContextCreateError(int error);
#endif
