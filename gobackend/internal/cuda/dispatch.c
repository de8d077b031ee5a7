/* Loader half of the dispatch tables (see dispatch.h). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dispatch.h"

typedef struct {
	const char *name;   /* base name, as cuGetProcAddress wants it */
	const char *dlname; /* versioned export, for dlsym */
	int version;        /* CUDA version whose ABI the slot's type matches */
	int tier;
	size_t offset; /* of the slot in its table */
} gscu_sym;

static const gscu_sym driver_syms[] = {
#define ROW(tier, name, dl, ver, params, args)                                               \
	{#name, dl, ver, GSCU_TIER_##tier, offsetof(gscu_driver, name)},
    GSCU_DRIVER_FUNCS(ROW)
#undef ROW
};

static const gscu_sym nvrtc_syms[] = {
#define ROW(tier, name, dl, ver, params, args)                                               \
	{#name, dl, ver, GSCU_TIER_##tier, offsetof(gscu_nvrtc, name)},
    GSCU_NVRTC_FUNCS(ROW)
#undef ROW
};

volatile int gscu_timing;
unsigned long long gscu_timed_calls, gscu_timed_ns;

unsigned long long gscu_now_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

static void **slot(void *table, const gscu_sym *s) { return (void **)((char *)table + s->offset); }

void *gscu_dlopen(const char *path, int noload, char *err, size_t errlen) {
	(void)dlerror();
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL | (noload ? RTLD_NOLOAD : 0));
	if (!h && err && errlen) {
		const char *e = dlerror();
		snprintf(err, errlen, "%s", e ? e : "dlopen failed");
	}
	return h;
}

void gscu_dlclose(void *lib) {
	if (lib)
		dlclose(lib);
}

int gscu_dlpath(void *lib, char *out, size_t outlen) {
	struct link_map *lm = NULL;
	if (!lib || dlinfo(lib, RTLD_DI_LINKMAP, &lm) != 0 || !lm || !lm->l_name)
		return -1;
	snprintf(out, outlen, "%s", lm->l_name);
	return 0;
}

/* ---- the fake driver of the tests ------------------------------------------- */

long long gscu_fake_calls[GSCU_NUM_DRIVER_FUNCS];
CUresult gscu_fake_result[GSCU_NUM_DRIVER_FUNCS];
long long gscu_fake_fail_at[GSCU_NUM_DRIVER_FUNCS];
int gscu_fake_log_fn[GSCU_FAKE_LOG];
unsigned long long gscu_fake_log_arg[GSCU_FAKE_LOG];
int gscu_fake_log_n;
long long gscu_fake_lookups_mc;
int gscu_fake_attr[256];
int gscu_fake_version;
char gscu_fake_missing[1024];
static CUcontext fake_current;
static unsigned long long fake_next; /* handles and addresses handed out */

void gscu_fake_reset(void) {
	memset(gscu_fake_calls, 0, sizeof gscu_fake_calls);
	memset(gscu_fake_result, 0, sizeof gscu_fake_result);
	memset(gscu_fake_fail_at, 0, sizeof gscu_fake_fail_at);
	gscu_fake_log_n = 0;
	fake_next = 0;
	memset(gscu_fake_attr, 0, sizeof gscu_fake_attr);
	memset(gscu_fake_missing, 0, sizeof gscu_fake_missing);
	gscu_fake_lookups_mc = 0;
	gscu_fake_version = 13000;
	fake_current = NULL;
}

/* Counts and logs call i (arg: the handle or address it is about, or 0)
 * and says what it returns. */
static CUresult fake_enter(int i, unsigned long long arg) {
	long long n = ++gscu_fake_calls[i];
	if (gscu_fake_log_n < GSCU_FAKE_LOG) {
		gscu_fake_log_fn[gscu_fake_log_n] = i;
		gscu_fake_log_arg[gscu_fake_log_n++] = arg;
	}
	if (gscu_fake_fail_at[i] != 0 && n == gscu_fake_fail_at[i])
		return GSCU_FAKE_FAILED;
	return gscu_fake_result[i];
}

/* Sets the logged arg of the latest call (for outputs known only later). */
static void fake_log_result(unsigned long long arg) {
	if (gscu_fake_log_n > 0 && gscu_fake_log_n <= GSCU_FAKE_LOG)
		gscu_fake_log_arg[gscu_fake_log_n - 1] = arg;
}

/* A fresh address in the range at base, logged as the latest call's result. */
static CUdeviceptr fake_address(unsigned long long base) {
	CUdeviceptr p = base + (++fake_next << 32);
	fake_log_result(p);
	return p;
}

#define FAKE(tier, name, dl, ver, params, args)                                               \
	static CUresult fake_##name params { return fake_enter(GSCU_IDX_##name, 0); }
GSCU_DRIVER_FUNCS(FAKE)
#undef FAKE

/* Stubs that also fill in their outputs or log what they work on. */
#define COUNT_ARG(name, arg)                                                                  \
	do {                                                                                  \
		CUresult r_ = fake_enter(GSCU_IDX_##name, (arg));                             \
		if (r_ != GSCU_SUCCESS)                                                       \
			return r_;                                                            \
	} while (0)
#define COUNT(name) COUNT_ARG(name, 0)

static CUresult special_cuDriverGetVersion(int *v) {
	COUNT(cuDriverGetVersion);
	*v = gscu_fake_version;
	return GSCU_SUCCESS;
}
static CUresult special_cuDeviceGetCount(int *n) {
	COUNT(cuDeviceGetCount);
	*n = 1;
	return GSCU_SUCCESS;
}
static CUresult special_cuDeviceGet(CUdevice *d, int ordinal) {
	COUNT(cuDeviceGet);
	*d = ordinal;
	return GSCU_SUCCESS;
}
static CUresult special_cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d) {
	(void)d;
	COUNT(cuDeviceGetAttribute);
	*v = (a >= 0 && a < 256) ? gscu_fake_attr[a] : 0;
	return GSCU_SUCCESS;
}
static CUresult special_cuGetErrorName(CUresult e, const char **s) {
	(void)e;
	COUNT(cuGetErrorName);
	*s = "FAKE_ERROR";
	return GSCU_SUCCESS;
}
static CUresult special_cuCtxGetCurrent(CUcontext *c) {
	COUNT(cuCtxGetCurrent);
	*c = fake_current;
	return GSCU_SUCCESS;
}
static CUresult special_cuCtxSetCurrent(CUcontext c) {
	COUNT(cuCtxSetCurrent);
	fake_current = c;
	return GSCU_SUCCESS;
}
static CUresult special_cuMulticastCreate(CUmemGenericAllocationHandle *h,
                                          const CUmulticastObjectProp *prop) {
	(void)prop;
	COUNT_ARG(cuMulticastCreate, 0x6d63);
	*h = 0x6d63;
	return GSCU_SUCCESS;
}
static CUresult special_cuMulticastGetGranularity(size_t *g, const CUmulticastObjectProp *prop,
                                                  int option) {
	(void)prop;
	(void)option;
	COUNT(cuMulticastGetGranularity);
	*g = 2 << 20;
	return GSCU_SUCCESS;
}
static CUresult special_cuMulticastAddDevice(CUmemGenericAllocationHandle h, CUdevice d) {
	(void)d;
	COUNT_ARG(cuMulticastAddDevice, h);
	return GSCU_SUCCESS;
}
static CUresult special_cuMulticastBindMem(CUmemGenericAllocationHandle h, size_t mcOff,
                                           CUmemGenericAllocationHandle mem, size_t memOff,
                                           size_t size, unsigned long long flags) {
	(void)mcOff, (void)mem, (void)memOff, (void)size, (void)flags;
	COUNT_ARG(cuMulticastBindMem, h);
	return GSCU_SUCCESS;
}
static CUresult special_cuMulticastUnbind(CUmemGenericAllocationHandle h, CUdevice d, size_t off,
                                          size_t size) {
	(void)d, (void)off, (void)size;
	COUNT_ARG(cuMulticastUnbind, h);
	return GSCU_SUCCESS;
}
static CUresult special_cuMemCreate(CUmemGenericAllocationHandle *h, size_t size,
                                    const CUmemAllocationProp *prop, unsigned long long flags) {
	(void)size, (void)prop, (void)flags;
	COUNT(cuMemCreate);
	*h = 0x20000 + ++fake_next;
	fake_log_result(*h);
	return GSCU_SUCCESS;
}
static CUresult special_cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os,
                                                       int type) {
	(void)os, (void)type;
	COUNT(cuMemImportFromShareableHandle);
	*h = 0x10000 + ++fake_next;
	fake_log_result(*h);
	return GSCU_SUCCESS;
}
/* Exports are real descriptors (of /dev/null), so that tests see leaks. */
static CUresult special_cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle h,
                                                     int type, unsigned long long flags) {
	(void)type, (void)flags;
	COUNT_ARG(cuMemExportToShareableHandle, h);
	int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
	*(int *)out = fd;
	return GSCU_SUCCESS;
}
static CUresult special_cuMemRelease(CUmemGenericAllocationHandle h) {
	COUNT_ARG(cuMemRelease, h);
	return GSCU_SUCCESS;
}
static CUresult special_cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align,
                                            CUdeviceptr addr, unsigned long long flags) {
	(void)size, (void)align, (void)addr, (void)flags;
	COUNT(cuMemAddressReserve);
	*p = fake_address(0x7f0000000000ull);
	return GSCU_SUCCESS;
}
static CUresult special_cuMemAddressFree(CUdeviceptr p, size_t size) {
	(void)size;
	COUNT_ARG(cuMemAddressFree, p);
	return GSCU_SUCCESS;
}
static CUresult special_cuMemMap(CUdeviceptr p, size_t size, size_t off,
                                 CUmemGenericAllocationHandle h, unsigned long long flags) {
	(void)size, (void)off, (void)h, (void)flags;
	COUNT_ARG(cuMemMap, p);
	return GSCU_SUCCESS;
}
static CUresult special_cuMemUnmap(CUdeviceptr p, size_t size) {
	(void)size;
	COUNT_ARG(cuMemUnmap, p);
	return GSCU_SUCCESS;
}
static CUresult special_cuMemSetAccess(CUdeviceptr p, size_t size, const CUmemAccessDesc *desc,
                                       size_t count) {
	(void)size, (void)desc, (void)count;
	COUNT_ARG(cuMemSetAccess, p);
	return GSCU_SUCCESS;
}
/* Pinned host memory is ordinary heap memory here (the device address is
 * the host one, as with unified addressing), so tests can read and write it. */
