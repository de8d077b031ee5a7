/* Dispatch tables for libcuda and libnvrtc, filled at run time (dlopen +
 * cuGetProcAddress / dlsym) so that nothing links against either library.
 *
 * No CUDA header is needed to build: the few types and constants used are
 * declared here, with the layouts of CUDA 12/13 (checked against a real
 * cuda.h by TestHeaderMatchesCudaH when one is around).
 *
 * Each function appears once, in an X-macro list, as
 *   X(tier, name, dlsym name, CUDA version of its ABI, (params), (args))
 * and that one line yields the table slot, the symbol-table row, a wrapper
 * gscu_<name>(table, ...) that returns GSCU_ERROR_NO_SYMBOL for a missing
 * pointer, a wrapper gscu_in_<name>(table, ctx, ...) that makes ctx current
 * for the call and restores the caller's context after it, and a counting
 * stub for the fake table of the tests. Internal to package cuda. */
#ifndef GOSYM_CUDA_DISPATCH_H
#define GOSYM_CUDA_DISPATCH_H

#include <stddef.h>
#include <stdint.h>

/* ---- driver API types ------------------------------------------------------ */

typedef int CUresult;
typedef int CUdevice;
typedef int CUdevice_attribute;
typedef int CUpointer_attribute;
typedef int CUfunction_attribute;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef int CUstreamCaptureStatus; /* 0: not capturing, 1: active, 2: invalidated */
typedef struct CUevent_st *CUevent;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef uint64_t cuuint64_t;
typedef uint32_t cuuint32_t;

#define GSCU_IPC_HANDLE_SIZE 64
typedef struct {
	char reserved[GSCU_IPC_HANDLE_SIZE];
} CUipcMemHandle;

typedef struct {
	int type; /* CUmemLocationType */
	int id;
} CUmemLocation;

typedef struct {
	int type;                 /* CUmemAllocationType */
	int requestedHandleTypes; /* CUmemAllocationHandleType */
	CUmemLocation location;
	void *win32HandleMetaData;
	struct {
		unsigned char compressionType;
		unsigned char gpuDirectRDMACapable;
		unsigned short usage;
		unsigned char reserved[4];
	} allocFlags;
} CUmemAllocationProp;

typedef struct {
	CUmemLocation location;
	int flags; /* CUmemAccess_flags */
} CUmemAccessDesc;

typedef struct {
	unsigned int numDevices;
	size_t size;
	unsigned long long handleTypes;
	unsigned long long flags;
} CUmulticastObjectProp;

/* The wait/write members of CUstreamBatchMemOpParams (48 bytes). */
typedef union {
	int operation;
	struct {
		int operation;
		CUdeviceptr address;
		union {
			cuuint32_t value;
			cuuint64_t value64;
		} v;
		unsigned int flags;
		CUdeviceptr alias;
	} value; /* waitValue and writeValue share this layout */
	cuuint64_t pad[6];
} CUstreamBatchMemOpParams;

/* cuLaunchKernelEx's configuration, with the one attribute gosym sets
 * (CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION). */
typedef union {
	char pad[64];
	int programmaticStreamSerializationAllowed;
} CUlaunchAttributeValue;

typedef struct {
	int id; /* CUlaunchAttributeID */
	char pad[4];
	CUlaunchAttributeValue value;
} CUlaunchAttribute;

typedef struct {
	unsigned int gridDimX, gridDimY, gridDimZ;
	unsigned int blockDimX, blockDimY, blockDimZ;
	unsigned int sharedMemBytes;
	CUstream hStream;
	CUlaunchAttribute *attrs;
	unsigned int numAttrs;
} CUlaunchConfig;

#define GSCU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION 6

typedef int CUdriverProcAddressQueryResult;

/* Result codes the glue itself produces; the driver's are all >= 0. */
#define GSCU_SUCCESS 0
#define GSCU_ERROR_NO_SYMBOL (-1) /* the library lacks the function */
#define GSCU_ERROR_REFUSED (-2)   /* multicast used without passing the gate */

