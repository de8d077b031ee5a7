/* Loader half of the dispatch tables (see dispatch.h). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <string.h>

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
long long gscu_fake_lookups_mc;
int gscu_fake_attr[256];
int gscu_fake_version;
char gscu_fake_missing[1024];
static CUcontext fake_current;

void gscu_fake_reset(void) {
	memset(gscu_fake_calls, 0, sizeof gscu_fake_calls);
	memset(gscu_fake_result, 0, sizeof gscu_fake_result);
	memset(gscu_fake_attr, 0, sizeof gscu_fake_attr);
	memset(gscu_fake_missing, 0, sizeof gscu_fake_missing);
	gscu_fake_lookups_mc = 0;
	gscu_fake_version = 13000;
	fake_current = NULL;
}

#define FAKE(tier, name, dl, ver, params, args)                                               \
	static CUresult fake_##name params {                                                  \
		gscu_fake_calls[GSCU_IDX_##name]++;                                           \
		return gscu_fake_result[GSCU_IDX_##name];                                     \
	}
GSCU_DRIVER_FUNCS(FAKE)
#undef FAKE

/* Stubs that also fill in their outputs. */
#define COUNT(name)                                                                           \
	gscu_fake_calls[GSCU_IDX_##name]++;                                                   \
	if (gscu_fake_result[GSCU_IDX_##name] != GSCU_SUCCESS)                                \
		return gscu_fake_result[GSCU_IDX_##name];

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
	COUNT(cuMulticastCreate);
	*h = 0x6d63;
	return GSCU_SUCCESS;
}
#undef COUNT

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
