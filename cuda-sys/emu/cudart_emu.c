/* cudart_emu.c: a host-only stand-in for the CUDA runtime (libcudart).
 *
 * Built as libcudart_emu.so by cuda-sys/build.rs (feature `emulator`) and loaded
 * by path with dlopen. It exports the runtime functions that cuda-sys binds
 * (src/generated/api.rs, SYMBOLS) with the real C ABI and error codes, the
 * driver functions it binds (src/generated/driver_api.rs, DRIVER_SYMBOLS, also
 * handed out by cudaGetDriverEntryPointByVersion), plus the control API of
 * cudart_emu.h. No CUDA header is used: the few types and every numeric value
 * below are taken from src/generated/cuda13.rs and driver.rs.
 *
 * Layout of this file:
 *   1. types and constants        6. streams, operations and workers
 *   2. configuration and state    7. events
 *   3. errors and last error      8. memory tables and copies
 *   4. call counting and faults   9. the exported runtime functions
 *   5. small helpers             10. the driver API: contexts, registrations
 *                                11. the control API and the constructor
 *
 * Concurrency: one global mutex (g_lock) guards every table and every stream,
 * event, context and operation field. The driver's context stack is per thread
 * (thread-local, as in the driver). Each stream has a worker thread and two condition
 * variables (work queued / work done) used with g_lock: the emulator's own
 * (emu_cv, section 5), not glibc's, whose lost-wakeup bug (sourceware BZ 25847,
 * in glibc before 2.41) hung the emulator after about a million operations; and
 * every wait is bounded and re-checks its predicate. The lock is never held
 * while a worker sleeps for the delay, copies for an operation or runs a host
 * function. Counters read outside the lock are atomics.
 */
#define _GNU_SOURCE
#include "cudart_emu.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

/* ======================================================================== */
/* 1. Types and constants (values from cuda13.rs)                           */
/* ======================================================================== */

typedef int cudaError_t;
typedef struct emu_stream *cudaStream_t; /* opaque CUstream_st* */
typedef struct emu_event *cudaEvent_t;   /* opaque CUevent_st* */
typedef void (*cudaHostFn_t)(void *);

/* Every cudaError value of cuda13.rs (cuda12.rs has the same set), minus the
 * "cudaError" prefix; cudaSuccess (0) is separate. */
#define ERRORS(X)                                                                                    \
    X(InvalidValue, 1) X(MemoryAllocation, 2) X(InitializationError, 3) X(CudartUnloading, 4)        \
    X(ProfilerDisabled, 5) X(ProfilerNotInitialized, 6) X(ProfilerAlreadyStarted, 7)                 \
    X(ProfilerAlreadyStopped, 8) X(InvalidConfiguration, 9) X(InvalidPitchValue, 12)                 \
    X(InvalidSymbol, 13) X(InvalidHostPointer, 16) X(InvalidDevicePointer, 17) X(InvalidTexture, 18) \
    X(InvalidTextureBinding, 19) X(InvalidChannelDescriptor, 20) X(InvalidMemcpyDirection, 21)       \
    X(AddressOfConstant, 22) X(TextureFetchFailed, 23) X(TextureNotBound, 24)                        \
    X(SynchronizationError, 25) X(InvalidFilterSetting, 26) X(InvalidNormSetting, 27)                \
    X(MixedDeviceExecution, 28) X(NotYetImplemented, 31) X(MemoryValueTooLarge, 32)                  \
    X(StubLibrary, 34) X(InsufficientDriver, 35) X(CallRequiresNewerDriver, 36)                      \
    X(InvalidSurface, 37) X(DuplicateVariableName, 43) X(DuplicateTextureName, 44)                   \
    X(DuplicateSurfaceName, 45) X(DevicesUnavailable, 46) X(IncompatibleDriverContext, 49)           \
    X(MissingConfiguration, 52) X(PriorLaunchFailure, 53) X(LaunchMaxDepthExceeded, 65)              \
    X(LaunchFileScopedTex, 66) X(LaunchFileScopedSurf, 67) X(SyncDepthExceeded, 68)                  \
    X(LaunchPendingCountExceeded, 69) X(InvalidDeviceFunction, 98) X(NoDevice, 100)                  \
    X(InvalidDevice, 101) X(DeviceNotLicensed, 102) X(SoftwareValidityNotEstablished, 103)           \
    X(StartupFailure, 127) X(InvalidKernelImage, 200) X(DeviceUninitialized, 201)                    \
    X(MapBufferObjectFailed, 205) X(UnmapBufferObjectFailed, 206) X(ArrayIsMapped, 207)              \
    X(AlreadyMapped, 208) X(NoKernelImageForDevice, 209) X(AlreadyAcquired, 210) X(NotMapped, 211)   \
    X(NotMappedAsArray, 212) X(NotMappedAsPointer, 213) X(ECCUncorrectable, 214)                     \
    X(UnsupportedLimit, 215) X(DeviceAlreadyInUse, 216) X(PeerAccessUnsupported, 217)                \
    X(InvalidPtx, 218) X(InvalidGraphicsContext, 219) X(NvlinkUncorrectable, 220)                    \
    X(JitCompilerNotFound, 221) X(UnsupportedPtxVersion, 222) X(JitCompilationDisabled, 223)         \
    X(UnsupportedExecAffinity, 224) X(UnsupportedDevSideSync, 225) X(Contained, 226)                 \
    X(InvalidSource, 300) X(FileNotFound, 301) X(SharedObjectSymbolNotFound, 302)                    \
    X(SharedObjectInitFailed, 303) X(OperatingSystem, 304) X(InvalidResourceHandle, 400)             \
    X(IllegalState, 401) X(LossyQuery, 402) X(SymbolNotFound, 500) X(NotReady, 600)                  \
    X(IllegalAddress, 700) X(LaunchOutOfResources, 701) X(LaunchTimeout, 702)                        \
    X(LaunchIncompatibleTexturing, 703) X(PeerAccessAlreadyEnabled, 704)                             \
    X(PeerAccessNotEnabled, 705) X(SetOnActiveProcess, 708) X(ContextIsDestroyed, 709)               \
    X(Assert, 710) X(TooManyPeers, 711) X(HostMemoryAlreadyRegistered, 712)                          \
    X(HostMemoryNotRegistered, 713) X(HardwareStackError, 714) X(IllegalInstruction, 715)            \
    X(MisalignedAddress, 716) X(InvalidAddressSpace, 717) X(InvalidPc, 718) X(LaunchFailure, 719)    \
    X(CooperativeLaunchTooLarge, 720) X(TensorMemoryLeak, 721) X(NotPermitted, 800)                  \
    X(NotSupported, 801) X(SystemNotReady, 802) X(SystemDriverMismatch, 803)                         \
    X(CompatNotSupportedOnDevice, 804) X(MpsConnectionFailed, 805) X(MpsRpcFailure, 806)             \
    X(MpsServerNotReady, 807) X(MpsMaxClientsReached, 808) X(MpsMaxConnectionsReached, 809)          \
    X(MpsClientTerminated, 810) X(CdpNotSupported, 811) X(CdpVersionMismatch, 812)                   \
    X(StreamCaptureUnsupported, 900) X(StreamCaptureInvalidated, 901) X(StreamCaptureMerge, 902)     \
    X(StreamCaptureUnmatched, 903) X(StreamCaptureUnjoined, 904) X(StreamCaptureIsolation, 905)      \
    X(StreamCaptureImplicit, 906) X(CapturedEvent, 907) X(StreamCaptureWrongThread, 908)             \
    X(Timeout, 909) X(GraphExecUpdateFailure, 910) X(ExternalDevice, 911)                            \
    X(InvalidClusterSize, 912) X(FunctionNotLoaded, 913) X(InvalidResourceType, 914)                 \
    X(InvalidResourceConfiguration, 915) X(Unknown, 999) X(ApiFailureBase, 10000)

enum {
    cudaSuccess = 0,
#define X(n, v) cudaError##n = v,
    ERRORS(X)
#undef X
};

enum { /* flags */
    HOST_ALLOC_FLAGS = 1 | 2 | 4,                /* Portable | Mapped | WriteCombined */
    HOST_REGISTER_FLAGS = 1 | 2 | 4 | 8,         /* Portable | Mapped | IoMemory | ReadOnly */
    HOST_REGISTER_READONLY = 8,
    STREAM_NONBLOCKING = 1,
    EVENT_FLAGS = 1 | 2 | 4,                     /* BlockingSync | DisableTiming | Interprocess */
    EVENT_DISABLE_TIMING = 2,
    EVENT_INTERPROCESS = 4,
};
enum { KIND_H2H = 0, KIND_H2D = 1, KIND_D2H = 2, KIND_D2D = 3, KIND_DEFAULT = 4 };
enum { MEMTYPE_UNREGISTERED = 0, MEMTYPE_HOST = 1, MEMTYPE_DEVICE = 2 };
enum { /* cudaDeviceAttr values */
    ATTR_MULTIPROCESSOR_COUNT = 16, ATTR_PCI_BUS_ID = 33, ATTR_ASYNC_ENGINE_COUNT = 40,
    ATTR_UNIFIED_ADDRESSING = 41, ATTR_CONCURRENT_MANAGED_ACCESS = 89,
    ATTR_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM = 91, ATTR_HOST_REGISTER_SUPPORTED = 99,
    ATTR_HOST_REGISTER_READONLY_SUPPORTED = 113,
};
enum { PROP_TOTAL_GLOBAL_MEM_OFFSET = 288, PROP_NAME_LEN = 256 }; /* both layouts */
enum { PAGE = 4096 };

/* The driver API (values from driver.rs). CUresult codes are their own enum;
 * the ones this file returns are named below, the rest only listed for names. */
typedef int CUresult;
typedef int CUdevice;
typedef struct emu_ctx *CUcontext;
#define DRV_ERRORS(X) \
    X(INVALID_VALUE, 1) X(OUT_OF_MEMORY, 2) X(NOT_INITIALIZED, 3) X(DEINITIALIZED, 4) \
    X(PROFILER_DISABLED, 5) X(PROFILER_NOT_INITIALIZED, 6) X(PROFILER_ALREADY_STARTED, 7) \
    X(PROFILER_ALREADY_STOPPED, 8) X(STUB_LIBRARY, 34) X(CALL_REQUIRES_NEWER_DRIVER, 36) \
    X(DEVICE_UNAVAILABLE, 46) X(NO_DEVICE, 100) X(INVALID_DEVICE, 101) X(DEVICE_NOT_LICENSED, 102) \
    X(INVALID_IMAGE, 200) X(INVALID_CONTEXT, 201) X(CONTEXT_ALREADY_CURRENT, 202) \
    X(MAP_FAILED, 205) X(UNMAP_FAILED, 206) X(ARRAY_IS_MAPPED, 207) X(ALREADY_MAPPED, 208) \
    X(NO_BINARY_FOR_GPU, 209) X(ALREADY_ACQUIRED, 210) X(NOT_MAPPED, 211) \
    X(NOT_MAPPED_AS_ARRAY, 212) X(NOT_MAPPED_AS_POINTER, 213) X(ECC_UNCORRECTABLE, 214) \
    X(UNSUPPORTED_LIMIT, 215) X(CONTEXT_ALREADY_IN_USE, 216) X(PEER_ACCESS_UNSUPPORTED, 217) \
    X(INVALID_PTX, 218) X(INVALID_GRAPHICS_CONTEXT, 219) X(NVLINK_UNCORRECTABLE, 220) \
    X(JIT_COMPILER_NOT_FOUND, 221) X(UNSUPPORTED_PTX_VERSION, 222) X(JIT_COMPILATION_DISABLED, 223) \
    X(UNSUPPORTED_EXEC_AFFINITY, 224) X(UNSUPPORTED_DEVSIDE_SYNC, 225) X(CONTAINED, 226) \
    X(INVALID_SOURCE, 300) X(FILE_NOT_FOUND, 301) X(SHARED_OBJECT_SYMBOL_NOT_FOUND, 302) \
    X(SHARED_OBJECT_INIT_FAILED, 303) X(OPERATING_SYSTEM, 304) X(INVALID_HANDLE, 400) \
    X(ILLEGAL_STATE, 401) X(LOSSY_QUERY, 402) X(NOT_FOUND, 500) X(NOT_READY, 600) \
    X(ILLEGAL_ADDRESS, 700) X(LAUNCH_OUT_OF_RESOURCES, 701) X(LAUNCH_TIMEOUT, 702) \
    X(LAUNCH_INCOMPATIBLE_TEXTURING, 703) X(PEER_ACCESS_ALREADY_ENABLED, 704) \
    X(PEER_ACCESS_NOT_ENABLED, 705) X(PRIMARY_CONTEXT_ACTIVE, 708) X(CONTEXT_IS_DESTROYED, 709) \
    X(ASSERT, 710) X(TOO_MANY_PEERS, 711) X(HOST_MEMORY_ALREADY_REGISTERED, 712) \
    X(HOST_MEMORY_NOT_REGISTERED, 713) X(HARDWARE_STACK_ERROR, 714) X(ILLEGAL_INSTRUCTION, 715) \
    X(MISALIGNED_ADDRESS, 716) X(INVALID_ADDRESS_SPACE, 717) X(INVALID_PC, 718) \
    X(LAUNCH_FAILED, 719) X(COOPERATIVE_LAUNCH_TOO_LARGE, 720) X(TENSOR_MEMORY_LEAK, 721) \
    X(NOT_PERMITTED, 800) X(NOT_SUPPORTED, 801) X(SYSTEM_NOT_READY, 802) \
    X(SYSTEM_DRIVER_MISMATCH, 803) X(COMPAT_NOT_SUPPORTED_ON_DEVICE, 804) \
    X(MPS_CONNECTION_FAILED, 805) X(MPS_RPC_FAILURE, 806) X(MPS_SERVER_NOT_READY, 807) \
    X(MPS_MAX_CLIENTS_REACHED, 808) X(MPS_MAX_CONNECTIONS_REACHED, 809) \
    X(MPS_CLIENT_TERMINATED, 810) X(CDP_NOT_SUPPORTED, 811) X(CDP_VERSION_MISMATCH, 812) \
    X(STREAM_CAPTURE_UNSUPPORTED, 900) X(STREAM_CAPTURE_INVALIDATED, 901) \
    X(STREAM_CAPTURE_MERGE, 902) X(STREAM_CAPTURE_UNMATCHED, 903) X(STREAM_CAPTURE_UNJOINED, 904) \
    X(STREAM_CAPTURE_ISOLATION, 905) X(STREAM_CAPTURE_IMPLICIT, 906) X(CAPTURED_EVENT, 907) \
    X(STREAM_CAPTURE_WRONG_THREAD, 908) X(TIMEOUT, 909) X(GRAPH_EXEC_UPDATE_FAILURE, 910) \
    X(EXTERNAL_DEVICE, 911) X(INVALID_CLUSTER_SIZE, 912) X(FUNCTION_NOT_LOADED, 913) \
    X(INVALID_RESOURCE_TYPE, 914) X(INVALID_RESOURCE_CONFIGURATION, 915) X(KEY_ROTATION, 916) \
    X(UNKNOWN, 999)