static CUresult special_cuMemHostAlloc(void **p, size_t n, unsigned int flags) {
	(void)flags;
	COUNT(cuMemHostAlloc);
	*p = calloc(1, n);
	if (!*p)
		return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
	fake_log_result((unsigned long long)(uintptr_t)*p);
	return GSCU_SUCCESS;
}
static CUresult special_cuMemHostGetDevicePointer(CUdeviceptr *d, void *p, unsigned int flags) {
	(void)flags;
	COUNT_ARG(cuMemHostGetDevicePointer, (unsigned long long)(uintptr_t)p);
	*d = (CUdeviceptr)(uintptr_t)p;
	return GSCU_SUCCESS;
}
static CUresult special_cuMemFreeHost(void *p) {
	/* freed even when the stub reports a failure, as the driver would not
	 * be asked again: a test sees leaks through the call counts */
	CUresult r = fake_enter(GSCU_IDX_cuMemFreeHost, (unsigned long long)(uintptr_t)p);
	free(p);
	return r;
}
/* Legacy allocations and IPC, for the p2p channel tests: allocations and
 * opened handles are distinct addresses (logged as results), a handle
 * carries the address it was made for in its first bytes, frees and closes
 * log what they release. */
static CUresult special_cuMemAlloc(CUdeviceptr *p, size_t n) {
	(void)n;
	COUNT(cuMemAlloc);
	*p = fake_address(0x500000000000ull);
	return GSCU_SUCCESS;
}
static CUresult special_cuMemFree(CUdeviceptr p) {
	COUNT_ARG(cuMemFree, p);
	return GSCU_SUCCESS;
}
static CUresult special_cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p) {
	COUNT_ARG(cuIpcGetMemHandle, p);
	memset(h, 0, sizeof *h);
	memcpy(h, &p, sizeof p);
	return GSCU_SUCCESS;
}
static CUresult special_cuIpcOpenMemHandle(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags) {
	(void)h, (void)flags;
	COUNT(cuIpcOpenMemHandle);
	*p = fake_address(0x600000000000ull);
	return GSCU_SUCCESS;
}
static CUresult special_cuIpcCloseMemHandle(CUdeviceptr p) {
	COUNT_ARG(cuIpcCloseMemHandle, p);
	return GSCU_SUCCESS;
}
/* Logs the launch's grid and its one attribute as grid << 16 | id << 8 | value
 * (a configuration with any other attribute count logs 0xffff). */
