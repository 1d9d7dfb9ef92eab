/* Minimal stand-in for CUDA's crt/host_defines.h, which the runtime wheels on
 * PyPI do not ship. It defines only what the host-side runtime API headers need
 * when parsed by libclang for bindgen: every CUDA execution-space qualifier is
 * empty, alignment attributes map to the GNU spelling. Hand-maintained. */
#ifndef CUDA_SYS_SHIM_HOST_DEFINES_H
#define CUDA_SYS_SHIM_HOST_DEFINES_H
#define __host__
#define __device__
#define __global__
#define __shared__
#define __constant__
#define __managed__
#define __launch_bounds__(...)
#define __device_builtin__
#define __cudart_builtin__
#define __device_builtin_texture_type__
#define __device_builtin_surface_type__
#define __forceinline__ inline __attribute__((always_inline))
#define __align__(n) __attribute__((aligned(n)))
#define __builtin_align__(a) __align__(a)
#define __annotate__(a) __attribute__((a))
#define __location__(a) __annotate__(a)
#define __specialization_static
#define CUDARTAPI
#define CUDARTAPI_CDECL
#define __cudart_builtin__
#define __DEF_IF_HOST
#endif