#define GSCU_GET_PROC_ADDRESS_LEGACY_STREAM 1

/* Tiers: which symbols must be present, and which are resolved only on
 * demand. GSCU_TIER_MC (multicast) is never resolved by the loader; see
 * gscu_enable_multicast. */
#define GSCU_TIER_REQ 1
#define GSCU_TIER_VMM 2
#define GSCU_TIER_MEMOPS 4
#define GSCU_TIER_MC 8
#define GSCU_TIER_LAUNCHEX 16 /* optional: launches fall back to cuLaunchKernel */
#define GSCU_TIER_ALL_BUT_MC (GSCU_TIER_REQ | GSCU_TIER_VMM | GSCU_TIER_MEMOPS | GSCU_TIER_LAUNCHEX)

#define GSCU_DRIVER_FUNCS(X)                                                                   \
	X(REQ, cuInit, "cuInit", 12000, (unsigned int flags), (flags))                         \
	X(REQ, cuDriverGetVersion, "cuDriverGetVersion", 12000, (int *v), (v))                 \
	X(REQ, cuGetErrorString, "cuGetErrorString", 12000, (CUresult e, const char **s),       \
	  (e, s))                                                                              \
	X(REQ, cuGetErrorName, "cuGetErrorName", 12000, (CUresult e, const char **s), (e, s))   \
	X(REQ, cuDeviceGetCount, "cuDeviceGetCount", 12000, (int *n), (n))                     \
	X(REQ, cuDeviceGet, "cuDeviceGet", 12000, (CUdevice * d, int ordinal), (d, ordinal))   \
	X(REQ, cuDeviceGetAttribute, "cuDeviceGetAttribute", 12000,                            \
	  (int *v, CUdevice_attribute a, CUdevice d), (v, a, d))                               \
	X(REQ, cuDeviceGetName, "cuDeviceGetName", 12000, (char *name, int len, CUdevice d),   \
	  (name, len, d))                                                                      \
	X(REQ, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 12000,                    \
	  (CUcontext * c, CUdevice d), (c, d))                                                 \
	X(REQ, cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", 12000, (CUdevice d), \
	  (d))                                                                                 \
	X(REQ, cuCtxGetCurrent, "cuCtxGetCurrent", 12000, (CUcontext * c), (c))                \
	X(REQ, cuCtxSetCurrent, "cuCtxSetCurrent", 12000, (CUcontext c), (c))                  \
	X(REQ, cuModuleLoadData, "cuModuleLoadData", 12000, (CUmodule * m, const void *image), \
	  (m, image))                                                                          \
	X(REQ, cuModuleUnload, "cuModuleUnload", 12000, (CUmodule m), (m))                     \
	X(REQ, cuModuleGetFunction, "cuModuleGetFunction", 12000,                              \
	  (CUfunction * f, CUmodule m, const char *name), (f, m, name))                        \
	X(REQ, cuFuncGetAttribute, "cuFuncGetAttribute", 12000,                                \
	  (int *v, CUfunction_attribute a, CUfunction f), (v, a, f))                           \
	X(REQ, cuLaunchKernel, "cuLaunchKernel", 12000,                                        \
	  (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,   \
	   unsigned int by, unsigned int bz, unsigned int shmem, CUstream s, void **params,    \
	   void **extra),                                                                      \
	  (f, gx, gy, gz, bx, by, bz, shmem, s, params, extra))                                \
	X(LAUNCHEX, cuLaunchKernelEx, "cuLaunchKernelEx", 12000,                               \
	  (const CUlaunchConfig *config, CUfunction f, void **params, void **extra),           \
	  (config, f, params, extra))                                                          \
	X(REQ, cuMemAlloc, "cuMemAlloc_v2", 12000, (CUdeviceptr * p, size_t n), (p, n))        \
	X(REQ, cuMemFree, "cuMemFree_v2", 12000, (CUdeviceptr p), (p))                         \
	X(REQ, cuMemHostAlloc, "cuMemHostAlloc", 12000,                                        \
	  (void **p, size_t n, unsigned int flags), (p, n, flags))                             \
	X(REQ, cuMemHostGetDevicePointer, "cuMemHostGetDevicePointer_v2", 12000,               \
	  (CUdeviceptr * d, void *p, unsigned int flags), (d, p, flags))                       \
	X(REQ, cuMemFreeHost, "cuMemFreeHost", 12000, (void *p), (p))                          \
	X(REQ, cuMemcpyHtoD, "cuMemcpyHtoD_v2", 12000,                                         \
	  (CUdeviceptr dst, const void *src, size_t n), (dst, src, n))                         \
	X(REQ, cuMemcpyDtoH, "cuMemcpyDtoH_v2", 12000, (void *dst, CUdeviceptr src, size_t n), \
	  (dst, src, n))                                                                       \
	X(REQ, cuMemcpyAsync, "cuMemcpyAsync", 12000,                                          \
	  (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s), (dst, src, n, s))          \
	X(REQ, cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2", 12000,                               \
	  (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s), (dst, src, n, s))          \
	X(REQ, cuMemsetD32Async, "cuMemsetD32Async", 12000,                                    \
	  (CUdeviceptr dst, unsigned int v, size_t n, CUstream s), (dst, v, n, s))             \
	X(REQ, cuStreamCreate, "cuStreamCreate", 12000, (CUstream * s, unsigned int flags),    \
	  (s, flags))                                                                          \
	X(REQ, cuStreamDestroy, "cuStreamDestroy_v2", 12000, (CUstream s), (s))                \
	X(REQ, cuStreamSynchronize, "cuStreamSynchronize", 12000, (CUstream s), (s))           \
	X(REQ, cuStreamGetCaptureInfo, "cuStreamGetCaptureInfo_v2", 12000,                     \
	  (CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id, void **graph,                \
	   const void **deps, size_t *ndeps),                                                  \
	  (s, st, id, graph, deps, ndeps))                                                     \
	X(REQ, cuStreamWaitEvent, "cuStreamWaitEvent", 12000,                                  \
	  (CUstream s, CUevent e, unsigned int flags), (s, e, flags))                          \
	X(REQ, cuEventCreate, "cuEventCreate", 12000, (CUevent * e, unsigned int flags),       \
	  (e, flags))                                                                          \
	X(REQ, cuEventRecord, "cuEventRecord", 12000, (CUevent e, CUstream s), (e, s))         \
	X(REQ, cuEventSynchronize, "cuEventSynchronize", 12000, (CUevent e), (e))              \
	X(REQ, cuEventQuery, "cuEventQuery", 12000, (CUevent e), (e))                          \
	X(REQ, cuEventElapsedTime, "cuEventElapsedTime", 12000,                                \
	  (float *ms, CUevent a, CUevent b), (ms, a, b))                                       \
	X(REQ, cuEventDestroy, "cuEventDestroy_v2", 12000, (CUevent e), (e))                   \
	X(REQ, cuPointerGetAttribute, "cuPointerGetAttribute", 12000,                          \
	  (void *data, CUpointer_attribute a, CUdeviceptr p), (data, a, p))                    \
	X(REQ, cuMemGetAddressRange, "cuMemGetAddressRange_v2", 12000,                         \
	  (CUdeviceptr * base, size_t *size, CUdeviceptr p), (base, size, p))                  \
	X(REQ, cuIpcGetMemHandle, "cuIpcGetMemHandle", 12000,                                  \
	  (CUipcMemHandle * h, CUdeviceptr p), (h, p))                                         \
	X(REQ, cuIpcOpenMemHandle, "cuIpcOpenMemHandle_v2", 12000,                             \
	  (CUdeviceptr * p, CUipcMemHandle h, unsigned int flags), (p, h, flags))              \
	X(REQ, cuIpcCloseMemHandle, "cuIpcCloseMemHandle", 12000, (CUdeviceptr p), (p))        \
	X(VMM, cuMemCreate, "cuMemCreate", 12000,                                              \
	  (CUmemGenericAllocationHandle * h, size_t size, const CUmemAllocationProp *prop,     \
	   unsigned long long flags),                                                          \
	  (h, size, prop, flags))                                                              \
	X(VMM, cuMemRelease, "cuMemRelease", 12000, (CUmemGenericAllocationHandle h), (h))     \
	X(VMM, cuMemRetainAllocationHandle, "cuMemRetainAllocationHandle", 12000,              \
	  (CUmemGenericAllocationHandle * h, void *addr), (h, addr))                           \
	X(VMM, cuMemExportToShareableHandle, "cuMemExportToShareableHandle", 12000,            \
	  (void *out, CUmemGenericAllocationHandle h, int type, unsigned long long flags),     \
	  (out, h, type, flags))                                                               \
	X(VMM, cuMemImportFromShareableHandle, "cuMemImportFromShareableHandle", 12000,        \
	  (CUmemGenericAllocationHandle * h, void *os, int type), (h, os, type))               \
	X(VMM, cuMemAddressReserve, "cuMemAddressReserve", 12000,                              \
	  (CUdeviceptr * p, size_t size, size_t align, CUdeviceptr addr,                       \
	   unsigned long long flags),                                                          \
	  (p, size, align, addr, flags))                                                       \
	X(VMM, cuMemAddressFree, "cuMemAddressFree", 12000, (CUdeviceptr p, size_t size),      \
	  (p, size))                                                                           \
	X(VMM, cuMemMap, "cuMemMap", 12000,                                                    \
	  (CUdeviceptr p, size_t size, size_t off, CUmemGenericAllocationHandle h,             \
	   unsigned long long flags),                                                          \
	  (p, size, off, h, flags))                                                            \
	X(VMM, cuMemUnmap, "cuMemUnmap", 12000, (CUdeviceptr p, size_t size), (p, size))       \
	X(VMM, cuMemSetAccess, "cuMemSetAccess", 12000,                                        \
	  (CUdeviceptr p, size_t size, const CUmemAccessDesc *desc, size_t count),             \
	  (p, size, desc, count))                                                              \
	X(VMM, cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity", 12000,          \
	  (size_t * g, const CUmemAllocationProp *prop, int option), (g, prop, option))        \
	X(MEMOPS, cuStreamWriteValue32, "cuStreamWriteValue32_v2", 12000,                      \
	  (CUstream s, CUdeviceptr p, cuuint32_t v, unsigned int flags), (s, p, v, flags))     \
	X(MEMOPS, cuStreamWaitValue32, "cuStreamWaitValue32_v2", 12000,                        \
	  (CUstream s, CUdeviceptr p, cuuint32_t v, unsigned int flags), (s, p, v, flags))     \
	X(MEMOPS, cuStreamBatchMemOp, "cuStreamBatchMemOp_v2", 12000,                          \
	  (CUstream s, unsigned int n, CUstreamBatchMemOpParams *ops, unsigned int flags),     \
	  (s, n, ops, flags))                                                                  \
	X(MC, cuMulticastCreate, "cuMulticastCreate", 12010,                                   \
	  (CUmemGenericAllocationHandle * h, const CUmulticastObjectProp *prop), (h, prop))    \
	X(MC, cuMulticastAddDevice, "cuMulticastAddDevice", 12010,                             \
	  (CUmemGenericAllocationHandle h, CUdevice d), (h, d))                                \
	X(MC, cuMulticastBindMem, "cuMulticastBindMem", 12010,                                 \
	  (CUmemGenericAllocationHandle h, size_t mcOff, CUmemGenericAllocationHandle mem,     \
	   size_t memOff, size_t size, unsigned long long flags),                              \
	  (h, mcOff, mem, memOff, size, flags))                                                \
	X(MC, cuMulticastUnbind, "cuMulticastUnbind", 12010,                                   \
	  (CUmemGenericAllocationHandle h, CUdevice d, size_t off, size_t size),               \
	  (h, d, off, size))                                                                   \
	X(MC, cuMulticastGetGranularity, "cuMulticastGetGranularity", 12010,                   \
	  (size_t * g, const CUmulticastObjectProp *prop, int option), (g, prop, option))

/* ---- NVRTC ---------------------------------------------------------------- */

typedef int nvrtcResult;
typedef struct _nvrtcProgram *nvrtcProgram;

#define GSCU_NVRTC_FUNCS(X)                                                                  \
	X(REQ, nvrtcVersion, "nvrtcVersion", 0, (int *major, int *minor), (major, minor))    \
	X(REQ, nvrtcGetErrorString, "nvrtcGetErrorString", 0, (nvrtcResult r), (r))           \
	X(REQ, nvrtcCreateProgram, "nvrtcCreateProgram", 0,                                  \
	  (nvrtcProgram * p, const char *src, const char *name, int nh,                       \
	   const char *const *headers, const char *const *names),                             \
	  (p, src, name, nh, headers, names))                                                 \
	X(REQ, nvrtcDestroyProgram, "nvrtcDestroyProgram", 0, (nvrtcProgram * p), (p))        \
	X(REQ, nvrtcCompileProgram, "nvrtcCompileProgram", 0,                                \
	  (nvrtcProgram p, int n, const char *const *opts), (p, n, opts))                     \
	X(REQ, nvrtcGetProgramLogSize, "nvrtcGetProgramLogSize", 0, (nvrtcProgram p, size_t *n), \
	  (p, n))                                                                             \
	X(REQ, nvrtcGetProgramLog, "nvrtcGetProgramLog", 0, (nvrtcProgram p, char *log),      \
	  (p, log))                                                                           \
	X(REQ, nvrtcGetPTXSize, "nvrtcGetPTXSize", 0, (nvrtcProgram p, size_t *n), (p, n))    \
	X(REQ, nvrtcGetPTX, "nvrtcGetPTX", 0, (nvrtcProgram p, char *out), (p, out))          \
	X(REQ, nvrtcGetCUBINSize, "nvrtcGetCUBINSize", 0, (nvrtcProgram p, size_t *n), (p, n)) \
	X(REQ, nvrtcGetCUBIN, "nvrtcGetCUBIN", 0, (nvrtcProgram p, char *out), (p, out))      \
	X(REQ, nvrtcGetNumSupportedArchs, "nvrtcGetNumSupportedArchs", 0, (int *n), (n))      \
	X(REQ, nvrtcGetSupportedArchs, "nvrtcGetSupportedArchs", 0, (int *archs), (archs))

/* nvrtcGetErrorString returns a string, not a result: it gets its own slot. */
#define GSCU_NVRTC_RET(name) GSCU_NVRTC_RET_##name
#define GSCU_NVRTC_RET_nvrtcGetErrorString const char *
#define GSCU_NVRTC_RET_nvrtcVersion nvrtcResult
#define GSCU_NVRTC_RET_nvrtcCreateProgram nvrtcResult
#define GSCU_NVRTC_RET_nvrtcDestroyProgram nvrtcResult
#define GSCU_NVRTC_RET_nvrtcCompileProgram nvrtcResult
#define GSCU_NVRTC_RET_nvrtcGetProgramLogSize nvrtcResult
#define GSCU_NVRTC_RET_nvrtcGetProgramLog nvrtcResult
#define GSCU_NVRTC_RET_nvrtcGetPTXSize nvrtcResult
#define GSCU_NVRTC_RET_nvrtcGetPTX nvrtcResult
#define GSCU_NVRTC_RET_nvrtcGetCUBINSize nvrtcResult
#define GSCU_NVRTC_RET_nvrtcGetCUBIN nvrtcResult
#define GSCU_NVRTC_RET_nvrtcGetNumSupportedArchs nvrtcResult
#define GSCU_NVRTC_RET_nvrtcGetSupportedArchs nvrtcResult

#define GSCU_UNPAREN(...) __VA_ARGS__

/* ---- tables --------------------------------------------------------------- */

typedef struct gscu_driver {
#define GSCU_SLOT(tier, name, dl, ver, params, args) CUresult (*name) params;
	GSCU_DRIVER_FUNCS(GSCU_SLOT)
#undef GSCU_SLOT
	/* Set by gscu_enable_multicast only; the multicast wrappers refuse to
	 * call through even a filled slot while it is 0. */
	int mc_enabled;
} gscu_driver;

typedef struct gscu_nvrtc {
#define GSCU_SLOT(tier, name, dl, ver, params, args) GSCU_NVRTC_RET(name)(*name) params;
	GSCU_NVRTC_FUNCS(GSCU_SLOT)
#undef GSCU_SLOT
} gscu_nvrtc;

/* Indexes into the symbol tables. */
enum {
#define GSCU_IDX(tier, name, dl, ver, params, args) GSCU_IDX_##name,
	GSCU_DRIVER_FUNCS(GSCU_IDX) GSCU_NUM_DRIVER_FUNCS
#undef GSCU_IDX
};
enum {
#define GSCU_IDX(tier, name, dl, ver, params, args) GSCU_NIDX_##name,
	GSCU_NVRTC_FUNCS(GSCU_IDX) GSCU_NUM_NVRTC_FUNCS
#undef GSCU_IDX
};

/* ---- wrappers ------------------------------------------------------------- */

#define GSCU_GUARD_REQ(t)
#define GSCU_GUARD_VMM(t)
#define GSCU_GUARD_MEMOPS(t)
#define GSCU_GUARD_LAUNCHEX(t)
#define GSCU_GUARD_MC(t)                                                                     \
	if (!(t)->mc_enabled)                                                                \
		return GSCU_ERROR_REFUSED;

/* Host time spent inside the driver, for the call-cost bench (gosym.callcost):
 * counted only while gscu_timing is set (Go's cuda.SetTiming), so an op pays one
 * predictable branch per driver call when nobody measures. */
extern volatile int gscu_timing;
extern unsigned long long gscu_timed_calls, gscu_timed_ns;
unsigned long long gscu_now_ns(void);
static inline void gscu_timed(unsigned long long t0) {
	__atomic_fetch_add(&gscu_timed_ns, gscu_now_ns() - t0, __ATOMIC_RELAXED);
	__atomic_fetch_add(&gscu_timed_calls, 1, __ATOMIC_RELAXED);
}

#define GSCU_WRAP(tier, name, dl, ver, params, args)                                          \
	static inline CUresult gscu_##name(const gscu_driver *t, GSCU_UNPAREN params) {       \
		GSCU_GUARD_##tier(t) if (!t->name) return GSCU_ERROR_NO_SYMBOL;               \
		if (__builtin_expect(gscu_timing, 0)) {                                       \
			unsigned long long t0 = gscu_now_ns();                                \
			CUresult r = t->name args;                                            \
			gscu_timed(t0);                                                       \
			return r;                                                             \
		}                                                                             \
		return t->name args;                                                          \
	}