static CUresult special_cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params,
                                         void **extra) {
	(void)f, (void)params, (void)extra;
	unsigned long long arg = 0xffff;
	if (c->numAttrs == 1)
		arg = (unsigned long long)c->gridDimX << 16 | (unsigned long long)c->attrs[0].id << 8 |
		      (unsigned)c->attrs[0].value.programmaticStreamSerializationAllowed;
	COUNT_ARG(cuLaunchKernelEx, arg);
	return GSCU_SUCCESS;
}
static CUresult special_cuStreamGetCaptureInfo(CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id,
                                               void **graph, const void **deps, size_t *ndeps) {
	(void)s, (void)graph, (void)deps, (void)ndeps;
	COUNT(cuStreamGetCaptureInfo);
	*st = 0;
	*id = 0;
	return GSCU_SUCCESS;
}
#undef COUNT
#undef COUNT_ARG

static const struct {
	const char *name;
	void *fn;
} specials[] = {
    {"cuDriverGetVersion", (void *)special_cuDriverGetVersion},
    {"cuDeviceGetCount", (void *)special_cuDeviceGetCount},
    {"cuDeviceGet", (void *)special_cuDeviceGet},
    {"cuDeviceGetAttribute", (void *)special_cuDeviceGetAttribute},
    {"cuGetErrorName", (void *)special_cuGetErrorName},
    {"cuCtxGetCurrent", (void *)special_cuCtxGetCurrent},
    {"cuCtxSetCurrent", (void *)special_cuCtxSetCurrent},
    {"cuMulticastCreate", (void *)special_cuMulticastCreate},
    {"cuMulticastGetGranularity", (void *)special_cuMulticastGetGranularity},
    {"cuMulticastAddDevice", (void *)special_cuMulticastAddDevice},
    {"cuMulticastBindMem", (void *)special_cuMulticastBindMem},
    {"cuMulticastUnbind", (void *)special_cuMulticastUnbind},
    {"cuMemCreate", (void *)special_cuMemCreate},
    {"cuMemImportFromShareableHandle", (void *)special_cuMemImportFromShareableHandle},
    {"cuMemExportToShareableHandle", (void *)special_cuMemExportToShareableHandle},
    {"cuMemRelease", (void *)special_cuMemRelease},
    {"cuMemAddressReserve", (void *)special_cuMemAddressReserve},
    {"cuMemAddressFree", (void *)special_cuMemAddressFree},
    {"cuMemMap", (void *)special_cuMemMap},
    {"cuMemUnmap", (void *)special_cuMemUnmap},
    {"cuMemSetAccess", (void *)special_cuMemSetAccess},
    {"cuMemHostAlloc", (void *)special_cuMemHostAlloc},
    {"cuMemHostGetDevicePointer", (void *)special_cuMemHostGetDevicePointer},
    {"cuMemFreeHost", (void *)special_cuMemFreeHost},
    {"cuMemAlloc", (void *)special_cuMemAlloc},
    {"cuMemFree", (void *)special_cuMemFree},
    {"cuIpcGetMemHandle", (void *)special_cuIpcGetMemHandle},
    {"cuIpcOpenMemHandle", (void *)special_cuIpcOpenMemHandle},
    {"cuIpcCloseMemHandle", (void *)special_cuIpcCloseMemHandle},
    {"cuStreamGetCaptureInfo", (void *)special_cuStreamGetCaptureInfo},
    {"cuLaunchKernelEx", (void *)special_cuLaunchKernelEx},
};