enum {
    CUDA_SUCCESS = 0,
#define X(n, v) CUDA_ERROR_##n = v,
    DRV_ERRORS(X)
#undef X
};
enum {
    CU_MEMHOSTREGISTER_FLAGS = 1 | 2 | 4 | 8, /* PORTABLE | DEVICEMAP | IOMEMORY | READ_ONLY */
    CU_MEMHOSTREGISTER_PORTABLE = 1,
    CU_CTX_FLAGS_MASK = 0xff,
    CTX_STACK_MAX = 64,                       /* contexts pushed on one thread at most */
};
/* cudaDriverEntryPointQueryResult and cudaGetDriverEntryPointFlags */
enum { ENTRY_SUCCESS = 0, ENTRY_SYMBOL_NOT_FOUND = 1, ENTRY_VERSION_NOT_SUFFICIENT = 2, ENTRY_FLAGS_MAX = 2 };
enum { DRIVER_VERSION = 13000 };               /* what cudaDriverGetVersion reports */

/* ======================================================================== */
/* 2. Configuration and global state                                        */
/* ======================================================================== */

#define MAX_DEVICES 64
#define FREED_MAX_ENTRIES 4096                       /* freed device ranges kept reserved */
#define FREED_MAX_BYTES ((uint64_t)4 << 40)           /* ... and at most this much address space */

typedef struct emu_stream stream;
typedef struct emu_event event;

typedef struct {
    size_t used;     /* bytes of live cudaMalloc allocations */
    stream *legacy;  /* the legacy default stream, created on first use */
} device_t;

static int g_ndev = 1;                        /* set by the constructor, read-only later */
static uint64_t g_dev_mem = (uint64_t)16 << 30;
static int g_version = 13000;
static device_t g_dev[MAX_DEVICES];
static _Atomic unsigned g_delay_us;
static _Atomic int g_hold;                    /* cudaEmuHold: workers start no operation */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static __thread int tl_device;                /* current device of this host thread */

/* Live-resource counters (under g_lock). */
static cudaEmuCounters g_counters;

/* The driver's view. A created context (cuCtxCreate) is an emu_ctx in g_ctxs;
 * each device's primary context is static. Each thread has a stack of current
 * contexts; an entry keeps the context's id, so that an entry of a destroyed
 * context is recognized even if its address is reused. */
typedef struct emu_ctx ctx_t;
struct emu_ctx {
    ctx_t *next_all;
    uint64_t id;     /* unique; 0 for a primary context */
    int device;
    int primary;
    unsigned flags;
};
typedef struct { ctx_t *p; uint64_t id; int primary; } ctx_ref;
static ctx_t g_primary_ctx[MAX_DEVICES];      /* set up by the constructor */
static ctx_t *g_ctxs;                         /* live created contexts (under g_lock) */
static uint64_t g_next_ctx_id = 1;            /* under g_lock */
static _Atomic int g_drv_init;                /* cuInit, or the runtime, initialized the driver */
static _Atomic int g_ctx_create_error;        /* cudaEmuSetContextCreateError */
static __thread ctx_ref tl_ctx[CTX_STACK_MAX];
static __thread int tl_nctx;

/* ======================================================================== */
/* 3. Errors, names and the per-thread last error                           */
/* ======================================================================== */

static const struct { int code; const char *name; } k_errors[] = {
    {0, "cudaSuccess"},
#define X(n, v) {v, "cudaError" #n},
    ERRORS(X)
#undef X
};
#define NERRORS (sizeof k_errors / sizeof k_errors[0])

/* Descriptions as the real runtime words them, for the codes met in practice. */
static const struct { int code; const char *text; } k_texts[] = {
    {cudaSuccess, "no error"},
    {cudaErrorInvalidValue, "invalid argument"},
    {cudaErrorMemoryAllocation, "out of memory"},
    {cudaErrorInitializationError, "initialization error"},
    {cudaErrorInvalidDevicePointer, "invalid device pointer"},
    {cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy"},
    {cudaErrorInsufficientDriver, "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorNoDevice, "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "invalid resource handle"},
    {cudaErrorNotReady, "device not ready"},
    {cudaErrorIllegalAddress, "an illegal memory access was encountered"},
    {cudaErrorHostMemoryAlreadyRegistered, "part or all of the requested memory range is already mapped"},
    {cudaErrorHostMemoryNotRegistered, "pointer does not correspond to a registered memory region"},
    {cudaErrorLaunchFailure, "unspecified launch failure"},
    {cudaErrorNotSupported, "operation not supported"},
    {cudaErrorNotPermitted, "operation not permitted"},
    {cudaErrorUnknown, "unknown error"},
};

/* The others get a sentence made from the name: "InvalidPitchValue" -> "invalid pitch value". */
static char g_derived[NERRORS][64];
static pthread_once_t g_derived_once = PTHREAD_ONCE_INIT;

static void derive_texts(void) {
    for (size_t i = 1; i < NERRORS; i++) {
        const char *s = k_errors[i].name + strlen("cudaError");
        char *o = g_derived[i];
        size_t k = 0;
        for (size_t j = 0; s[j] && k + 2 < sizeof g_derived[i]; j++) {
            int up = s[j] >= 'A' && s[j] <= 'Z';
            int prev_low = j > 0 && s[j - 1] >= 'a' && s[j - 1] <= 'z';
            int next_low = s[j + 1] >= 'a' && s[j + 1] <= 'z';
            int prev_up = j > 0 && s[j - 1] >= 'A' && s[j - 1] <= 'Z';
            if (up && j > 0 && (prev_low || (prev_up && next_low))) o[k++] = ' ';
            o[k++] = up ? (char)(s[j] - 'A' + 'a') : s[j];
        }
        o[k] = 0;
    }
}

static int error_index(int code) {
    for (size_t i = 0; i < NERRORS; i++)
        if (k_errors[i].code == code) return (int)i;
    return -1;
}

/* The last error of this thread is valid only while its epoch equals g_epoch:
 * cudaEmuReset bumps g_epoch to clear every thread's last error at once. */
static __thread int tl_err;
static __thread unsigned tl_err_epoch;
static _Atomic unsigned g_epoch;
static _Atomic int g_sticky; /* the sticky error, 0 when none */

static int last_error(void) { return tl_err_epoch == atomic_load(&g_epoch) ? tl_err : 0; }

static void clear_last_error(void) { tl_err = 0; }

/* Records a failure as this thread's last error; returns it. */
static int set_err(int e) {
    if (e) {
        tl_err = e;
        tl_err_epoch = atomic_load(&g_epoch);
    }
    return e;
}

/* Return path of the API functions: cudaErrorNotReady is a status, not an error,
 * and does not become the last error (as in the real runtime). */
static int ret(int e) { return e == cudaErrorNotReady ? e : set_err(e); }

/* The outcome of a call that waited for, or looked at, work that has finished:
 * its own error, else the sticky error, which a device fault (a kernel
 * touching memory it may not) raises while the work runs, after the call's
 * prologue looked. As with the real runtime, the wait or query that sees the
 * faulted work finish reports the fault. */
static int after_work(int e) { return e ? e : atomic_load(&g_sticky); }

/* ======================================================================== */
/* 4. Call counting and fault injection                                     */
/* ======================================================================== */

#define FUNCS(X)                                                                                  \
    X(cudaGetErrorName) X(cudaGetErrorString) X(cudaGetLastError) X(cudaPeekAtLastError)          \
    X(cudaRuntimeGetVersion) X(cudaDriverGetVersion) X(cudaGetDeviceCount) X(cudaSetDevice)       \
    X(cudaGetDevice) X(cudaDeviceGetAttribute) X(cudaDeviceSynchronize) X(cudaMemGetInfo)         \
    X(cudaGetDeviceProperties) X(cudaGetDeviceProperties_v2) X(cudaDeviceGetStreamPriorityRange)  \
    X(cudaMalloc) X(cudaFree) X(cudaHostAlloc) X(cudaFreeHost) X(cudaHostRegister)                \
    X(cudaHostUnregister) X(cudaHostGetDevicePointer) X(cudaHostGetFlags)                         \
    X(cudaPointerGetAttributes) X(cudaMemcpy) X(cudaMemcpyAsync) X(cudaMemset) X(cudaMemsetAsync) \
    X(cudaStreamCreate) X(cudaStreamCreateWithFlags) X(cudaStreamCreateWithPriority)              \
    X(cudaStreamDestroy) X(cudaStreamSynchronize) X(cudaStreamQuery) X(cudaStreamWaitEvent)       \
    X(cudaLaunchHostFunc) X(cudaEventCreate) X(cudaEventCreateWithFlags) X(cudaEventRecord)       \
    X(cudaEventQuery) X(cudaEventSynchronize) X(cudaEventElapsedTime) X(cudaEventElapsedTime_v2)  \
    X(cudaEventDestroy) X(cudaGetDriverEntryPoint) X(cudaGetDriverEntryPointByVersion)            \
    X(cuGetErrorName) X(cuGetErrorString) X(cuInit) X(cuDeviceGet) X(cuCtxCreate_v2)              \
    X(cuCtxDestroy_v2) X(cuCtxPushCurrent_v2) X(cuCtxPopCurrent_v2) X(cuCtxGetCurrent)            \
    X(cuCtxSetCurrent) X(cuMemHostRegister_v2) X(cuMemHostUnregister) X(cudaLaunchKernel)         \
    X(cudaLibraryLoadData) X(cudaLibraryUnload) X(cudaLibraryGetKernel)

enum {
#define X(n) F_##n,
    FUNCS(X)
#undef X
    F_COUNT
};
static const char *const k_func_names[F_COUNT] = {
#define X(n) #n,
    FUNCS(X)
#undef X
};

static _Atomic long long g_calls[F_COUNT];

typedef struct {
    int fn;
    long long target; /* the call number (1-based, since load) that fails */
    int error;
    int sticky;
} fault_t;
static fault_t *g_faults; /* under g_lock */
static size_t g_nfaults_len, g_faults_cap;
static _Atomic int g_nfaults; /* pending faults, read without the lock as a hint */

static int func_index(const char *name) {
    if (!name) return -1;
    for (int i = 0; i < F_COUNT; i++)
        if (strcmp(k_func_names[i], name) == 0) return i;
    return -1;
}

/* Counts a call of `fn`; returns 1 with *err set when an injected fault fires on it. */
static int fault_fires(int fn, int *err) {
    long long n = atomic_fetch_add(&g_calls[fn], 1) + 1;
    if (atomic_load(&g_nfaults) == 0) return 0;
    int fired = 0;
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; i < g_nfaults_len;) {
        fault_t *f = &g_faults[i];
        if (f->fn == fn && f->target == n) {
            if (!fired) {
                fired = 1;
                *err = f->error;
                if (f->sticky && f->error) atomic_store(&g_sticky, f->error);
            }
            *f = g_faults[--g_nfaults_len];
            atomic_fetch_sub(&g_nfaults, 1);
            continue;
        }
        i++;
    }
    pthread_mutex_unlock(&g_lock);
    return fired;
}