GSCU_DRIVER_FUNCS(GSCU_WRAP)
#undef GSCU_WRAP

/* Makes ctx current on this thread for one call and puts back whatever was
 * current before: Go code runs on threads that torch also uses (a Python
 * thread calling into the library), and the CUDA runtime there must find its
 * own context again. A NULL ctx leaves the thread's context alone. */
static inline CUresult gscu_ctx_enter(const gscu_driver *t, CUcontext ctx, CUcontext *prev) {
	*prev = ctx;
	if (!ctx)
		return GSCU_SUCCESS;
	CUresult r = gscu_cuCtxGetCurrent(t, prev);
	if (r != GSCU_SUCCESS)
		return r;
	return *prev == ctx ? GSCU_SUCCESS : gscu_cuCtxSetCurrent(t, ctx);
}

static inline void gscu_ctx_leave(const gscu_driver *t, CUcontext ctx, CUcontext prev) {
	if (prev != ctx)
		(void)gscu_cuCtxSetCurrent(t, prev);
}

#define GSCU_WRAP_IN(tier, name, dl, ver, params, args)                                        \
	static inline CUresult gscu_in_##name(const gscu_driver *t, CUcontext ctx,             \
	                                      GSCU_UNPAREN params) {                           \
		CUcontext prev;                                                                \
		CUresult r = gscu_ctx_enter(t, ctx, &prev);                                    \
		if (r != GSCU_SUCCESS)                                                         \
			return r;                                                              \
		r = gscu_##name(t, GSCU_UNPAREN args);                                         \
		gscu_ctx_leave(t, ctx, prev);                                                  \
		return r;                                                                      \
	}