static void *const fake_fns[] = {
#define PTR(tier, name, dl, ver, params, args) (void *)fake_##name,
    GSCU_DRIVER_FUNCS(PTR)
#undef PTR
};

static int fake_is_missing(const char *name) {
	size_t n = strlen(name);
	for (const char *p = gscu_fake_missing; (p = strstr(p, name)) != NULL; p += n) {
		int starts = p == gscu_fake_missing || p[-1] == ',';
		int ends = p[n] == '\0' || p[n] == ',';
		if (starts && ends)
			return 1;
	}
	return 0;
}

static void *fake_lookup(int i) {
	const char *name = driver_syms[i].name;
	if (driver_syms[i].tier == GSCU_TIER_MC)
		gscu_fake_lookups_mc++;
	if (fake_is_missing(name))
		return NULL;
	for (size_t k = 0; k < sizeof specials / sizeof specials[0]; k++)
		if (strcmp(specials[k].name, name) == 0)
			return specials[k].fn;
	return fake_fns[i];
}

/* ---- resolution ----------------------------------------------------------------- */

typedef CUresult (*getproc_fn)(const char *, void **, int, cuuint64_t,
                               CUdriverProcAddressQueryResult *);

static void *real_lookup(void *lib, getproc_fn getproc, const gscu_sym *s) {
	if (getproc) {
		void *fn = NULL;
		CUdriverProcAddressQueryResult status = 0;
		if (getproc(s->name, &fn, s->version, GSCU_GET_PROC_ADDRESS_LEGACY_STREAM,
		            &status) == GSCU_SUCCESS &&
		    status == 0 && fn)
			return fn;
	}
	return dlsym(lib, s->dlname);
}

