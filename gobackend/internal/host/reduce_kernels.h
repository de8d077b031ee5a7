/* Reduction kernels, written as plain loops for the auto-vectoriser.
 *
 * reduce.c includes this file once per instruction set, with ISA defined to a
 * name suffix (generic, avx2) and the matching target pragma in force, so one
 * binary carries a baseline copy and an AVX2+F16C copy of every kernel and
 * picks one at run time. Every name defined here goes through F() to stay
 * distinct between the copies.
 *
 * Kernels never assume alignment (elements are read through aligned(1)
 * types) and never use restrict on dst: dst may equal a source exactly, which
 * gcc's run-time alias check accepts for the fused loops (it only rejects a
 * partial overlap), and which the chunked loops make safe by construction:
 * a chunk of dst is written after every source's chunk was read.
 */

#define F(name) GSHOST_CAT(name, ISA)

/* ---- bit casts and element conversions ---------------------------------- */

static inline uint32_t F(f2u)(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float F(u2f)(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* binary16 -> binary32, exact; a NaN keeps its payload and is quietened, as
 * vcvtph2ps does. */
static inline float F(h2f)(uint16_t h) {
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t em = h & 0x7fffu;
	uint32_t nrm = (em << 13) + 0x38000000u; /* rebias exponent 15 -> 127 */
	uint32_t naninf = (em << 13) | 0x7f800000u | (em > 0x7c00u ? 0x00400000u : 0);
	uint32_t sub = F(f2u)((float)(int32_t)em * 0x1p-24f); /* em < 0x400 here */
	uint32_t r = em >= 0x7c00u ? naninf : (em < 0x0400u ? sub : nrm);
	return F(u2f)(r | sign);
}

/* binary32 -> binary16, round to nearest even; NaNs stay NaN (quietened,
 * top payload bits kept, as vcvtps2ph does). */
static inline uint16_t F(f2h)(float f) {
	uint32_t u = F(f2u)(f);
	uint32_t sign = (u >> 16) & 0x8000u;
	u &= 0x7fffffffu;
	uint32_t naninf = u > 0x7f800000u ? (0x7e00u | ((u >> 13) & 0x3ffu)) : 0x7c00u;
	/* Below 2^-14 the result is subnormal: adding 0.5f lines the value up
	 * on 2^-24 steps and lets the FPU round to nearest even. */
	uint32_t sub = F(f2u)(F(u2f)(u) + 0.5f) - 0x3f000000u;
	/* Normal: rebias 127 -> 15 and round on the 13 dropped bits; a carry
	 * out of the mantissa bumps the exponent, up to infinity. */
	uint32_t nrm = (u + 0xc8000fffu + ((u >> 13) & 1u)) >> 13;
	uint32_t r = u >= 0x47800000u ? naninf : (u < 0x38800000u ? sub : nrm);
	return (uint16_t)(r | sign);
}

static inline float F(b2f)(uint16_t h) { return F(u2f)((uint32_t)h << 16); }

/* binary32 -> bfloat16, round to nearest even; NaNs stay NaN (quietened,
 * truncated: rounding could carry a NaN into the sign bit). */
static inline uint16_t F(f2b)(float f) {
	uint32_t u = F(f2u)(f);
	int nan = (int32_t)(u & 0x7fffffffu) > 0x7f800000;
	uint32_t r = nan ? u | 0x00400000u : u + 0x7fffu + ((u >> 16) & 1u);
	return (uint16_t)(r >> 16);
}

/* ---- combining functions ------------------------------------------------ */

/* NaN-propagating min/max in the manner of torch.minimum/maximum: a NaN
 * operand wins (the first one if both are); on ties the first operand. */
#define GSHOST_FMINMAX(T, sfx)                                               \
	static inline T F(fmin##sfx)(T a, T b) {                             \
		T r = b < a ? b : a;                                         \
		r = b != b ? b : r;                                          \
		return a != a ? a : r;                                       \
	}                                                                    \
	static inline T F(fmax##sfx)(T a, T b) {                             \
		T r = b > a ? b : a;                                         \
		r = b != b ? b : r;                                          \
		return a != a ? a : r;                                       \
	}
GSHOST_FMINMAX(float, 32)
GSHOST_FMINMAX(double, 64)
#undef GSHOST_FMINMAX

/* ---- kernels on the stored type ------------------------------------------
 *
 * For float32, float64, the integers and bool. ST: storage type (unaligned),
 * AT: arithmetic type. LOAD reads one element (bool normalises it), PRE
 * scales each source (PREMUL_SUM), COMB folds the next source into the running
 * value, POST finishes (AVG). Inside these, sc is the scale and kf the source
 * count, both as AT.
 *
 * k == 1 and k == 2 are single fused loops. For k > 2 the running value of a
 * chunk lives in a small local array (in L1) while the sources stream past.
 */
#define GSHOST_CHUNK 1024

#define GSHOST_KERNEL(name, ST, AT, LOAD, PRE, COMB, POST)                          \
	static void F(name)(uintptr_t dstp, const uintptr_t *srcs, int k, size_t n, \
	                    double scale) {                                         \
		ST *dst = (ST *)dstp;                                               \
		const AT sc = (AT)scale, kf = (AT)k;                                \
		(void)sc;                                                           \
		(void)kf;                                                           \
		if (k == 1) {                                                       \
			const ST *a = (const ST *)srcs[0];                          \
			for (size_t i = 0; i < n; i++)                              \
				dst[i] = POST(PRE(LOAD(a[i])));                     \
			return;                                                     \
		}                                                                   \
		if (k == 2) {                                                       \
			const ST *a = (const ST *)srcs[0];                          \
			const ST *b = (const ST *)srcs[1];                          \
			for (size_t i = 0; i < n; i++)                              \
				dst[i] = POST(COMB(PRE(LOAD(a[i])), PRE(LOAD(b[i])))); \
			return;                                                     \
		}                                                                   \
		AT acc[GSHOST_CHUNK];                                               \
		for (size_t base = 0; base < n; base += GSHOST_CHUNK) {             \
			size_t m = n - base < GSHOST_CHUNK ? n - base : GSHOST_CHUNK; \
			const ST *a = (const ST *)srcs[0] + base;                   \
			const ST *b = (const ST *)srcs[1] + base;                   \
			for (size_t i = 0; i < m; i++)                              \
				acc[i] = COMB(PRE(LOAD(a[i])), PRE(LOAD(b[i])));    \
			for (int j = 2; j < k - 1; j++) {                           \
				const ST *s = (const ST *)srcs[j] + base;           \
				for (size_t i = 0; i < m; i++)                      \
					acc[i] = COMB(acc[i], PRE(LOAD(s[i])));     \
			}                                                           \
			const ST *s = (const ST *)srcs[k - 1] + base;               \
			ST *d = dst + base;                                         \
			for (size_t i = 0; i < m; i++)                              \
				d[i] = POST(COMB(acc[i], PRE(LOAD(s[i]))));         \
		}                                                                   \
	}

#define GSHOST_ID(x) (x)
#define GSHOST_SCALE(x) ((x) * sc)
#define GSHOST_DIVK(x) ((x) / kf)
#define GSHOST_ADD(a, b) ((a) + (b))
#define GSHOST_MUL(a, b) ((a) * (b))

#define GSHOST_FLOAT_KERNELS(tag, ST, AT, sfx)                                        \
	GSHOST_KERNEL(tag##_sum, ST, AT, GSHOST_ID, GSHOST_ID, GSHOST_ADD, GSHOST_ID)     \
	GSHOST_KERNEL(tag##_avg, ST, AT, GSHOST_ID, GSHOST_ID, GSHOST_ADD, GSHOST_DIVK)   \
	GSHOST_KERNEL(tag##_premul, ST, AT, GSHOST_ID, GSHOST_SCALE, GSHOST_ADD, GSHOST_ID) \
	GSHOST_KERNEL(tag##_prod, ST, AT, GSHOST_ID, GSHOST_ID, GSHOST_MUL, GSHOST_ID)    \
	GSHOST_KERNEL(tag##_min, ST, AT, GSHOST_ID, GSHOST_ID, F(fmin##sfx), GSHOST_ID)   \
	GSHOST_KERNEL(tag##_max, ST, AT, GSHOST_ID, GSHOST_ID, F(fmax##sfx), GSHOST_ID)
GSHOST_FLOAT_KERNELS(f32, gshost_f32u, float, 32)
GSHOST_FLOAT_KERNELS(f64, gshost_f64u, double, 64)

/* ---- kernels on fp16 and bf16 -------------------------------------------- */

/* fp16 and bf16 go chunk by chunk through float32 arrays: widen each source
 * chunk, combine in float32, narrow once. Keeping the conversions in loops of
 * their own lets them use F16C where there is one, and keeps the vectoriser
 * from running out of registers on conversion and arithmetic at once. */
static void F(widen_f16)(float *restrict d, const gshost_uint16_tu *restrict s, size_t m) {
	size_t i = 0;
#ifdef GSHOST_F16C
	for (; i + 8 <= m; i += 8)
		_mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
#endif
	for (; i < m; i++)
		d[i] = F(h2f)(s[i]);
}

static void F(narrow_f16)(gshost_uint16_tu *restrict d, const float *restrict s, size_t m) {
	size_t i = 0;
#ifdef GSHOST_F16C
	for (; i + 8 <= m; i += 8)
		_mm_storeu_si128((__m128i *)(d + i), _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
#endif
	for (; i < m; i++)
		d[i] = F(f2h)(s[i]);
}

static void F(widen_bf16)(float *restrict d, const gshost_uint16_tu *restrict s, size_t m) {
	for (size_t i = 0; i < m; i++)
		d[i] = F(b2f)(s[i]);
}

static void F(narrow_bf16)(gshost_uint16_tu *restrict d, const float *restrict s, size_t m) {
	for (size_t i = 0; i < m; i++)
		d[i] = F(f2b)(s[i]);
}

#define GSHOST_KERNEL16(name, fmt, PRE, COMB, POST)                                    \
	static void F(name)(uintptr_t dstp, const uintptr_t *srcs, int k, size_t n,    \
	                    double scale) {                                            \
		const float sc = (float)scale, kf = (float)k;                          \
		(void)sc;                                                              \
		(void)kf;                                                              \
		float acc[GSHOST_CHUNK], tmp[GSHOST_CHUNK];                            \
		for (size_t base = 0; base < n; base += GSHOST_CHUNK) {                \
			size_t m = n - base < GSHOST_CHUNK ? n - base : GSHOST_CHUNK;  \
			F(widen_##fmt)(acc, (const gshost_uint16_tu *)srcs[0] + base, m); \
			if (k == 1)                                                    \
				for (size_t i = 0; i < m; i++)                         \
					acc[i] = POST(PRE(acc[i]));                    \
			for (int j = 1; j < k; j++) {                                  \
				F(widen_##fmt)(tmp, (const gshost_uint16_tu *)srcs[j] + base, m); \
				if (j == 1 && j == k - 1)                              \
					for (size_t i = 0; i < m; i++)                 \
						acc[i] = POST(COMB(PRE(acc[i]), PRE(tmp[i]))); \
				else if (j == 1)                                       \
					for (size_t i = 0; i < m; i++)                 \
						acc[i] = COMB(PRE(acc[i]), PRE(tmp[i]));  \
				else if (j == k - 1)                                   \
					for (size_t i = 0; i < m; i++)                 \
						acc[i] = POST(COMB(acc[i], PRE(tmp[i])));  \
				else                                                   \
					for (size_t i = 0; i < m; i++)                 \
						acc[i] = COMB(acc[i], PRE(tmp[i]));        \
			}                                                              \
			F(narrow_##fmt)((gshost_uint16_tu *)dstp + base, acc, m);      \
		}                                                                      \
	}

#define GSHOST_HALF_KERNELS(fmt)                                                        \
	GSHOST_KERNEL16(fmt##_sum, fmt, GSHOST_ID, GSHOST_ADD, GSHOST_ID)               \
	GSHOST_KERNEL16(fmt##_avg, fmt, GSHOST_ID, GSHOST_ADD, GSHOST_DIVK)             \
	GSHOST_KERNEL16(fmt##_premul, fmt, GSHOST_SCALE, GSHOST_ADD, GSHOST_ID)         \
	GSHOST_KERNEL16(fmt##_prod, fmt, GSHOST_ID, GSHOST_MUL, GSHOST_ID)              \
	GSHOST_KERNEL16(fmt##_min, fmt, GSHOST_ID, F(fmin32), GSHOST_ID)                \
	GSHOST_KERNEL16(fmt##_max, fmt, GSHOST_ID, F(fmax32), GSHOST_ID)
GSHOST_HALF_KERNELS(f16)
GSHOST_HALF_KERNELS(bf16)

/* ---- integer and bool kernels --------------------------------------------
 *
 * Sum, product and the bitwise ops do not depend on signedness, so they run
 * on unsigned types: two's-complement wrap, no UB. b + 0u is at least
 * unsigned int, so 8/16-bit operands never multiply as (overflowing) int. */
#define GSHOST_UINT_OPS(T)                                                      \
	static inline T F(add_##T)(T a, T b) { return (T)(a + (b + 0u)); }     \
	static inline T F(mul_##T)(T a, T b) { return (T)(a * (b + 0u)); }
GSHOST_UINT_OPS(uint8_t)
GSHOST_UINT_OPS(uint16_t)
GSHOST_UINT_OPS(uint32_t)
GSHOST_UINT_OPS(uint64_t)

#define GSHOST_AND(a, b) ((a) & (b))
#define GSHOST_OR(a, b) ((a) | (b))
#define GSHOST_XOR(a, b) ((a) ^ (b))
#define GSHOST_IMIN(a, b) ((b) < (a) ? (b) : (a))
#define GSHOST_IMAX(a, b) ((b) > (a) ? (b) : (a))

#define GSHOST_UINT_KERNELS(tag, T)                                                              \
	GSHOST_KERNEL(tag##_sum, gshost_##T##u, T, GSHOST_ID, GSHOST_ID, F(add_##T), GSHOST_ID) \
	GSHOST_KERNEL(tag##_prod, gshost_##T##u, T, GSHOST_ID, GSHOST_ID, F(mul_##T), GSHOST_ID) \
	GSHOST_KERNEL(tag##_band, gshost_##T##u, T, GSHOST_ID, GSHOST_ID, GSHOST_AND, GSHOST_ID) \
	GSHOST_KERNEL(tag##_bor, gshost_##T##u, T, GSHOST_ID, GSHOST_ID, GSHOST_OR, GSHOST_ID)   \
	GSHOST_KERNEL(tag##_bxor, gshost_##T##u, T, GSHOST_ID, GSHOST_ID, GSHOST_XOR, GSHOST_ID)
GSHOST_UINT_KERNELS(u8, uint8_t)
GSHOST_UINT_KERNELS(u16, uint16_t)
GSHOST_UINT_KERNELS(u32, uint32_t)
GSHOST_UINT_KERNELS(u64, uint64_t)

#define GSHOST_MINMAX_KERNELS(tag, T)                                                            \
	GSHOST_KERNEL(tag##_min, gshost_##T##u, T, GSHOST_ID, GSHOST_ID, GSHOST_IMIN, GSHOST_ID) \
	GSHOST_KERNEL(tag##_max, gshost_##T##u, T, GSHOST_ID, GSHOST_ID, GSHOST_IMAX, GSHOST_ID)
GSHOST_MINMAX_KERNELS(i8, int8_t)
GSHOST_MINMAX_KERNELS(u8, uint8_t)
GSHOST_MINMAX_KERNELS(i16, int16_t)
GSHOST_MINMAX_KERNELS(i32, int32_t)
GSHOST_MINMAX_KERNELS(i64, int64_t)

/* bool: any nonzero byte is true; results are 0 or 1. */
#define GSHOST_TRUTH(x) ((uint8_t)((x) != 0))
GSHOST_KERNEL(bool_or, gshost_uint8_tu, uint8_t, GSHOST_TRUTH, GSHOST_ID, GSHOST_OR, GSHOST_ID)
GSHOST_KERNEL(bool_and, gshost_uint8_tu, uint8_t, GSHOST_TRUTH, GSHOST_ID, GSHOST_AND, GSHOST_ID)
GSHOST_KERNEL(bool_xor, gshost_uint8_tu, uint8_t, GSHOST_TRUTH, GSHOST_ID, GSHOST_XOR, GSHOST_ID)

/* ---- dispatch table ----------------------------------------------------- */

#define GSHOST_FLOAT_ROW(tag)                                                 \
	{[GSHOST_SUM] = F(tag##_sum), [GSHOST_AVG] = F(tag##_avg),            \
	 [GSHOST_PRODUCT] = F(tag##_prod), [GSHOST_MIN] = F(tag##_min),       \
	 [GSHOST_MAX] = F(tag##_max), [GSHOST_PREMUL] = F(tag##_premul)}
#define GSHOST_INT_ROW(tag, mtag)                                             \
	{[GSHOST_SUM] = F(tag##_sum), [GSHOST_PRODUCT] = F(tag##_prod),       \
	 [GSHOST_MIN] = F(mtag##_min), [GSHOST_MAX] = F(mtag##_max),          \
	 [GSHOST_BAND] = F(tag##_band), [GSHOST_BOR] = F(tag##_bor),          \
	 [GSHOST_BXOR] = F(tag##_bxor)}

static const gshost_kernel F(kernels)[GSHOST_NDTYPES][GSHOST_NOPS] = {
	[GSHOST_F32] = GSHOST_FLOAT_ROW(f32),
	[GSHOST_F64] = GSHOST_FLOAT_ROW(f64),
	[GSHOST_F16] = GSHOST_FLOAT_ROW(f16),
	[GSHOST_BF16] = GSHOST_FLOAT_ROW(bf16),
	[GSHOST_I8] = GSHOST_INT_ROW(u8, i8),
	[GSHOST_U8] = GSHOST_INT_ROW(u8, u8),
	[GSHOST_I16] = GSHOST_INT_ROW(u16, i16),
	[GSHOST_I32] = GSHOST_INT_ROW(u32, i32),
	[GSHOST_I64] = GSHOST_INT_ROW(u64, i64),
	[GSHOST_BOOL] = {[GSHOST_SUM] = F(bool_or), [GSHOST_MAX] = F(bool_or),
	                 [GSHOST_BOR] = F(bool_or), [GSHOST_PRODUCT] = F(bool_and),
	                 [GSHOST_MIN] = F(bool_and), [GSHOST_BAND] = F(bool_and),
	                 [GSHOST_BXOR] = F(bool_xor)},
};

/* The chunk conversions, for the tests. */
static void F(cvt_f32_f16)(uint16_t *d, const float *s, size_t n) { F(narrow_f16)(d, s, n); }
static void F(cvt_f32_bf16)(uint16_t *d, const float *s, size_t n) { F(narrow_bf16)(d, s, n); }
static void F(cvt_f16_f32)(float *d, const uint16_t *s, size_t n) { F(widen_f16)(d, s, n); }
static void F(cvt_bf16_f32)(float *d, const uint16_t *s, size_t n) { F(widen_bf16)(d, s, n); }

static const struct gshost_isa F(isa) = {
	GSHOST_STR(ISA), &F(kernels),
	F(cvt_f32_f16), F(cvt_f32_bf16), F(cvt_f16_f32), F(cvt_bf16_f32),
};

#undef F