GSCU_DRIVER_FUNCS(GSCU_WRAP_IN)
#undef GSCU_WRAP_IN

#define GSCU_NWRAP(tier, name, dl, ver, params, args)                                         \
	static inline GSCU_NVRTC_RET(name) gscu_##name(const gscu_nvrtc *t, GSCU_UNPAREN params) { \
		return t->name args;                                                          \
	}
GSCU_NVRTC_FUNCS(GSCU_NWRAP)
#undef GSCU_NWRAP

/* ---- loader (dispatch.c) ---------------------------------------------------- */

/* Opens a library; returns NULL and fills err on failure. noload only finds a
 * copy that is already loaded (RTLD_NOLOAD). */
void *gscu_dlopen(const char *path, int noload, char *err, size_t errlen);
void gscu_dlclose(void *lib);
/* Directory and path of the file a handle was loaded from (dlinfo). */
int gscu_dlpath(void *lib, char *out, size_t outlen);

/* dlsym's cuInit and calls it: the driver is initialised before anything
 * else is looked up. */
CUresult gscu_driver_init(void *lib);

/* Resolves every driver function of the tiers in mask, through
 * cuGetProcAddress_v2 when the library has it, otherwise by the dlsym name.
 * Missing symbols stay NULL. fake != 0 resolves to the counting stubs. */
