/* CPU reduction kernels: dispatch and instantiation. The kernels themselves
 * are in reduce_kernels.h; see there and reduce.go. */
#include <string.h>

#include "reduce.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* Flags that change what the kernels compute, set here because cgo does not
 * accept them in #cgo CFLAGS. fp-contract=off: never fuse a*b+c into an FMA
 * (one rounding instead of two), so every build, ISA copy and rank gets the
 * same bits. no-trapping-math: we never read FP exception flags, and without
 * it gcc will not if-convert (so not vectorise) the fp16 conversions. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off", "no-trapping-math")
#elif defined(__clang__)
#pragma clang fp contract(off)
#endif

#define GSHOST_CAT2(a, b) a##_##b
#define GSHOST_CAT(a, b) GSHOST_CAT2(a, b)
#define GSHOST_STR2(a) #a
#define GSHOST_STR(a) GSHOST_STR2(a)

/* GOSYM_DTYPE_* (cabi/gosym.h, gobackend/internal/dtype). */
enum { GSHOST_F32, GSHOST_F64, GSHOST_F16, GSHOST_BF16, GSHOST_I8, GSHOST_U8,
       GSHOST_I16, GSHOST_I32, GSHOST_I64, GSHOST_BOOL, GSHOST_NDTYPES };
/* GOSYM_RED_*. */
enum { GSHOST_SUM, GSHOST_AVG, GSHOST_PRODUCT, GSHOST_MIN, GSHOST_MAX,
       GSHOST_PREMUL, GSHOST_BAND, GSHOST_BOR, GSHOST_BXOR, GSHOST_NOPS };

/* Element types with alignment 1: tensors may start at any byte offset, and
 * this keeps the vectoriser from assuming natural alignment. */
typedef float gshost_f32u __attribute__((aligned(1)));
typedef double gshost_f64u __attribute__((aligned(1)));
typedef uint8_t gshost_uint8_tu __attribute__((aligned(1)));
typedef uint16_t gshost_uint16_tu __attribute__((aligned(1)));
typedef uint32_t gshost_uint32_tu __attribute__((aligned(1)));
typedef uint64_t gshost_uint64_tu __attribute__((aligned(1)));
typedef int8_t gshost_int8_tu __attribute__((aligned(1)));
typedef int16_t gshost_int16_tu __attribute__((aligned(1)));
typedef int32_t gshost_int32_tu __attribute__((aligned(1)));
typedef int64_t gshost_int64_tu __attribute__((aligned(1)));

typedef void (*gshost_kernel)(uintptr_t dst, const uintptr_t *srcs, int k,
                              size_t n, double scale);

/* One instruction set's copy of everything. */
struct gshost_isa {
	const char *name;
	const gshost_kernel (*kernels)[GSHOST_NDTYPES][GSHOST_NOPS];
	void (*f32_to_f16)(uint16_t *, const float *, size_t);
	void (*f32_to_bf16)(uint16_t *, const float *, size_t);
	void (*f16_to_f32)(float *, const uint16_t *, size_t);
	void (*bf16_to_f32)(float *, const uint16_t *, size_t);
};

/* Two copies of the kernels rather than target_clones: the choice is then
 * ours to make, so tests run the baseline copy on AVX2 machines too. Both
 * copies produce the same bits (IEEE ops, no FMA, see the pragma above). */
#define ISA generic
#include "reduce_kernels.h"
#undef ISA

#if defined(__x86_64__) && (defined(__clang__) || defined(__GNUC__))
#define GSHOST_HAVE_AVX2 1
#define GSHOST_F16C 1
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,f16c")
#endif
#define ISA avx2
#include "reduce_kernels.h"
#undef ISA
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#undef GSHOST_F16C
#endif

static const struct gshost_isa *gshost_best(void) {
#ifdef GSHOST_HAVE_AVX2
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c"))
		return &isa_avx2;
#endif
	return &isa_generic;
}

/* The kernel set in use: chosen when the library loads, changed only by
 * gshost_reduce_select (tests). */
static const struct gshost_isa *gshost_cur = &isa_generic;

__attribute__((constructor)) static void gshost_reduce_init(void) {
	__atomic_store_n(&gshost_cur, gshost_best(), __ATOMIC_RELAXED);
}

static const struct gshost_isa *gshost_isa_now(void) {
	return __atomic_load_n(&gshost_cur, __ATOMIC_RELAXED);
}

const char *gshost_reduce_select(int force_generic) {
	const struct gshost_isa *isa = force_generic ? &isa_generic : gshost_best();
	__atomic_store_n(&gshost_cur, isa, __ATOMIC_RELAXED);
	return isa->name;
}

int gshost_reduce(uintptr_t dst, const uintptr_t *srcs, int k, size_t n, int dtype,
              int op, double scale) {
	if (dtype < 0 || dtype >= GSHOST_NDTYPES || op < 0 || op >= GSHOST_NOPS || k < 1)
		return GSHOST_EUNSUPPORTED;
	gshost_kernel fn = (*gshost_isa_now()->kernels)[dtype][op];
	if (!fn)
		return GSHOST_EUNSUPPORTED;
#if defined(__x86_64__)
	/* Default SSE control (round to nearest, no FTZ/DAZ) for the call:
	 * results must not depend on what the calling thread set, e.g. through
	 * torch.set_flush_denormal, since ranks compare bits. */
	unsigned int csr = _mm_getcsr();
	_mm_setcsr(0x1f80);
	fn(dst, srcs, k, n, scale);
	_mm_setcsr(csr);
#else
	fn(dst, srcs, k, n, scale);
#endif
	return GSHOST_OK;
}

void gshost_f32_to_f16(uint16_t *d, const float *s, size_t n) { gshost_isa_now()->f32_to_f16(d, s, n); }
void gshost_f32_to_bf16(uint16_t *d, const float *s, size_t n) { gshost_isa_now()->f32_to_bf16(d, s, n); }
void gshost_f16_to_f32(float *d, const uint16_t *s, size_t n) { gshost_isa_now()->f16_to_f32(d, s, n); }
void gshost_bf16_to_f32(float *d, const uint16_t *s, size_t n) { gshost_isa_now()->bf16_to_f32(d, s, n); }