static void resolve_driver(gscu_driver *t, void *lib, int fake, int mask) {
	getproc_fn getproc = NULL;
	if (!fake && lib)
		getproc = (getproc_fn)dlsym(lib, "cuGetProcAddress_v2");
	for (int i = 0; i < GSCU_NUM_DRIVER_FUNCS; i++) {
		const gscu_sym *s = &driver_syms[i];
		if (!(s->tier & mask))
			continue;
		*slot(t, s) = fake ? fake_lookup(i) : (lib ? real_lookup(lib, getproc, s) : NULL);
	}
}

void gscu_driver_resolve(gscu_driver *t, void *lib, int fake, int mask) {
	resolve_driver(t, lib, fake, mask & GSCU_TIER_ALL_BUT_MC);
}

void gscu_enable_multicast(gscu_driver *t, void *lib, int fake) {
	resolve_driver(t, lib, fake, GSCU_TIER_MC);
	t->mc_enabled = 1;
}

void gscu_nvrtc_resolve(gscu_nvrtc *t, void *lib) {
	for (int i = 0; i < GSCU_NUM_NVRTC_FUNCS; i++)
		*slot(t, &nvrtc_syms[i]) = lib ? dlsym(lib, nvrtc_syms[i].dlname) : NULL;
}

const char *gscu_driver_sym_name(int i) {
	return i >= 0 && i < GSCU_NUM_DRIVER_FUNCS ? driver_syms[i].name : NULL;
}
const char *gscu_driver_sym_dlname(int i) {
	return i >= 0 && i < GSCU_NUM_DRIVER_FUNCS ? driver_syms[i].dlname : NULL;
}
int gscu_driver_sym_tier(int i) {
	return i >= 0 && i < GSCU_NUM_DRIVER_FUNCS ? driver_syms[i].tier : 0;
}
int gscu_driver_sym_present(const gscu_driver *t, int i) {
	return i >= 0 && i < GSCU_NUM_DRIVER_FUNCS && *slot((void *)t, &driver_syms[i]) != NULL;
}
const char *gscu_nvrtc_sym_name(int i) {
	return i >= 0 && i < GSCU_NUM_NVRTC_FUNCS ? nvrtc_syms[i].name : NULL;
}
int gscu_nvrtc_sym_present(const gscu_nvrtc *t, int i) {
	return i >= 0 && i < GSCU_NUM_NVRTC_FUNCS && *slot((void *)t, &nvrtc_syms[i]) != NULL;
}

CUresult gscu_driver_init(void *lib) {
	CUresult (*init)(unsigned int) = (CUresult(*)(unsigned int))dlsym(lib, "cuInit");
	return init ? init(0) : GSCU_ERROR_NO_SYMBOL;
}