static int add_fault(int fn, unsigned nth, int error, int sticky) {
    int rc = 0;
    pthread_mutex_lock(&g_lock);
    if (g_nfaults_len == g_faults_cap) {
        size_t cap = g_faults_cap ? 2 * g_faults_cap : 16;
        fault_t *v = realloc(g_faults, cap * sizeof *v);
        if (!v) rc = -1;
        else { g_faults = v; g_faults_cap = cap; }
    }
    if (rc == 0) {
        long long target = atomic_load(&g_calls[fn]) + (nth ? nth : 1);
        g_faults[g_nfaults_len++] = (fault_t){fn, target, error, sticky != 0};
        atomic_fetch_add(&g_nfaults, 1);
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

/* A context made with cuCtxCreate is current on this thread: the real runtime
 * would run the call in that context, not in the device's primary context.
 * The emulator refuses the call instead, loudly. */
static int foreign_context(const char *fn) {
    if (tl_nctx == 0 || tl_ctx[tl_nctx - 1].primary) return 0;
    fprintf(stderr, "cudart_emu: %s called while a context made with cuCtxCreate is current on this thread "
                    "(the runtime would use it, not the primary context): pop it first\n", fn);
    return cudaErrorIncompatibleDriverContext;
}

/* Set on a stream worker while it runs a host function (cudaLaunchHostFunc).
 * The runtime forbids CUDA calls there ("may result in cudaErrorNotPermitted");
 * the emulator always refuses them, loudly: a call that waits for the stream
 * (a free, a synchronize) would otherwise wait for itself and hang. */
static __thread int tl_in_host_fn;

static int in_host_fn(const char *fn) {
    if (!tl_in_host_fn) return 0;
    fprintf(stderr, "cudart_emu: %s called from a host function (cudaLaunchHostFunc), which must not call CUDA\n", fn);
    return cudaErrorNotPermitted;
}

/* Prologue of every runtime function: counts the call, returns an injected fault,
 * then refuses a call from a host function (in_host_fn), then returns the
 * sticky error, then refuses a call made while a created context is
 * current (see foreign_context). ENTER_RELEASE leaves the sticky error in `st`
 * so that destroy and free calls can still release their bookkeeping.
 * ENTER_NO_STICKY is for the version queries, which work after a lost context;
 * ENTER_ANY_CONTEXT for the last-error queries, which belong to the thread. */
#define ENTER(name)                                                   \
    do {                                                              \
        int e_;                                                       \
        if (fault_fires(F_##name, &e_)) return set_err(e_);           \
        if ((e_ = in_host_fn(#name)) != 0) return set_err(e_);        \
        if ((e_ = atomic_load(&g_sticky)) != 0) return set_err(e_);   \
        if ((e_ = foreign_context(#name)) != 0) return set_err(e_);   \
    } while (0)
#define ENTER_RELEASE(name, st)                                       \
    do {                                                              \
        int e_;                                                       \
        if (fault_fires(F_##name, &e_)) return set_err(e_);           \
        if ((e_ = in_host_fn(#name)) != 0) return set_err(e_);        \
        if ((e_ = foreign_context(#name)) != 0) return set_err(e_);   \
        (st) = atomic_load(&g_sticky);                                \
    } while (0)
#define ENTER_NO_STICKY(name)                                         \
    do {                                                              \
        int e_;                                                       \
        if (fault_fires(F_##name, &e_)) return set_err(e_);           \
    } while (0)
#define ENTER_ANY_CONTEXT(name)                                       \
    do {                                                              \
        int e_;                                                       \
        if (fault_fires(F_##name, &e_)) return set_err(e_);           \
        if ((e_ = atomic_load(&g_sticky)) != 0) return set_err(e_);   \
    } while (0)
/* The same for driver functions: no last error (the driver API has none); a
 * sticky code is returned as is (the sticky codes, 700-719, are the same
 * numbers in both enums). DENTER_RELEASE leaves it in `st`. */
#define DENTER(name)                                                  \
    do {                                                              \
        int e_;                                                       \
        if (fault_fires(F_##name, &e_)) return e_;                    \
        if (in_host_fn(#name)) return CUDA_ERROR_NOT_PERMITTED;       \
        if ((e_ = atomic_load(&g_sticky)) != 0) return e_;            \
    } while (0)
#define DENTER_RELEASE(name, st)                                      \
    do {                                                              \
        int e_;                                                       \
        if (fault_fires(F_##name, &e_)) return e_;                    \
        if (in_host_fn(#name)) return CUDA_ERROR_NOT_PERMITTED;       \
        (st) = atomic_load(&g_sticky);                                \
    } while (0)

/* ======================================================================== */
/* 5. Small helpers: growable arrays, time, sleeping                        */
/* ======================================================================== */

#define VEC(T) struct { T *v; size_t n, cap; }

static int vec_reserve(void **v, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 1;
    size_t c = *cap ? *cap * 2 : 16;
    while (c < need) c *= 2;
    void *p = realloc(*v, c * elem);
    if (!p) return 0;
    *v = p;
    *cap = c;
    return 1;
}
#define VEC_PUSH(vec, item)                                                              \
    (vec_reserve((void **)&(vec).v, &(vec).cap, (vec).n + 1, sizeof *(vec).v)          \
         ? ((vec).v[(vec).n++] = (item), 1)                                              \
         : 0)
#define VEC_REMOVE(vec, i) ((vec).v[i] = (vec).v[--(vec).n]) /* order is not kept */

static void sleep_us(unsigned us) {
    struct timespec ts = {us / 1000000u, (long)(us % 1000000u) * 1000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

/* A condition variable for waiters that hold g_lock: a sequence number that
 * every broadcast bumps, and a futex on it. Used instead of pthread_cond_t.
 *
 * Why: glibc's condition variable (2.25 to 2.40) can lose a wakeup when a
 * waiter from an older group "steals" a signal of the current one (sourceware
 * BZ 25847, fixed in 2.41): the waiter that lost it sleeps on with its group
 * reference held, and the next pthread_cond_broadcast blocks forever in
 * __condvar_quiesce_and_switch_g1 waiting for that reference. The emulator
 * broadcasts done_cv under g_lock after every operation, so after about 1.4
 * million operations one worker hung in pthread_cond_broadcast holding g_lock,
 * and every other thread (cudaEventSynchronize, cudaFree's drain) behind it.
 *
 * This one cannot lose a wakeup: the waiter reads the sequence number under
 * g_lock, and FUTEX_WAIT sleeps only while it is unchanged; a broadcast bumps
 * it under g_lock and wakes every sleeper. `waiters` (under g_lock) lets a
 * broadcast with nobody waiting skip the system call. Each wait is bounded
 * (CV_WAIT_NS): callers loop on their predicate, so even a missed wakeup would
 * cost a moment, never a hang. Wakeups may be spurious. */
typedef struct {
    _Atomic uint32_t seq;
    int waiters; /* under g_lock */
} emu_cv;

enum { CV_WAIT_NS = 50 * 1000 * 1000 };

static void cv_init(emu_cv *cv) {
    atomic_init(&cv->seq, 0);
    cv->waiters = 0;
}

/* Wakes every waiter. g_lock held. */
static void cv_broadcast(emu_cv *cv) {
    atomic_fetch_add(&cv->seq, 1);
    if (cv->waiters > 0) syscall(SYS_futex, &cv->seq, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* Releases g_lock, sleeps until a broadcast (or at most CV_WAIT_NS), takes
 * g_lock again. The caller re-checks its predicate, and keeps `cv` alive
 * (holds a reference to its owner). */
static void cv_wait(emu_cv *cv) {
    uint32_t seen = atomic_load(&cv->seq);
    cv->waiters++;
    pthread_mutex_unlock(&g_lock);
    struct timespec ts = {0, CV_WAIT_NS};
    syscall(SYS_futex, &cv->seq, FUTEX_WAIT_PRIVATE, seen, &ts, NULL, 0);
    pthread_mutex_lock(&g_lock);
    cv->waiters--;
}

/* Broadcast (under g_lock) when cudaEmuHold releases the workers. */
static emu_cv g_hold_cv;

static int overlaps(uintptr_t a, uintptr_t alen, uintptr_t b, uintptr_t blen) {
    return a < b + blen && b < a + alen;
}

/* ======================================================================== */
/* 6. Streams, operations and their worker threads                          */
/* ======================================================================== */

enum { OP_COPY, OP_MEMSET, OP_HOSTFN, OP_EVENT, OP_WAIT, OP_KERNEL };

#define KERNEL_MAX_PARAMS 8
typedef struct emu_kernel kernel_def;

typedef struct {
    stream *s;
    uint64_t seq; /* wait until s->done_seq >= seq */
} dep_t;

typedef struct op {
    struct op *next;
    int kind;
    uint64_t seq;
    unsigned delay_us;
    dep_t *deps;
    int ndeps;
    void *dst;            /* OP_COPY, OP_MEMSET */
    const void *src;      /* OP_COPY */
    void *staging;        /* OP_COPY from pageable memory: freed after the copy */
    size_t n;
    int value;            /* OP_MEMSET */
    cudaHostFn_t fn;      /* OP_HOSTFN */
    void *arg;
    const kernel_def *kern; /* OP_KERNEL: what runs, with its parameters' values */
    uint64_t params[KERNEL_MAX_PARAMS];
    event *ev;            /* OP_EVENT (holds a reference) */
    uint64_t ev_gen;
    struct timespec when; /* OP_EVENT: when the marker ran */
} op_t;

struct emu_stream {
    stream *next_all;          /* every stream object, live or draining */
    int device;
    unsigned flags;
    int priority;
    int legacy;                /* the legacy default stream of its device */
    int live;                  /* a valid handle (not destroyed) */
    int destroyed;             /* worker exits once the queue drained */
    int refs;                  /* owner + worker + waiters + dependencies + events */
    uint64_t enq_seq;          /* sequence number of the last enqueued operation */
    uint64_t done_seq;         /* ... of the last completed one (FIFO: monotonic) */
    op_t *head, *tail;
    op_t *running;             /* the operation the worker runs now (off the queue), or NULL */
    emu_cv work_cv;            /* broadcast when work is queued or on destroy */
    emu_cv done_cv;            /* broadcast after each completed operation */
};

struct emu_event {
    event *next_all;
    unsigned flags;
    int live;
    int refs;                  /* owner + pending markers + synchronizing callers */
    uint64_t gen;              /* number of records so far */
    uint64_t done_gen;         /* highest record generation that has executed */
    stream *last_stream;       /* stream of the latest record (referenced) */
    uint64_t last_seq;         /* sequence number of that marker */
    struct timespec done_time; /* when the done_gen marker executed */
};

static stream *g_streams; /* all stream objects */
static event *g_events;   /* all event objects */

static void event_unref_locked(event *ev);

static void stream_unref_locked(stream *s) {
    if (--s->refs > 0) return;
    for (stream **pp = &g_streams; *pp; pp = &(*pp)->next_all)
        if (*pp == s) { *pp = s->next_all; break; }
    free(s);
}

static int pending(const stream *s) { return s->done_seq < s->enq_seq; }

/* Waits (g_lock held, released while waiting) until s has completed `seq`. */
static void wait_seq_locked(stream *s, uint64_t seq) {
    s->refs++;
    while (s->done_seq < seq) cv_wait(&s->done_cv);
    stream_unref_locked(s);
}

static void run_kernel(op_t *o);

static void run_op(op_t *o) {
    switch (o->kind) {
    case OP_KERNEL: run_kernel(o); break;
    case OP_COPY: memmove(o->dst, o->staging ? o->staging : o->src, o->n); break;
    case OP_MEMSET: memset(o->dst, o->value, o->n); break;
    case OP_HOSTFN:
        tl_in_host_fn = 1;
        o->fn(o->arg);
        tl_in_host_fn = 0;
        break;
    case OP_EVENT: clock_gettime(CLOCK_MONOTONIC, &o->when); break;
    default: break;
    }
}

/* The worker of one stream: runs its operations in order, each once its
 * dependencies on other streams completed and after the delay. */
static void *worker_main(void *arg) {
    stream *s = arg;
    pthread_mutex_lock(&g_lock);
    for (;;) {
        while (!s->head && !s->destroyed) cv_wait(&s->work_cv);
        op_t *o = s->head;
        if (!o) break; /* destroyed and drained */
        s->head = o->next;
        if (!s->head) s->tail = NULL;
        s->running = o;
        for (int i = 0; i < o->ndeps; i++)
            while (o->deps[i].s->done_seq < o->deps[i].seq)
                cv_wait(&o->deps[i].s->done_cv);
        while (atomic_load(&g_hold)) cv_wait(&g_hold_cv);
        pthread_mutex_unlock(&g_lock);

        if (o->delay_us) sleep_us(o->delay_us);
        run_op(o);

        pthread_mutex_lock(&g_lock);
        if (o->kind == OP_EVENT && o->ev_gen > o->ev->done_gen) {
            o->ev->done_gen = o->ev_gen;
            o->ev->done_time = o->when;
        }
        if (o->kind == OP_COPY) g_counters.bytes_copied += o->n;
        g_counters.ops_executed++;
        s->done_seq = o->seq;
        s->running = NULL;
        cv_broadcast(&s->done_cv);
        for (int i = 0; i < o->ndeps; i++) stream_unref_locked(o->deps[i].s);
        if (o->ev) event_unref_locked(o->ev);
        free(o->deps);
        free(o->staging);
        free(o);
    }
    stream_unref_locked(s); /* the worker's reference: frees a destroyed stream */
    pthread_mutex_unlock(&g_lock);
    return NULL;
}

/* Creates a stream object with its (detached) worker. g_lock held. */
static int stream_new_locked(int device, unsigned flags, int priority, int legacy, stream **out) {
    stream *s = calloc(1, sizeof *s);
    if (!s) return cudaErrorMemoryAllocation;
    s->device = device;
    s->flags = flags;
    s->priority = priority;
    s->legacy = legacy;
    s->live = 1;
    s->refs = 2; /* the owner (handle or device) and the worker */
    cv_init(&s->work_cv);
    cv_init(&s->done_cv);
    pthread_attr_t attr;
    pthread_t th;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&th, &attr, worker_main, s);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        free(s);
        return cudaErrorMemoryAllocation;
    }
    s->next_all = g_streams;
    g_streams = s;
    *out = s;
    return cudaSuccess;
}

/* The legacy stream of a device, created on first use. g_lock held. */
static stream *legacy_locked(int device) {
    if (!g_dev[device].legacy) {
        stream *s;
        if (stream_new_locked(device, 0, 0, 1, &s) != cudaSuccess) return NULL;
        g_dev[device].legacy = s;
    }
    return g_dev[device].legacy;
}

/* The device of this thread, or an error when there is none. Like the real
 * runtime, whose first call initializes the driver (cuInit), this makes the
 * driver API usable. */
static int current_device(int *d) {
    if (g_ndev == 0) return cudaErrorNoDevice;
    if (!atomic_load_explicit(&g_drv_init, memory_order_relaxed)) atomic_store(&g_drv_init, 1);
    *d = tl_device;
    return cudaSuccess;
}

/* Maps a handle to a stream object. NULL, cudaStreamLegacy (0x1) and
 * cudaStreamPerThread (0x2) are the current device's legacy stream. g_lock held. */
static int resolve_stream_locked(cudaStream_t h, stream **out) {
    if ((uintptr_t)h <= 2) {
        int d, e = current_device(&d);
        if (e) return e;
        *out = legacy_locked(d);
        return *out ? cudaSuccess : cudaErrorMemoryAllocation;
    }
    for (stream *s = g_streams; s; s = s->next_all)
        if (s == h && s->live && !s->legacy) { *out = s; return cudaSuccess; }
    return cudaErrorInvalidResourceHandle;
}

static int is_blocking(const stream *s) { return !s->legacy && !(s->flags & STREAM_NONBLOCKING); }

/* Appends o to s. Work on the legacy stream waits for the work enqueued so far
 * on every blocking stream of the device, and work on a blocking stream waits
 * for the legacy stream's: captured here as (stream, sequence) dependencies.
 * `extra` (may be NULL) adds one more dependency (cudaStreamWaitEvent).
 * On failure nothing changed. g_lock held. Returns the operation's sequence number via *seq. */
static int enqueue_locked(stream *s, op_t *o, stream *extra, uint64_t extra_seq, uint64_t *seq) {
    int max = 1;
    if (s->legacy)
        for (stream *t = g_streams; t; t = t->next_all) max++;
    dep_t *deps = calloc((size_t)max, sizeof *deps);
    if (!deps) return cudaErrorMemoryAllocation;
    int n = 0;
    if (s->legacy) {
        for (stream *t = g_streams; t; t = t->next_all)
            if (t != s && t->device == s->device && is_blocking(t) && pending(t))
                deps[n++] = (dep_t){t, t->enq_seq};
    } else if (is_blocking(s)) {
        stream *l = g_dev[s->device].legacy;
        if (l && pending(l)) deps[n++] = (dep_t){l, l->enq_seq};
    }
    if (extra && extra != s && extra->done_seq < extra_seq) {
        if (n == max) { /* only when s is not legacy and a legacy dep was added */
            dep_t *d2 = realloc(deps, (size_t)(max + 1) * sizeof *deps);
            if (!d2) { free(deps); return cudaErrorMemoryAllocation; }
            deps = d2;
        }
        deps[n++] = (dep_t){extra, extra_seq};
    }
    for (int i = 0; i < n; i++) deps[i].s->refs++;
    o->deps = deps;
    o->ndeps = n;
    o->seq = ++s->enq_seq;
    o->delay_us = o->kind == OP_WAIT ? 0 : atomic_load(&g_delay_us);
    o->next = NULL;
    if (s->tail) s->tail->next = o;
    else s->head = o;
    s->tail = o;
    cv_broadcast(&s->work_cv);
    if (seq) *seq = o->seq;
    return cudaSuccess;
}

/* Waits until every stream of `device` (-1: of every device), including
 * destroyed ones still draining, completed the work enqueued so far. g_lock held. */
static int drain_locked(int device) {
    size_t n = 0, k = 0;
    for (stream *s = g_streams; s; s = s->next_all) n++;
    if (n == 0) return cudaSuccess;
    dep_t *snap = malloc(n * sizeof *snap);
    if (!snap) return cudaErrorMemoryAllocation;
    for (stream *s = g_streams; s; s = s->next_all)
        if ((device < 0 || s->device == device) && pending(s)) {
            s->refs++;
            snap[k++] = (dep_t){s, s->enq_seq};
        }
    for (size_t i = 0; i < k; i++) {
        while (snap[i].s->done_seq < snap[i].seq) cv_wait(&snap[i].s->done_cv);
    }
    for (size_t i = 0; i < k; i++) stream_unref_locked(snap[i].s);
    free(snap);
    return cudaSuccess;
}

/* ======================================================================== */
/* 7. Events                                                                */
/* ======================================================================== */

static void event_unref_locked(event *ev) {
    if (--ev->refs > 0) return;
    for (event **pp = &g_events; *pp; pp = &(*pp)->next_all)
        if (*pp == ev) { *pp = ev->next_all; break; }
    if (ev->last_stream) stream_unref_locked(ev->last_stream);
    free(ev);
}

static event *find_event_locked(cudaEvent_t h) {
    if (!h) return NULL;
    for (event *e = g_events; e; e = e->next_all)
        if (e == h && e->live) return e;
    return NULL;
}

static int event_done(const event *ev) { return ev->done_gen >= ev->gen; }

/* ======================================================================== */
/* 8. Memory tables, classification of pointers, /proc/self/maps            */
/* ======================================================================== */

typedef struct { uintptr_t start; size_t size, maplen; int device; } devalloc_t;
typedef struct { uintptr_t start; size_t maplen; } freed_t;
/* A cudaHostAlloc block: `start` is what the caller got, inside the mapping
 * [map, map + maplen) (see HOST_ALLOC_LOOSE_BELOW). */
typedef struct { uintptr_t start; size_t size; uintptr_t map; size_t maplen; unsigned flags; int device; } hostblock_t;
/* A registration: by the runtime or the driver in a primary context (ctx NULL),
 * or by the driver in a created context (ctx, with its id). */
typedef struct { uintptr_t orig, start; size_t len; unsigned flags; int device; ctx_t *ctx; uint64_t ctx_id; } hostreg_t;

static VEC(devalloc_t) g_devallocs;   /* live cudaMalloc allocations */
static VEC(freed_t) g_freed;          /* freed ones, still reserved (PROT_NONE), oldest first */
static uint64_t g_freed_bytes;
static VEC(hostblock_t) g_hostblocks; /* live cudaHostAlloc blocks */
static VEC(hostreg_t) g_hostregs;     /* live cudaHostRegister ranges */

static size_t round_up(size_t n) { return (n + PAGE - 1) & ~(size_t)(PAGE - 1); }

static devalloc_t *devalloc_find(uintptr_t p) {
    for (size_t i = 0; i < g_devallocs.n; i++)
        if (p >= g_devallocs.v[i].start && p - g_devallocs.v[i].start < g_devallocs.v[i].size)
            return &g_devallocs.v[i];
    return NULL;
}

static int freed_find(uintptr_t p) {
    for (size_t i = 0; i < g_freed.n; i++)
        if (p >= g_freed.v[i].start && p - g_freed.v[i].start < g_freed.v[i].maplen) return 1;
    return 0;
}

/* Adds a freed range (kept reserved so that its addresses are not reused),
 * releasing the oldest reservations beyond the limits. */
static void freed_add_locked(uintptr_t start, size_t maplen) {
    while (g_freed.n > 0 && (g_freed.n >= FREED_MAX_ENTRIES || g_freed_bytes + maplen > FREED_MAX_BYTES)) {
        munmap((void *)g_freed.v[0].start, g_freed.v[0].maplen);
        g_freed_bytes -= g_freed.v[0].maplen;
        memmove(&g_freed.v[0], &g_freed.v[1], (g_freed.n - 1) * sizeof g_freed.v[0]);
        g_freed.n--;
    }
    if (VEC_PUSH(g_freed, ((freed_t){start, maplen}))) g_freed_bytes += maplen;
    else munmap((void *)start, maplen);
}

/* Pinned block or registration containing [p, p+n), or NULL. */
static hostblock_t *hostblock_find(uintptr_t p, size_t n) {
    for (size_t i = 0; i < g_hostblocks.n; i++) {
        hostblock_t *b = &g_hostblocks.v[i];
        if (p >= b->start && p - b->start < b->size && n <= b->size - (p - b->start)) return b;
    }
    return NULL;
}
/* Whether the runtime (the primary contexts) sees a registration as pinned:
 * one made in a created context only with CU_MEMHOSTREGISTER_PORTABLE. */
static int runtime_sees(const hostreg_t *r) { return !r->ctx || (r->flags & CU_MEMHOSTREGISTER_PORTABLE); }

/* Registration the runtime sees containing [p, p+n), or NULL. */
static hostreg_t *hostreg_find(uintptr_t p, size_t n) {
    for (size_t i = 0; i < g_hostregs.n; i++) {
        hostreg_t *r = &g_hostregs.v[i];
        if (runtime_sees(r) && p >= r->start && p - r->start < r->len && n <= r->len - (p - r->start)) return r;
    }
    return NULL;
}

/* Classifies the range [p, p+n) of a copy or memset: device memory (which must
 * lie inside one live allocation), or host memory, pinned or pageable.
 * A range in freed device memory is refused (use-after-free). g_lock held. */
static int classify_locked(const void *p, size_t n, int *is_dev, int *pinned) {
    uintptr_t a = (uintptr_t)p;
    if (!p || a + n < a) return cudaErrorInvalidValue;
    devalloc_t *d = devalloc_find(a);
    if (d) {
        if (n > d->size - (a - d->start)) return cudaErrorInvalidValue; /* past the end */
        *is_dev = 1;
        *pinned = 0;
        return cudaSuccess;
    }
    if (freed_find(a)) return cudaErrorInvalidValue;
    for (size_t i = 0; i < g_devallocs.n; i++) /* a host range running into device memory */
        if (overlaps(a, n, g_devallocs.v[i].start, g_devallocs.v[i].size)) return cudaErrorInvalidValue;
    *is_dev = 0;
    *pinned = hostblock_find(a, n) || hostreg_find(a, n);
    return cudaSuccess;
}

/* Shared mappings of anonymous or tmpfs-internal memory: the kernel allows
 * writable long-term pins of these, unlike pages of ordinary files. */
static int is_shmem_path(const char *path) {
    return strncmp(path, "/dev/zero", 9) == 0 || strncmp(path, "/SYSV", 5) == 0 ||
           strncmp(path, "/memfd:", 7) == 0 || strncmp(path, "/dev/shm/", 9) == 0 ||
           strncmp(path, "[anon_shmem", 11) == 0 || path[0] == 0;
}

/* Checks that the pages [rs, re) are mapped and may be pinned with these flags,
 * as the driver and the kernel decide: readable; writable unless ReadOnly;
 * not a shared file mapping unless ReadOnly. */
static int check_maps(uintptr_t rs, uintptr_t re, int readonly) {
    FILE *f = fopen("/proc/self/maps", "re");
    if (!f) return cudaSuccess; /* cannot tell: accept */
    char *line = NULL;
    size_t cap = 0;
    uintptr_t cur = rs;
    int err = cudaSuccess;
    while (cur < re && getline(&line, &cap, f) > 0) {
        unsigned long a, b, off, ino;
        unsigned maj, min;
        char perms[8] = {0};
        int pos = 0;
        if (sscanf(line, "%lx-%lx %7s %lx %x:%x %lu %n", &a, &b, perms, &off, &maj, &min, &ino, &pos) < 7)
            continue;
        if (b <= cur) continue;
        if (a > cur) { err = cudaErrorInvalidValue; break; } /* a hole */
        char *path = line + pos;
        path[strcspn(path, "\n")] = 0;
        int shared_file = perms[3] == 's' && ino != 0 && !is_shmem_path(path);
        if (perms[0] != 'r' || (!readonly && (perms[1] != 'w' || shared_file))) {
            err = cudaErrorInvalidValue;
            break;
        }
        cur = b;
    }
    if (!err && cur < re) err = cudaErrorInvalidValue;
    free(line);
    fclose(f);
    return err;
}

/* Registration overlaps (already registered, 712) or device memory (1). g_lock held. */
static int register_conflict_locked(uintptr_t rs, size_t len) {
    for (size_t i = 0; i < g_hostregs.n; i++)
        if (overlaps(rs, len, g_hostregs.v[i].start, g_hostregs.v[i].len)) return cudaErrorHostMemoryAlreadyRegistered;
    for (size_t i = 0; i < g_hostblocks.n; i++)
        if (overlaps(rs, len, g_hostblocks.v[i].map, g_hostblocks.v[i].maplen))
            return cudaErrorHostMemoryAlreadyRegistered;
    for (size_t i = 0; i < g_devallocs.n; i++)
        if (overlaps(rs, len, g_devallocs.v[i].start, g_devallocs.v[i].maplen)) return cudaErrorInvalidValue;
    return cudaSuccess;
}

/* A copy: validates, then enqueues it on the stream. `sync` (cudaMemcpy) runs it
 * on the legacy stream and waits. Pageable sources of async H2D copies are
 * staged at once; D2H into (and H2H involving) pageable memory waits too. */
static int do_copy(void *dst, const void *src, size_t n, int kind, cudaStream_t h, int sync) {
    if (kind < KIND_H2H || kind > KIND_DEFAULT) return cudaErrorInvalidMemcpyDirection;
    pthread_mutex_lock(&g_lock);
    stream *s;
    int e = resolve_stream_locked(sync ? NULL : h, &s);
    int ddev = 0, dpin = 0, sdev = 0, spin = 0;
    if (!e && n == 0) goto out;
    if (!e) e = classify_locked(dst, n, &ddev, &dpin);
    if (!e) e = classify_locked(src, n, &sdev, &spin);
    if (!e) {
        int want_d = kind == KIND_H2D || kind == KIND_D2D, want_s = kind == KIND_D2H || kind == KIND_D2D;
        if (kind != KIND_DEFAULT && (ddev != want_d || sdev != want_s)) e = cudaErrorInvalidValue;
    }
    if (!e && !ddev && dpin) { /* the copy engine cannot write into a ReadOnly registration */
        hostreg_t *r = hostreg_find((uintptr_t)dst, n);
        if (r && (r->flags & HOST_REGISTER_READONLY)) e = cudaErrorInvalidValue;
    }
    if (e) goto out;
    op_t *o = calloc(1, sizeof *o);
    if (!o) { e = cudaErrorMemoryAllocation; goto out; }
    o->kind = OP_COPY;
    o->dst = dst;
    o->src = src;
    o->n = n;
    int wait = sync;
    if (!ddev && !sdev) wait |= !(dpin && spin);     /* H2H: async only when both are pinned */
    else if (!ddev) wait |= !dpin;                    /* D2H into pageable memory */
    else if (!sdev && !spin && !wait) {               /* H2D from pageable memory: stage it */
        o->staging = malloc(n);
        if (!o->staging) { free(o); e = cudaErrorMemoryAllocation; goto out; }
        memcpy(o->staging, src, n);
    }
    uint64_t seq;
    e = enqueue_locked(s, o, NULL, 0, &seq);
    if (e) { free(o->staging); free(o); goto out; }
    if (wait) {
        wait_seq_locked(s, seq);
        e = after_work(e);
    }
out:
    pthread_mutex_unlock(&g_lock);
    return e;
}

static int do_memset(void *dst, int value, size_t n, cudaStream_t h, int sync) {
    pthread_mutex_lock(&g_lock);
    stream *s;
    int e = resolve_stream_locked(sync ? NULL : h, &s);
    int dev = 0, pin = 0;
    if (!e && n == 0) goto out;
    if (!e) e = classify_locked(dst, n, &dev, &pin);
    if (!e && !dev) e = cudaErrorInvalidValue;
    if (e) goto out;
    op_t *o = calloc(1, sizeof *o);
    if (!o) { e = cudaErrorMemoryAllocation; goto out; }
    o->kind = OP_MEMSET;
    o->dst = dst;
    o->value = (unsigned char)value;
    o->n = n;
    uint64_t seq;
    e = enqueue_locked(s, o, NULL, 0, &seq);
    if (e) free(o);
    else if (sync) {
        wait_seq_locked(s, seq);
        e = after_work(e);
    }
out:
    pthread_mutex_unlock(&g_lock);
    return e;
}

/* ======================================================================== */
/* 9. The exported runtime functions                                        */
/* ======================================================================== */

/* --- errors and versions --- */

EXPORT const char *cudaGetErrorName(cudaError_t error) {
    atomic_fetch_add(&g_calls[F_cudaGetErrorName], 1);
    int i = error_index(error);
    return i < 0 ? "unrecognized error code" : k_errors[i].name;
}

EXPORT const char *cudaGetErrorString(cudaError_t error) {
    atomic_fetch_add(&g_calls[F_cudaGetErrorString], 1);
    for (size_t i = 0; i < sizeof k_texts / sizeof k_texts[0]; i++)
        if (k_texts[i].code == error) return k_texts[i].text;
    int i = error_index(error);
    if (i < 0) return "unrecognized error code";
    pthread_once(&g_derived_once, derive_texts);
    return g_derived[i];
}

EXPORT cudaError_t cudaGetLastError(void) {
    ENTER_ANY_CONTEXT(cudaGetLastError);
    int e = last_error();
    clear_last_error();
    return e;
}

EXPORT cudaError_t cudaPeekAtLastError(void) {
    ENTER_ANY_CONTEXT(cudaPeekAtLastError);
    return last_error();
}

EXPORT cudaError_t cudaRuntimeGetVersion(int *v) {
    ENTER_NO_STICKY(cudaRuntimeGetVersion);
    if (!v) return set_err(cudaErrorInvalidValue);
    *v = g_version;
    return cudaSuccess;
}

EXPORT cudaError_t cudaDriverGetVersion(int *v) {
    ENTER_NO_STICKY(cudaDriverGetVersion);
    if (!v) return set_err(cudaErrorInvalidValue);
    *v = DRIVER_VERSION;
    return cudaSuccess;
}

/* --- devices --- */

EXPORT cudaError_t cudaGetDeviceCount(int *count) {
    ENTER(cudaGetDeviceCount);
    if (!count) return set_err(cudaErrorInvalidValue);
    *count = g_ndev;
    if (g_ndev == 0) return set_err(cudaErrorNoDevice);
    atomic_store(&g_drv_init, 1); /* as current_device */
    return cudaSuccess;
}

EXPORT cudaError_t cudaSetDevice(int device) {
    ENTER(cudaSetDevice);
    if (g_ndev == 0) return set_err(cudaErrorNoDevice);
    if (device < 0 || device >= g_ndev) return set_err(cudaErrorInvalidDevice);
    atomic_store(&g_drv_init, 1); /* as current_device */
    tl_device = device;
    return cudaSuccess;
}

EXPORT cudaError_t cudaGetDevice(int *device) {
    ENTER(cudaGetDevice);
    int d, e = current_device(&d);
    if (e) return set_err(e);
    if (!device) return set_err(cudaErrorInvalidValue);
    *device = d;
    return cudaSuccess;
}

EXPORT cudaError_t cudaDeviceGetAttribute(int *value, int attr, int device) {
    ENTER(cudaDeviceGetAttribute);
    if (g_ndev == 0) return set_err(cudaErrorNoDevice);
    if (device < 0 || device >= g_ndev) return set_err(cudaErrorInvalidDevice);
    if (!value) return set_err(cudaErrorInvalidValue);
    switch (attr) {
    case ATTR_HOST_REGISTER_SUPPORTED:
    case ATTR_HOST_REGISTER_READONLY_SUPPORTED:
    case ATTR_UNIFIED_ADDRESSING:
    case ATTR_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM:
    case ATTR_MULTIPROCESSOR_COUNT: *value = 1; break;
    case ATTR_ASYNC_ENGINE_COUNT: *value = 3; break;
    case ATTR_PCI_BUS_ID: *value = device; break;
    case ATTR_CONCURRENT_MANAGED_ACCESS:
    default: *value = 0; break;
    }
    return cudaSuccess;
}

EXPORT cudaError_t cudaDeviceSynchronize(void) {
    ENTER(cudaDeviceSynchronize);
    int d, e = current_device(&d);
    if (e) return set_err(e);
    pthread_mutex_lock(&g_lock);
    e = after_work(drain_locked(d));
    pthread_mutex_unlock(&g_lock);
    return set_err(e);
}

EXPORT cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
    ENTER(cudaMemGetInfo);
    int d, e = current_device(&d);
    if (e) return set_err(e);
    if (!free_bytes || !total) return set_err(cudaErrorInvalidValue);
    pthread_mutex_lock(&g_lock);
    *free_bytes = (size_t)(g_dev_mem - g_dev[d].used);
    *total = (size_t)g_dev_mem;
    pthread_mutex_unlock(&g_lock);
    return cudaSuccess;
}

static int get_properties(void *prop, int device) {
    if (g_ndev == 0) return set_err(cudaErrorNoDevice);
    if (!prop) return set_err(cudaErrorInvalidValue);
    if (device < 0 || device >= g_ndev) return set_err(cudaErrorInvalidDevice);
    static const char name[] = "Emulated CUDA Device";
    memset(prop, 0, PROP_NAME_LEN);
    memcpy(prop, name, sizeof name);
    size_t total = (size_t)g_dev_mem;
    memcpy((char *)prop + PROP_TOTAL_GLOBAL_MEM_OFFSET, &total, sizeof total);
    return cudaSuccess;
}

EXPORT cudaError_t cudaGetDeviceProperties(void *prop, int device) {
    ENTER(cudaGetDeviceProperties);
    return get_properties(prop, device);
}

EXPORT cudaError_t cudaGetDeviceProperties_v2(void *prop, int device) {
    ENTER(cudaGetDeviceProperties_v2);
    return get_properties(prop, device);
}

EXPORT cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest) {
    ENTER(cudaDeviceGetStreamPriorityRange);
    int d, e = current_device(&d);
    if (e) return set_err(e);
    if (least) *least = 0;
    if (greatest) *greatest = -5;
    return cudaSuccess;
}

/* --- device memory --- */

EXPORT cudaError_t cudaMalloc(void **ptr, size_t size) {
    ENTER(cudaMalloc);
    int d, e = current_device(&d);
    if (e) return set_err(e);
    if (!ptr) return set_err(cudaErrorInvalidValue);
    if (size == 0) { *ptr = NULL; return cudaSuccess; }
    size_t maplen = round_up(size);
    if (maplen < size) return set_err(cudaErrorMemoryAllocation);
    pthread_mutex_lock(&g_lock);
    if (size > g_dev_mem - g_dev[d].used) e = cudaErrorMemoryAllocation;
    else g_dev[d].used += size; /* reserve before unlocking */
    pthread_mutex_unlock(&g_lock);
    if (e) return set_err(e);
    void *p = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    pthread_mutex_lock(&g_lock);
    if (p == MAP_FAILED || !VEC_PUSH(g_devallocs, ((devalloc_t){(uintptr_t)p, size, maplen, d}))) {
        if (p != MAP_FAILED) munmap(p, maplen);
        g_dev[d].used -= size;
        e = cudaErrorMemoryAllocation;
    } else {
        g_counters.device_allocs++;
        g_counters.device_bytes += size;
        *ptr = p;
    }
    pthread_mutex_unlock(&g_lock);
    return set_err(e);
}

EXPORT cudaError_t cudaFree(void *ptr) {
    int st;
    ENTER_RELEASE(cudaFree, st);
    if (!ptr) return set_err(st);
    pthread_mutex_lock(&g_lock);
    size_t i;
    for (i = 0; i < g_devallocs.n; i++)
        if (g_devallocs.v[i].start == (uintptr_t)ptr) break;
    if (i == g_devallocs.n) { /* not the start of a live allocation, or freed already */
        pthread_mutex_unlock(&g_lock);
        return set_err(st ? st : cudaErrorInvalidValue);
    }
    devalloc_t a = g_devallocs.v[i];
    VEC_REMOVE(g_devallocs, i);
    g_dev[a.device].used -= a.size;
    g_counters.device_allocs--;
    g_counters.device_bytes -= a.size;
    freed_add_locked(a.start, a.maplen); /* from now on uses are refused */
    drain_locked(-1);                    /* as the real cudaFree, synchronize first */
    for (i = 0; i < g_freed.n; i++)      /* release the pages, keep the addresses reserved */
        if (g_freed.v[i].start == a.start) {
            mmap((void *)a.start, a.maplen, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
            break;
        }
    pthread_mutex_unlock(&g_lock);
    return set_err(st);
}

/* --- pinned and registered host memory --- */

/* The real cudaHostAlloc promises no page alignment: small blocks come out of
 * a pool, aligned to a few hundred bytes. The emulator is as loose: a block
 * below this size starts HOST_ALLOC_LOOSE_OFFSET bytes into its first page, so
 * that code assuming page alignment (O_DIRECT buffers) fails here, not only on
 * a GPU. Larger blocks are page-aligned. */
enum { HOST_ALLOC_LOOSE_BELOW = 1 << 20, HOST_ALLOC_LOOSE_OFFSET = 256 };

EXPORT cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned flags) {
    ENTER(cudaHostAlloc);
    int d, e = current_device(&d);
    if (e) return set_err(e);
    if (!ptr || (flags & ~(unsigned)HOST_ALLOC_FLAGS)) return set_err(cudaErrorInvalidValue);
    if (size == 0) { *ptr = NULL; return cudaSuccess; }
    size_t off = size < HOST_ALLOC_LOOSE_BELOW ? HOST_ALLOC_LOOSE_OFFSET : 0;
    size_t maplen = round_up(size + off);
    if (maplen < size) return set_err(cudaErrorMemoryAllocation);
    void *p = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return set_err(cudaErrorMemoryAllocation);
    uintptr_t start = (uintptr_t)p + off;
    pthread_mutex_lock(&g_lock);
    if (!VEC_PUSH(g_hostblocks, ((hostblock_t){start, size, (uintptr_t)p, maplen, flags, d}))) {
        munmap(p, maplen);
        e = cudaErrorMemoryAllocation;
    } else {
        g_counters.pinned_allocs++;
        g_counters.pinned_bytes += size;
        *ptr = (void *)start;
    }
    pthread_mutex_unlock(&g_lock);
    return set_err(e);
}

EXPORT cudaError_t cudaFreeHost(void *ptr) {
    int st;
    ENTER_RELEASE(cudaFreeHost, st);
    if (!ptr) return set_err(st);
    pthread_mutex_lock(&g_lock);
    size_t i;
    for (i = 0; i < g_hostblocks.n; i++)
        if (g_hostblocks.v[i].start == (uintptr_t)ptr) break;
    if (i == g_hostblocks.n) {
        pthread_mutex_unlock(&g_lock);
        return set_err(st ? st : cudaErrorInvalidValue);
    }
    hostblock_t b = g_hostblocks.v[i];
    VEC_REMOVE(g_hostblocks, i);
    g_counters.pinned_allocs--;
    g_counters.pinned_bytes -= b.size;
    drain_locked(-1); /* real cudaFreeHost synchronizes every device */
    pthread_mutex_unlock(&g_lock);
    munmap((void *)b.map, b.maplen);
    return set_err(st);
}

/* Registers [ptr, ptr+size) for device `d`, in created context `ctx` with id
 * `ctx_id` (NULL: a primary context), with the rules of cudaHostRegister.
 * Returns a cudaError code; the driver returns it as a CUresult (1, 2 and 712
 * are the same there). */
static int register_range(void *ptr, size_t size, unsigned flags, int d, ctx_t *ctx, uint64_t ctx_id) {
    if (!ptr || size == 0 || (flags & ~(unsigned)HOST_REGISTER_FLAGS)) return cudaErrorInvalidValue;
    uintptr_t p = (uintptr_t)ptr, rs = p & ~(uintptr_t)(PAGE - 1);
    if (p + size < p || p + size + PAGE < p + size) return cudaErrorInvalidValue;
    uintptr_t re = (p + size + PAGE - 1) & ~(uintptr_t)(PAGE - 1);
    pthread_mutex_lock(&g_lock);
    int e = register_conflict_locked(rs, re - rs);
    pthread_mutex_unlock(&g_lock);
    if (!e) e = check_maps(rs, re, (flags & HOST_REGISTER_READONLY) != 0);
    if (e) return e;
    pthread_mutex_lock(&g_lock);
    e = register_conflict_locked(rs, re - rs); /* again: another thread may have won */
    hostreg_t r = {p, rs, re - rs, flags, d, ctx, ctx_id};
    if (!e && !VEC_PUSH(g_hostregs, r)) e = cudaErrorMemoryAllocation;
    if (!e) {
        g_counters.registrations++;
        g_counters.registered_bytes += re - rs;
    }
    pthread_mutex_unlock(&g_lock);
    return e;
}

EXPORT cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned flags) {
    ENTER(cudaHostRegister);
    int d, e = current_device(&d);
    if (e) return set_err(e);
    return set_err(register_range(ptr, size, flags, d, NULL, 0));
}

EXPORT cudaError_t cudaHostUnregister(void *ptr) {
    int st;
    ENTER_RELEASE(cudaHostUnregister, st);
    int e = cudaErrorHostMemoryNotRegistered;
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; ptr && i < g_hostregs.n; i++)
        if (g_hostregs.v[i].orig == (uintptr_t)ptr && !g_hostregs.v[i].ctx) { /* the primary context's */
            g_counters.registrations--;
            g_counters.registered_bytes -= g_hostregs.v[i].len;
            VEC_REMOVE(g_hostregs, i);
            e = cudaSuccess;
            break;
        }
    pthread_mutex_unlock(&g_lock);
    return set_err(st ? st : e);
}

EXPORT cudaError_t cudaHostGetDevicePointer(void **dptr, void *hptr, unsigned flags) {
    ENTER(cudaHostGetDevicePointer);
    if (!dptr || !hptr || flags != 0) return set_err(cudaErrorInvalidValue);
    pthread_mutex_lock(&g_lock);
    int ok = hostblock_find((uintptr_t)hptr, 1) || hostreg_find((uintptr_t)hptr, 1);
    pthread_mutex_unlock(&g_lock);
    if (!ok) return set_err(cudaErrorInvalidValue);
    *dptr = hptr; /* unified addressing: the same address */
    return cudaSuccess;
}

EXPORT cudaError_t cudaHostGetFlags(unsigned *flags, void *hptr) {
    ENTER(cudaHostGetFlags);
    if (!flags || !hptr) return set_err(cudaErrorInvalidValue);
    int e = cudaSuccess;
    pthread_mutex_lock(&g_lock);
    hostblock_t *b = hostblock_find((uintptr_t)hptr, 1);
    hostreg_t *r = b ? NULL : hostreg_find((uintptr_t)hptr, 1);
    if (b) *flags = b->flags;
    else if (r) *flags = r->flags;
    else e = cudaErrorInvalidValue;
    pthread_mutex_unlock(&g_lock);
    return set_err(e);
}

EXPORT cudaError_t cudaPointerGetAttributes(void *attributes, const void *ptr) {
    ENTER(cudaPointerGetAttributes);
    if (!attributes) return set_err(cudaErrorInvalidValue);
    struct { uint32_t type; int device; const void *dptr, *hptr; } a = {MEMTYPE_UNREGISTERED, -2, NULL, NULL};
    pthread_mutex_lock(&g_lock);
    devalloc_t *d = ptr ? devalloc_find((uintptr_t)ptr) : NULL;
    hostblock_t *b = ptr && !d ? hostblock_find((uintptr_t)ptr, 1) : NULL;
    hostreg_t *r = ptr && !d && !b ? hostreg_find((uintptr_t)ptr, 1) : NULL;
    if (d) a = (typeof(a)){MEMTYPE_DEVICE, d->device, ptr, NULL};
    else if (b) a = (typeof(a)){MEMTYPE_HOST, b->device, ptr, ptr};
    else if (r) a = (typeof(a)){MEMTYPE_HOST, r->device, ptr, ptr};
    pthread_mutex_unlock(&g_lock);
    memcpy(attributes, &a, 24); /* type_, device, devicePointer, hostPointer */
    return cudaSuccess;
}

/* --- copies and memset --- */

EXPORT cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, int kind) {
    ENTER(cudaMemcpy);
    return set_err(do_copy(dst, src, n, kind, NULL, 1));
}

EXPORT cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, cudaStream_t stream) {
    ENTER(cudaMemcpyAsync);
    return set_err(do_copy(dst, src, n, kind, stream, 0));
}

EXPORT cudaError_t cudaMemset(void *dst, int value, size_t n) {
    ENTER(cudaMemset);
    /* Like the real runtime, a memset of device memory is asynchronous to
     * the host, on the legacy stream. */
    return set_err(do_memset(dst, value, n, NULL, 0));
}

EXPORT cudaError_t cudaMemsetAsync(void *dst, int value, size_t n, cudaStream_t stream) {
    ENTER(cudaMemsetAsync);
    return set_err(do_memset(dst, value, n, stream, 0));
}

/* --- streams --- */

static int create_stream(cudaStream_t *out, unsigned flags, int priority) {
    if (!out || (flags & ~(unsigned)STREAM_NONBLOCKING)) return cudaErrorInvalidValue;
    int d, e = current_device(&d);
    if (e) return e;
    if (priority > 0) priority = 0;
    if (priority < -5) priority = -5;
    pthread_mutex_lock(&g_lock);
    stream *s;
    e = stream_new_locked(d, flags, priority, 0, &s);
    if (!e) {
        g_counters.streams++;
        *out = s;
    }
    pthread_mutex_unlock(&g_lock);
    return e;
}

EXPORT cudaError_t cudaStreamCreate(cudaStream_t *out) {
    ENTER(cudaStreamCreate);
    return set_err(create_stream(out, 0, 0));
}

EXPORT cudaError_t cudaStreamCreateWithFlags(cudaStream_t *out, unsigned flags) {
    ENTER(cudaStreamCreateWithFlags);
    return set_err(create_stream(out, flags, 0));
}

EXPORT cudaError_t cudaStreamCreateWithPriority(cudaStream_t *out, unsigned flags, int priority) {
    ENTER(cudaStreamCreateWithPriority);
    return set_err(create_stream(out, flags, priority));
}

EXPORT cudaError_t cudaStreamDestroy(cudaStream_t h) {
    int st;
    ENTER_RELEASE(cudaStreamDestroy, st);
    int e = cudaErrorInvalidResourceHandle;
    pthread_mutex_lock(&g_lock);
    if ((uintptr_t)h > 2)
        for (stream *s = g_streams; s; s = s->next_all)
            if (s == h && s->live && !s->legacy) {
                s->live = 0;
                s->destroyed = 1; /* the worker drains the queue, then exits */
                cv_broadcast(&s->work_cv);
                g_counters.streams--;
                stream_unref_locked(s);
                e = cudaSuccess;
                break;
            }
    pthread_mutex_unlock(&g_lock);
    return set_err(st ? st : e);
}

EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t h) {
    ENTER(cudaStreamSynchronize);
    pthread_mutex_lock(&g_lock);
    stream *s;
    int e = resolve_stream_locked(h, &s);
    if (!e) wait_seq_locked(s, s->enq_seq);
    pthread_mutex_unlock(&g_lock);
    return set_err(after_work(e));
}

EXPORT cudaError_t cudaStreamQuery(cudaStream_t h) {
    ENTER(cudaStreamQuery);
    pthread_mutex_lock(&g_lock);
    stream *s;
    int e = resolve_stream_locked(h, &s);
    if (!e && pending(s)) e = cudaErrorNotReady;
    pthread_mutex_unlock(&g_lock);
    return ret(after_work(e));
}

EXPORT cudaError_t cudaStreamWaitEvent(cudaStream_t h, cudaEvent_t event_h, unsigned flags) {
    ENTER(cudaStreamWaitEvent);
    if (flags & ~1u) return set_err(cudaErrorInvalidValue); /* Default 0, External 1 */
    pthread_mutex_lock(&g_lock);
    stream *s;
    int e = resolve_stream_locked(h, &s);
    event *ev = e ? NULL : find_event_locked(event_h);
    if (!e && !ev) e = cudaErrorInvalidResourceHandle;
    if (!e && !event_done(ev)) { /* a never-recorded or completed event: nothing to wait for */
        op_t *o = calloc(1, sizeof *o);
        if (!o) e = cudaErrorMemoryAllocation;
        else {
            o->kind = OP_WAIT;
            e = enqueue_locked(s, o, ev->last_stream, ev->last_seq, NULL);
            if (e) free(o);
        }
    }
    pthread_mutex_unlock(&g_lock);
    return set_err(e);
}

EXPORT cudaError_t cudaLaunchHostFunc(cudaStream_t h, cudaHostFn_t fn, void *user_data) {
    ENTER(cudaLaunchHostFunc);
    if (!fn) return set_err(cudaErrorInvalidValue);
    pthread_mutex_lock(&g_lock);
    stream *s;
    int e = resolve_stream_locked(h, &s);
    if (!e) {
        op_t *o = calloc(1, sizeof *o);
        if (!o) e = cudaErrorMemoryAllocation;
        else {
            o->kind = OP_HOSTFN;
            o->fn = fn;
            o->arg = user_data;
            e = enqueue_locked(s, o, NULL, 0, NULL);
            if (e) free(o);
        }
    }
    pthread_mutex_unlock(&g_lock);
    return set_err(e);
}

/* --- kernels: libraries of PTX text, and the kernels the emulator can run --- */

typedef struct { unsigned x, y, z; } dim3;

/* A kernel the emulator runs on the host in place of the device code of the
 * same entry name. Its parameters are 8 bytes each (pointers and 64-bit
 * integers), copied at launch as the runtime copies them. `check` runs on the
 * stream's worker (g_lock held) just before `run`: it says whether every
 * address the device code would touch is memory the device may use; when not,
 * the launch fails as a device fault does, with the sticky
 * cudaErrorIllegalAddress. */
struct emu_kernel {
    const char *name;
    int nparams;
    int (*check_locked)(const uint64_t *p);
    void (*run)(const uint64_t *p);
};

/* Memory [p, p+n) the device may read: inside one device allocation, a
 * pinned block or a registration the runtime sees. */
static int device_readable_locked(uintptr_t p, size_t n) {
    if (p + n < p) return 0;
    devalloc_t *d = devalloc_find(p);
    if (d) return n <= d->size - (p - d->start);
    return hostblock_find(p, n) || hostreg_find(p, n);
}

/* Device memory [p, p+n) the device may write: inside one allocation. */
static int device_writable_locked(uintptr_t p, size_t n) {
    if (p + n < p) return 0;
    devalloc_t *d = devalloc_find(p);
    return d && n <= d->size - (p - d->start);
}

/* wirespeed_gather(dst, src, offsets, n, rec): record k of the batch (`rec`
 * bytes at dst + k * rec) is the `rec` bytes at src + offsets[k]. */
static int gather_check_locked(const uint64_t *p) {
    uintptr_t dst = p[0], src = p[1], off = p[2];
    uint64_t n = p[3], rec = p[4];
    if (n == 0) return 1;
    if (rec == 0 || n > UINT64_MAX / rec || n > UINT64_MAX / 8) return 0;
    if (!device_writable_locked(dst, n * rec) || !device_readable_locked(off, n * 8)) return 0;
    const uint64_t *offsets = (const uint64_t *)off;
    for (uint64_t k = 0; k < n; k++)
        if (offsets[k] > UINTPTR_MAX - src || !device_readable_locked(src + offsets[k], rec)) return 0;
    /* The device writes the batch while it reads the records: they must not overlap. */
    for (uint64_t k = 0; k < n; k++)
        if (overlaps(dst, n * rec, src + offsets[k], rec)) return 0;
    return 1;
}

static void gather_run(const uint64_t *p) {
    unsigned char *dst = (unsigned char *)(uintptr_t)p[0];
    const unsigned char *src = (const unsigned char *)(uintptr_t)p[1];
    const uint64_t *offsets = (const uint64_t *)(uintptr_t)p[2];
    uint64_t n = p[3], rec = p[4];
    for (uint64_t k = 0; k < n; k++) memcpy(dst + k * rec, src + offsets[k], rec);
}

/* wirespeed_gather_perm(dst, src, n, rec, first, count, key, bits): record k
 * of the batch is record perm((first + k) mod count) of the packed records at
 * src, perm being wirespeed-pinned's Permutation (a Feistel network of four
 * rounds over (bits >> 8) + (bits & 0xff) bits, walked below count). */
static uint64_t emu_mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t emu_mask(unsigned bits) { return bits >= 64 ? UINT64_MAX : (1ull << bits) - 1; }

static uint64_t emu_permute(uint64_t i, uint64_t count, uint64_t key, unsigned hi_bits, unsigned lo_bits) {
    if (hi_bits + lo_bits == 0) return i;
    uint64_t x = i;
    do {
        unsigned a = hi_bits, b = lo_bits;
        uint64_t hi = x >> b, lo = x & emu_mask(b);
        for (uint64_t round = 0; round < 4; round++) {
            uint64_t f = emu_mix(key ^ ((round + 1) * 0x9e3779b97f4a7c15ull) ^ lo) & emu_mask(a);
            uint64_t t = lo;
            lo = hi ^ f;
            hi = t;
            unsigned w = a;
            a = b;
            b = w;
        }
        x = (hi << b) | lo;
    } while (x >= count);
    return x;
}

static int gather_perm_check_locked(const uint64_t *p) {
    uintptr_t dst = p[0], src = p[1];
    uint64_t n = p[2], rec = p[3], count = p[5], bits = p[7];
    if (n == 0) return 1;
    if (rec == 0 || count == 0 || n > UINT64_MAX / rec || count > UINT64_MAX / rec) return 0;
    if ((bits >> 8) + (bits & 0xff) > 64) return 0;
    if (!device_writable_locked(dst, n * rec) || !device_readable_locked(src, count * rec)) return 0;
    return !overlaps(dst, n * rec, src, count * rec);
}

static void gather_perm_run(const uint64_t *p) {
    unsigned char *dst = (unsigned char *)(uintptr_t)p[0];
    const unsigned char *src = (const unsigned char *)(uintptr_t)p[1];
    uint64_t n = p[2], rec = p[3], first = p[4], count = p[5], key = p[6], bits = p[7];
    for (uint64_t k = 0; k < n; k++) {
        uint64_t r = emu_permute((first + k) % count, count, key, (unsigned)(bits >> 8), (unsigned)(bits & 0xff));
        memcpy(dst + k * rec, src + r * rec, rec);
    }
}

static const kernel_def k_kernels[] = {
    {"wirespeed_gather", 5, gather_check_locked, gather_run},
    {"wirespeed_gather_perm", 8, gather_perm_check_locked, gather_perm_run},
    {"wirespeed_gather_dev", 5, gather_check_locked, gather_run},
    {"wirespeed_gather_perm_dev", 8, gather_perm_check_locked, gather_perm_run},
};
#define NKERNELS (sizeof k_kernels / sizeof k_kernels[0])

/* A loaded library: the entries its PTX declares; refs[i] is the handle
 * cudaLibraryGetKernel hands out for entries[i] (def: the emulator's kernel of
 * that name, or NULL). */
typedef struct emu_library library;
typedef struct { library *lib; const kernel_def *def; } kernel_ref;
struct emu_library {
    library *next_all;
    int nentries;
    char **entries;
    kernel_ref *refs;
};
static library *g_libraries; /* live libraries (under g_lock) */

static void library_free(library *l) {
    for (int i = 0; i < l->nentries; i++) free(l->entries[i]);
    free(l->entries);
    free(l->refs);
    free(l);
}

/* The entry names of PTX text (".entry NAME("), or -1 when `code` is not
 * PTX (no ".version" and ".target" directives): the emulator runs no other
 * image. */
static int parse_ptx_entries(const char *code, library *l) {
    if (!strstr(code, ".version") || !strstr(code, ".target")) return -1;
    for (const char *p = strstr(code, ".entry"); p; p = strstr(p + 6, ".entry")) {
        const char *q = p + 6;
        while (*q == ' ' || *q == '\t') q++;
        size_t len = strspn(q, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_$");
        if (len == 0) continue;
        char **e = realloc(l->entries, (size_t)(l->nentries + 1) * sizeof *e);
        if (!e) return -2;
        l->entries = e;
        if (!(l->entries[l->nentries] = strndup(q, len))) return -2;
        l->nentries++;
    }
    return 0;
}

EXPORT cudaError_t cudaLibraryLoadData(void **out, const void *code, void *jit_options, void **jit_values,
                                       unsigned n_jit, void *lib_options, void **lib_values, unsigned n_lib) {
    ENTER(cudaLibraryLoadData);
    (void)jit_options; (void)jit_values; (void)lib_options; (void)lib_values;
    if (!out || !code || (n_jit && !jit_options) || (n_lib && !lib_options)) return set_err(cudaErrorInvalidValue);
    library *l = calloc(1, sizeof *l);
    if (!l) return set_err(cudaErrorMemoryAllocation);
    int r = parse_ptx_entries(code, l);
    if (r == 0 && !(l->refs = calloc((size_t)(l->nentries ? l->nentries : 1), sizeof *l->refs))) r = -2;
    if (r != 0) {
        library_free(l);
        if (r == -1) fprintf(stderr, "cudart_emu: cudaLibraryLoadData: the emulator loads PTX text only\n");
        return set_err(r == -1 ? cudaErrorInvalidPtx : cudaErrorMemoryAllocation);
    }
    for (int i = 0; i < l->nentries; i++) {
        l->refs[i].lib = l;
        for (size_t k = 0; k < NKERNELS; k++)
            if (strcmp(k_kernels[k].name, l->entries[i]) == 0) l->refs[i].def = &k_kernels[k];
    }
    pthread_mutex_lock(&g_lock);
    l->next_all = g_libraries;
    g_libraries = l;
    g_counters.libraries++;
    pthread_mutex_unlock(&g_lock);
    *out = l;
    return set_err(cudaSuccess);
}

EXPORT cudaError_t cudaLibraryUnload(void *h) {
    int st;
    ENTER_RELEASE(cudaLibraryUnload, st);
    int e = cudaErrorInvalidResourceHandle;
    pthread_mutex_lock(&g_lock);
    for (library **pp = &g_libraries; *pp; pp = &(*pp)->next_all)
        if (*pp == h) {
            library *l = *pp;
            *pp = l->next_all;
            g_counters.libraries--;
            library_free(l); /* queued launches hold a copy of what they run */
            e = cudaSuccess;
            break;
        }
    pthread_mutex_unlock(&g_lock);
    return set_err(st ? st : e);
}

EXPORT cudaError_t cudaLibraryGetKernel(void **out, void *h, const char *name) {
    ENTER(cudaLibraryGetKernel);
    if (!out || !name) return set_err(cudaErrorInvalidValue);
    int e = cudaErrorInvalidResourceHandle;
    pthread_mutex_lock(&g_lock);
    for (library *l = g_libraries; l; l = l->next_all)
        if (l == h) {
            e = cudaErrorSymbolNotFound;
            for (int i = 0; i < l->nentries; i++)
                if (strcmp(l->entries[i], name) == 0) {
                    if (!l->refs[i].def) {
                        fprintf(stderr, "cudart_emu: the emulator cannot run kernel %s (it runs the workspace's own only)\n",
                                name);
                        e = cudaErrorNotSupported;
                    } else {
                        *out = &l->refs[i];
                        e = cudaSuccess;
                    }
                    break;
                }
            break;
        }
    pthread_mutex_unlock(&g_lock);
    return set_err(e);
}

/* The live kernel handle `f`, or NULL. g_lock held. */
static const kernel_def *find_kernel_locked(const void *f) {
    for (library *l = g_libraries; l; l = l->next_all)
        for (int i = 0; i < l->nentries; i++)
            if ((const void *)&l->refs[i] == f) return l->refs[i].def;
    return NULL;
}

/* cudaSuccess, or what the runtime answers for a launch shape it refuses:
 * cudaErrorInvalidConfiguration for a zero or too large grid, and (as the
 * real runtime does) cudaErrorInvalidValue for a block of too many threads or
 * too much shared memory. */
static int launch_config_error(dim3 g, dim3 b, size_t smem) {
    if (!g.x || !g.y || !g.z || !b.x || !b.y || !b.z) return cudaErrorInvalidConfiguration;
    if (g.x > 0x7fffffffu || g.y > 65535 || g.z > 65535) return cudaErrorInvalidConfiguration;
    if (b.x > 1024 || b.y > 1024 || b.z > 64 || (uint64_t)b.x * b.y * b.z > 1024) return cudaErrorInvalidValue;
    return smem <= 48 * 1024 ? cudaSuccess : cudaErrorInvalidValue;
}

EXPORT cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t smem, cudaStream_t h) {
    ENTER(cudaLaunchKernel);
    int bad = launch_config_error(grid, block, smem);
    if (bad) return set_err(bad);
    pthread_mutex_lock(&g_lock);
    const kernel_def *k = find_kernel_locked(func);
    stream *s = NULL;
    int e = k ? resolve_stream_locked(h, &s) : cudaErrorInvalidDeviceFunction;
    if (!e && k->nparams > 0 && !args) e = cudaErrorInvalidValue;
    for (int i = 0; !e && i < k->nparams; i++)
        if (!args[i]) e = cudaErrorInvalidValue;
    if (!e) {
        op_t *o = calloc(1, sizeof *o);
        if (!o) e = cudaErrorMemoryAllocation;
        else {
            o->kind = OP_KERNEL;
            o->kern = k;
            for (int i = 0; i < k->nparams; i++) memcpy(&o->params[i], args[i], sizeof o->params[i]);
            e = enqueue_locked(s, o, NULL, 0, NULL);
            if (e) free(o);
        }
    }
    pthread_mutex_unlock(&g_lock);
    return set_err(e);
}

/* On the stream's worker: the device code's effect, or a device fault. */
static void run_kernel(op_t *o) {
    pthread_mutex_lock(&g_lock);
    int ok = o->kern->check_locked(o->params);
    g_counters.kernel_launches++;
    pthread_mutex_unlock(&g_lock);
    if (ok) {
        o->kern->run(o->params);
        return;
    }
    fprintf(stderr, "cudart_emu: kernel %s touched memory the device may not use: cudaErrorIllegalAddress (sticky)\n",
            o->kern->name);
    atomic_store(&g_sticky, cudaErrorIllegalAddress);
}

/* --- events --- */

static int create_event(cudaEvent_t *out, unsigned flags) {
    if (!out || (flags & ~(unsigned)EVENT_FLAGS)) return cudaErrorInvalidValue;
    if ((flags & EVENT_INTERPROCESS) && !(flags & EVENT_DISABLE_TIMING)) return cudaErrorInvalidValue;
    int d, e = current_device(&d);
    if (e) return e;
    event *ev = calloc(1, sizeof *ev);
    if (!ev) return cudaErrorMemoryAllocation;
    ev->flags = flags;
    ev->live = 1;
    ev->refs = 1;
    pthread_mutex_lock(&g_lock);
    ev->next_all = g_events;
    g_events = ev;
    g_counters.events++;
    *out = ev;
    pthread_mutex_unlock(&g_lock);
    return cudaSuccess;
}

EXPORT cudaError_t cudaEventCreate(cudaEvent_t *out) {
    ENTER(cudaEventCreate);
    return set_err(create_event(out, 0));
}

EXPORT cudaError_t cudaEventCreateWithFlags(cudaEvent_t *out, unsigned flags) {
    ENTER(cudaEventCreateWithFlags);
    return set_err(create_event(out, flags));
}

EXPORT cudaError_t cudaEventRecord(cudaEvent_t event_h, cudaStream_t h) {
    ENTER(cudaEventRecord);
    pthread_mutex_lock(&g_lock);
    event *ev = find_event_locked(event_h);
    stream *s = NULL;
    int e = ev ? resolve_stream_locked(h, &s) : cudaErrorInvalidResourceHandle;
    op_t *o = e ? NULL : calloc(1, sizeof *o);
    if (!e && !o) e = cudaErrorMemoryAllocation;
    if (!e) {
        o->kind = OP_EVENT;
        o->ev = ev;
        o->ev_gen = ev->gen + 1;
        uint64_t seq;
        e = enqueue_locked(s, o, NULL, 0, &seq);
        if (e) free(o);
        else {
            ev->refs++; /* held by the marker */
            ev->gen++;
            s->refs++;
            if (ev->last_stream) stream_unref_locked(ev->last_stream);
            ev->last_stream = s;
            ev->last_seq = seq;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return set_err(e);
}

EXPORT cudaError_t cudaEventQuery(cudaEvent_t event_h) {
    ENTER(cudaEventQuery);
    pthread_mutex_lock(&g_lock);
    event *ev = find_event_locked(event_h);
    int e = !ev ? cudaErrorInvalidResourceHandle : event_done(ev) ? cudaSuccess : cudaErrorNotReady;
    pthread_mutex_unlock(&g_lock);
    return ret(after_work(e));
}

EXPORT cudaError_t cudaEventSynchronize(cudaEvent_t event_h) {
    ENTER(cudaEventSynchronize);
    pthread_mutex_lock(&g_lock);
    event *ev = find_event_locked(event_h);
    int e = ev ? cudaSuccess : cudaErrorInvalidResourceHandle;
    if (ev && !event_done(ev)) {
        uint64_t target = ev->gen;
        stream *s = ev->last_stream;
        ev->refs++;
        s->refs++;
        while (ev->done_gen < target) cv_wait(&s->done_cv);
        stream_unref_locked(s);
        event_unref_locked(ev);
    }
    pthread_mutex_unlock(&g_lock);
    return set_err(after_work(e));
}

static int elapsed(float *ms, cudaEvent_t start_h, cudaEvent_t end_h) {
    if (!ms) return cudaErrorInvalidValue;
    pthread_mutex_lock(&g_lock);
    event *a = find_event_locked(start_h), *b = find_event_locked(end_h);
    int e = cudaSuccess;
    if (!a || !b) e = cudaErrorInvalidResourceHandle;
    else if ((a->flags | b->flags) & EVENT_DISABLE_TIMING) e = cudaErrorInvalidResourceHandle;
    else if (a->gen == 0 || b->gen == 0) e = cudaErrorInvalidResourceHandle; /* never recorded */
    else if (!event_done(a) || !event_done(b)) e = cudaErrorNotReady;
    else {
        double d = (double)(b->done_time.tv_sec - a->done_time.tv_sec) * 1e3 +
                   (double)(b->done_time.tv_nsec - a->done_time.tv_nsec) / 1e6;
        *ms = (float)d;
    }
    pthread_mutex_unlock(&g_lock);
    return e;
}

EXPORT cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    ENTER(cudaEventElapsedTime);
    return ret(elapsed(ms, start, end));
}

EXPORT cudaError_t cudaEventElapsedTime_v2(float *ms, cudaEvent_t start, cudaEvent_t end) {
    ENTER(cudaEventElapsedTime_v2);
    return ret(elapsed(ms, start, end));
}

EXPORT cudaError_t cudaEventDestroy(cudaEvent_t event_h) {
    int st;
    ENTER_RELEASE(cudaEventDestroy, st);
    pthread_mutex_lock(&g_lock);
    event *ev = find_event_locked(event_h);
    if (ev) {
        ev->live = 0;
        g_counters.events--;
        event_unref_locked(ev); /* pending markers keep it until they ran */
    }
    pthread_mutex_unlock(&g_lock);
    return set_err(st ? st : ev ? cudaSuccess : cudaErrorInvalidResourceHandle);
}

/* ======================================================================== */
/* 10. The driver API: contexts and host registration                       */
/* ======================================================================== */

static const struct { int code; const char *name; } k_drv_errors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS"},
#define X(n, v) {v, "CUDA_ERROR_" #n},
    DRV_ERRORS(X)
#undef X
};
#define NDRV_ERRORS (sizeof k_drv_errors / sizeof k_drv_errors[0])

/* Descriptions as the driver words them, for the codes met here. */
static const struct { int code; const char *text; } k_drv_texts[] = {
    {CUDA_SUCCESS, "no error"},
    {CUDA_ERROR_INVALID_VALUE, "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "initialization error"},
    {CUDA_ERROR_DEVICE_UNAVAILABLE, "CUDA-capable device(s) is/are busy or unavailable"},
    {CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "invalid device context"},
    {CUDA_ERROR_ILLEGAL_STATE, "the operation cannot be performed in the present state"},
    {CUDA_ERROR_CONTEXT_IS_DESTROYED, "context is destroyed"},
    {CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "part or all of the requested memory range is already mapped"},
    {CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "pointer does not correspond to a registered memory region"},
    {CUDA_ERROR_NOT_PERMITTED, "operation not permitted"},
    {CUDA_ERROR_NOT_SUPPORTED, "operation not supported"},
    {CUDA_ERROR_UNKNOWN, "unknown error"},
};

EXPORT CUresult cuGetErrorName(CUresult error, const char **str) {
    atomic_fetch_add(&g_calls[F_cuGetErrorName], 1);
    if (!str) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < NDRV_ERRORS; i++)
        if (k_drv_errors[i].code == error) {
            *str = k_drv_errors[i].name;
            return CUDA_SUCCESS;
        }
    *str = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuGetErrorString(CUresult error, const char **str) {
    atomic_fetch_add(&g_calls[F_cuGetErrorString], 1);
    if (!str) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof k_drv_texts / sizeof k_drv_texts[0]; i++)
        if (k_drv_texts[i].code == error) {
            *str = k_drv_texts[i].text;
            return CUDA_SUCCESS;
        }
    for (size_t i = 0; i < NDRV_ERRORS; i++) /* the others: the name is the description */
        if (k_drv_errors[i].code == error) {
            *str = k_drv_errors[i].name;
            return CUDA_SUCCESS;
        }
    *str = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuInit(unsigned flags) {
    DENTER(cuInit);
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (g_ndev == 0) return CUDA_ERROR_NO_DEVICE;
    atomic_store(&g_drv_init, 1);
    return CUDA_SUCCESS;
}

#define NEED_INIT() \
    do { if (!atomic_load(&g_drv_init)) return CUDA_ERROR_NOT_INITIALIZED; } while (0)

EXPORT CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
    DENTER(cuDeviceGet);
    NEED_INIT();
    if (!dev) return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= g_ndev) return CUDA_ERROR_INVALID_DEVICE;
    *dev = ordinal;
    return CUDA_SUCCESS;
}

static int is_primary(const ctx_t *c) { return c >= g_primary_ctx && c < g_primary_ctx + MAX_DEVICES; }

/* A live context with this handle (a created one or a primary one), or NULL. g_lock held. */
static ctx_t *find_ctx_locked(CUcontext h) {
    if (!h) return NULL;
    if (is_primary(h)) return h->device < g_ndev ? h : NULL;
    for (ctx_t *c = g_ctxs; c; c = c->next_all)
        if (c == h) return c;
    return NULL;
}

/* The calling thread's current context: the top of its stack, else (as after
 * the runtime set the thread up) the primary context of its current device.
 * CUDA_ERROR_CONTEXT_IS_DESTROYED when the top was destroyed. g_lock held. */
static int current_ctx_locked(ctx_t **out) {
    if (tl_nctx == 0) {
        if (g_ndev == 0) return CUDA_ERROR_NO_DEVICE;
        *out = &g_primary_ctx[tl_device];
        return CUDA_SUCCESS;
    }
    ctx_ref r = tl_ctx[tl_nctx - 1];
    if (r.primary) { *out = r.p; return CUDA_SUCCESS; }
    ctx_t *c = find_ctx_locked(r.p);
    if (!c || c->id != r.id) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    *out = c;
    return CUDA_SUCCESS;
}

static int push_ctx(ctx_t *c) {
    if (tl_nctx == CTX_STACK_MAX) return CUDA_ERROR_OUT_OF_MEMORY;
    tl_ctx[tl_nctx++] = (ctx_ref){c, c->id, c->primary};
    return CUDA_SUCCESS;
}

/* True when a queued or running copy reads or writes host memory in
 * [start, start+len) directly (not a staged copy of pageable memory). g_lock held. */
static int copy_uses_locked(uintptr_t start, size_t len) {
    for (stream *s = g_streams; s; s = s->next_all) {
        for (op_t *o = s->running ? s->running : s->head; o; o = o == s->running ? s->head : o->next) {
            if (o->kind != OP_COPY || !o->n) continue;
            if (overlaps((uintptr_t)o->dst, o->n, start, len)) return 1;
            if (!o->staging && overlaps((uintptr_t)o->src, o->n, start, len)) return 1;
        }
    }
    return 0;
}

/* Removes registration i; in a created context the driver does not wait for
 * the copies that use it, so one still queued or running is a violation of the
 * caller's duty: counted, reported, and (unless `force`) refused. g_lock held.
 * Returns CUDA_SUCCESS or CUDA_ERROR_ILLEGAL_STATE. */
static int unregister_locked(size_t i, const char *fn, int force) {
    hostreg_t r = g_hostregs.v[i];
    if (r.ctx && copy_uses_locked(r.start, r.len)) {
        g_counters.unregister_violations++;
        fprintf(stderr,
                "cudart_emu: %s(%p): a copy queued or running on a stream still uses this registered memory; "
                "in a context made with cuCtxCreate the driver does not wait for it: wait for the copy's event first%s\n",
                fn, (void *)r.orig, force ? " (unregistered anyway)" : " (refused)");
        if (!force) return CUDA_ERROR_ILLEGAL_STATE;
    }
    g_counters.registrations--;
    g_counters.registered_bytes -= r.len;
    VEC_REMOVE(g_hostregs, i);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned flags, CUdevice dev) {
    DENTER(cuCtxCreate_v2);
    NEED_INIT();
    if (!pctx || (flags & ~(unsigned)CU_CTX_FLAGS_MASK)) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= g_ndev) return CUDA_ERROR_INVALID_DEVICE;
    int forced = atomic_load(&g_ctx_create_error);
    if (forced) return forced;
    if (tl_nctx == CTX_STACK_MAX) return CUDA_ERROR_OUT_OF_MEMORY;
    ctx_t *c = calloc(1, sizeof *c);
    if (!c) return CUDA_ERROR_OUT_OF_MEMORY;
    c->device = dev;
    c->flags = flags;
    pthread_mutex_lock(&g_lock);
    c->id = g_next_ctx_id++;
    c->next_all = g_ctxs;
    g_ctxs = c;
    g_counters.contexts++;
    pthread_mutex_unlock(&g_lock);
    push_ctx(c); /* cuCtxCreate makes the new context current */
    *pctx = c;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext h) {
    int st;
    DENTER_RELEASE(cuCtxDestroy_v2, st);
    NEED_INIT();
    pthread_mutex_lock(&g_lock);
    ctx_t *c = find_ctx_locked(h);
    if (!c || c->primary) {
        pthread_mutex_unlock(&g_lock);
        return st ? st : CUDA_ERROR_INVALID_CONTEXT;
    }
    for (ctx_t **pp = &g_ctxs; *pp; pp = &(*pp)->next_all)
        if (*pp == c) { *pp = c->next_all; break; }
    for (size_t i = 0; i < g_hostregs.n;) /* its registrations go with it */
        if (g_hostregs.v[i].ctx == c && g_hostregs.v[i].ctx_id == c->id) unregister_locked(i, "cuCtxDestroy_v2", 1);
        else i++;
    g_counters.contexts--;
    pthread_mutex_unlock(&g_lock);
    if (tl_nctx > 0 && tl_ctx[tl_nctx - 1].p == c && tl_ctx[tl_nctx - 1].id == c->id) tl_nctx--;
    free(c);
    return st;
}

EXPORT CUresult cuCtxPushCurrent_v2(CUcontext h) {
    DENTER(cuCtxPushCurrent_v2);
    NEED_INIT();
    pthread_mutex_lock(&g_lock);
    ctx_t *c = find_ctx_locked(h);
    int e = c ? push_ctx(c) : CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_unlock(&g_lock);
    return e;
}

EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx) {
    DENTER(cuCtxPopCurrent_v2);
    NEED_INIT();
    if (tl_nctx == 0) return CUDA_ERROR_INVALID_CONTEXT;
    ctx_ref r = tl_ctx[--tl_nctx];
    if (pctx) *pctx = r.p;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx) {
    DENTER(cuCtxGetCurrent);
    NEED_INIT();
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    *pctx = tl_nctx ? tl_ctx[tl_nctx - 1].p : g_ndev ? &g_primary_ctx[tl_device] : NULL;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext h) {
    DENTER(cuCtxSetCurrent);
    NEED_INIT();
    if (!h) { /* unbinds the current one */
        if (tl_nctx) tl_nctx--;
        return CUDA_SUCCESS;
    }
    pthread_mutex_lock(&g_lock);
    ctx_t *c = find_ctx_locked(h);
    int e = CUDA_ERROR_INVALID_CONTEXT;
    if (c && tl_nctx) { /* replaces the top */
        tl_ctx[tl_nctx - 1] = (ctx_ref){c, c->id, c->primary};
        e = CUDA_SUCCESS;
    } else if (c) {
        e = push_ctx(c);
    }
    pthread_mutex_unlock(&g_lock);
    return e;
}

EXPORT CUresult cuMemHostRegister_v2(void *ptr, size_t size, unsigned flags) {
    DENTER(cuMemHostRegister_v2);
    NEED_INIT();
    if (flags & ~(unsigned)CU_MEMHOSTREGISTER_FLAGS) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    ctx_t *c = NULL;
    int e = current_ctx_locked(&c);
    int device = e ? 0 : c->device;
    uint64_t id = e ? 0 : c->id;
    ctx_t *owner = e || c->primary ? NULL : c;
    pthread_mutex_unlock(&g_lock);
    if (e) return e;
    /* (Destroying the context meanwhile, on another thread, is the caller's race,
     * as with the driver: the registration then outlives it, counted.) */
    return register_range(ptr, size, flags, device, owner, id);
}

EXPORT CUresult cuMemHostUnregister(void *ptr) {
    int st;
    DENTER_RELEASE(cuMemHostUnregister, st);
    NEED_INIT();
    pthread_mutex_lock(&g_lock);
    ctx_t *c = NULL;
    int e = current_ctx_locked(&c);
    ctx_t *want = !e && !c->primary ? c : NULL;
    if (!e) e = CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    for (size_t i = 0; ptr && e == CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED && i < g_hostregs.n; i++) {
        hostreg_t *r = &g_hostregs.v[i];
        if (r->orig == (uintptr_t)ptr && r->ctx == want && (!want || r->ctx_id == want->id))
            e = unregister_locked(i, "cuMemHostUnregister", 0);
    }
    pthread_mutex_unlock(&g_lock);
    return st ? st : e;
}

/* --- cudaGetDriverEntryPoint[ByVersion] --- */

/* The driver functions by base name and the version from which each ABI is
 * the one cuGetProcAddress returns; a NULL function is an ABI not emulated
 * (asked for, it is reported as not found rather than given the wrong ABI). */
static const struct { const char *name; unsigned version; void *fn; } k_entry_points[] = {
    {"cuGetErrorName", 6000, (void *)cuGetErrorName},
    {"cuGetErrorString", 6000, (void *)cuGetErrorString},
    {"cuInit", 2000, (void *)cuInit},
    {"cuDeviceGet", 2000, (void *)cuDeviceGet},
    {"cuCtxCreate", 3020, (void *)cuCtxCreate_v2},
    {"cuCtxCreate", 11040, NULL}, /* cuCtxCreate_v3 (execution affinity) */
    {"cuCtxCreate", 12050, NULL}, /* cuCtxCreate_v4 (CUctxCreateParams) */
    {"cuCtxDestroy", 4000, (void *)cuCtxDestroy_v2},
    {"cuCtxPushCurrent", 4000, (void *)cuCtxPushCurrent_v2},
    {"cuCtxPopCurrent", 4000, (void *)cuCtxPopCurrent_v2},
    {"cuCtxGetCurrent", 4000, (void *)cuCtxGetCurrent},
    {"cuCtxSetCurrent", 4000, (void *)cuCtxSetCurrent},
    {"cuMemHostRegister", 6050, (void *)cuMemHostRegister_v2},
    {"cuMemHostUnregister", 4000, (void *)cuMemHostUnregister},
};

static int entry_point(const char *symbol, void **fn, unsigned version, unsigned long long flags, int *status) {
    if (!symbol || !fn || flags > ENTRY_FLAGS_MAX || version > DRIVER_VERSION) return cudaErrorInvalidValue;
    int found = 0, best = -1;
    for (int i = 0; i < (int)(sizeof k_entry_points / sizeof k_entry_points[0]); i++)
        if (strcmp(k_entry_points[i].name, symbol) == 0) {
            found = 1;
            if (k_entry_points[i].version <= version && (best < 0 || k_entry_points[i].version > k_entry_points[best].version))
                best = i;
        }
    *fn = best >= 0 ? k_entry_points[best].fn : NULL;
    if (status) *status = *fn ? ENTRY_SUCCESS : found && best < 0 ? ENTRY_VERSION_NOT_SUFFICIENT : ENTRY_SYMBOL_NOT_FOUND;
    return cudaSuccess;
}

EXPORT cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned version,
                                                    unsigned long long flags, int *status) {
    ENTER(cudaGetDriverEntryPointByVersion);
    return set_err(entry_point(symbol, fn, version, flags, status));
}

/* As the real one, at the runtime's own version (so "cuCtxCreate" is an ABI
 * the emulator lacks: cuCtxCreate_v4). */
EXPORT cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **fn, unsigned long long flags, int *status) {
    ENTER(cudaGetDriverEntryPoint);
    return set_err(entry_point(symbol, fn, (unsigned)g_version, flags, status));
}

/* ======================================================================== */
/* 11. The control API (cudart_emu.h) and the constructor                   */
/* ======================================================================== */

EXPORT int cudaEmuGetCounters(cudaEmuCounters *out) {
    if (!out) return 0;
    pthread_mutex_lock(&g_lock);
    *out = g_counters;
    pthread_mutex_unlock(&g_lock);
    return 0;
}

EXPORT int cudaEmuSetDelayUs(unsigned int us) {
    atomic_store(&g_delay_us, us);
    return 0;
}

EXPORT int cudaEmuHold(int on) {
    pthread_mutex_lock(&g_lock);
    atomic_store(&g_hold, on != 0);
    if (!on) cv_broadcast(&g_hold_cv);
    pthread_mutex_unlock(&g_lock);
    return 0;
}

EXPORT int cudaEmuInjectFault(const char *name, unsigned int nth, int error, int sticky) {
    int fn = func_index(name);
    if (fn < 0) return -1;
    return add_fault(fn, nth, error, sticky);
}

EXPORT int cudaEmuSetContextCreateError(int error) {
    atomic_store(&g_ctx_create_error, error);
    return 0;
}

EXPORT int cudaEmuReset(void) {
    pthread_mutex_lock(&g_lock);
    atomic_store(&g_ctx_create_error, 0);
    g_nfaults_len = 0;
    atomic_store(&g_nfaults, 0);
    atomic_store(&g_sticky, 0);
    atomic_store(&g_hold, 0);
    cv_broadcast(&g_hold_cv);
    atomic_fetch_add(&g_epoch, 1);
    pthread_mutex_unlock(&g_lock);
    return 0;
}

EXPORT long long cudaEmuCallCount(const char *name) {
    int fn = func_index(name);
    return fn < 0 ? -1 : atomic_load(&g_calls[fn]);
}

static unsigned long long env_u64(const char *name, unsigned long long dflt) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 0);
    if (errno || *end) {
        fprintf(stderr, "cudart_emu: ignoring %s=%s (not a number)\n", name, v);
        return dflt;
    }
    return x;
}

/* CUDA_EMU_FAULTS="name:nth:err[:sticky],..." (the 4th field: "sticky" or a non-zero number). */
static void parse_faults(const char *spec) {
    char *copy = strdup(spec), *save = NULL;
    if (!copy) return;
    for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char *f[4] = {0}, *s2 = NULL;
        int k = 0;
        for (char *t = strtok_r(item, ":", &s2); t && k < 4; t = strtok_r(NULL, ":", &s2)) f[k++] = t;
        int fn = k >= 3 ? func_index(f[0]) : -1;
        if (fn < 0) {
            fprintf(stderr, "cudart_emu: ignoring fault '%s' in CUDA_EMU_FAULTS\n", f[0] ? f[0] : "");
            continue;
        }
        int sticky = k == 4 && (strcmp(f[3], "sticky") == 0 || atoi(f[3]) != 0);
        add_fault(fn, (unsigned)strtoul(f[1], NULL, 0), (int)strtol(f[2], NULL, 0), sticky);
    }
    free(copy);
}

__attribute__((constructor)) static void emu_init(void) {
    unsigned long long n = env_u64("CUDA_EMU_DEVICES", 1);
    g_ndev = n > MAX_DEVICES ? MAX_DEVICES : (int)n;
    g_dev_mem = env_u64("CUDA_EMU_DEVICE_MEM", (unsigned long long)16 << 30);
    g_version = (int)env_u64("CUDA_EMU_VERSION", 13000);
    for (int d = 0; d < MAX_DEVICES; d++) g_primary_ctx[d] = (ctx_t){NULL, 0, d, 1, 0};
    atomic_store(&g_delay_us, (unsigned)env_u64("CUDA_EMU_DELAY_US", 0));
    const char *faults = getenv("CUDA_EMU_FAULTS");
    if (faults && *faults) parse_faults(faults);
}