void gscu_driver_resolve(gscu_driver *t, void *lib, int fake, int mask);
void gscu_nvrtc_resolve(gscu_nvrtc *t, void *lib);

/* Resolves the multicast functions and opens their gate. Call only after
 * MulticastAllowed said yes; nothing else ever sets mc_enabled. */
void gscu_enable_multicast(gscu_driver *t, void *lib, int fake);

/* Symbol table rows, for reporting which symbols are missing. */
const char *gscu_driver_sym_name(int i);
const char *gscu_driver_sym_dlname(int i);
int gscu_driver_sym_tier(int i);
int gscu_driver_sym_present(const gscu_driver *t, int i);
const char *gscu_nvrtc_sym_name(int i);
int gscu_nvrtc_sym_present(const gscu_nvrtc *t, int i);

/* Fake driver of the tests: every stub counts its calls, logs them in
 * order (with the handle or address it works on, for the stubs that fill
 * in outputs: distinct handles, addresses, real /dev/null fds for exports)
 * and returns gscu_fake_result[i], or GSCU_FAKE_FAILED for the call whose
 * count reaches gscu_fake_fail_at[i]. Names listed in gscu_fake_missing
 * (comma-separated) resolve to NULL. */
#define GSCU_FAKE_LOG 4096
#define GSCU_FAKE_FAILED 999 /* CUDA_ERROR_UNKNOWN */
extern long long gscu_fake_calls[GSCU_NUM_DRIVER_FUNCS];
extern CUresult gscu_fake_result[GSCU_NUM_DRIVER_FUNCS];
extern long long gscu_fake_fail_at[GSCU_NUM_DRIVER_FUNCS];
extern int gscu_fake_log_fn[GSCU_FAKE_LOG];
extern unsigned long long gscu_fake_log_arg[GSCU_FAKE_LOG];
extern int gscu_fake_log_n;
extern long long gscu_fake_lookups_mc; /* multicast names looked up */
extern int gscu_fake_attr[256];
extern int gscu_fake_version;
extern char gscu_fake_missing[1024];
void gscu_fake_reset(void);

#endif
