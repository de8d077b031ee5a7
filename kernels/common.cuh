// Device helpers shared by the gosym kernels: element types, reduction
// operators, 16-byte vectors and the cross-GPU block barrier.
//
// NVRTC compiles these sources with no system headers, so everything used
// here is a compiler builtin or declared below. kernels.Source pastes this
// file in place of its #include line.
#ifndef GOSYM_COMMON_CUH
#define GOSYM_COMMON_CUH

#include "params.cuh"

typedef unsigned int gs_u32;
typedef unsigned long long gs_u64;

// Signal pads (one per rank and channel; layout constants in params.cuh):
//   flags[b][src]    written by rank src with the number of barriers its
//                    block b has passed toward us (st.release.sys);
//   counters[b][dst] our own count of barriers block b passed toward dst,
//                    local, never read by a peer;
//   error words      the first error this rank saw: code, detail, and a
//                    mask of the ranks that did not arrive;
//   host error       (64-bit) device address of a pinned host block that
//                    gets a copy of the error words, so that the host
//                    sees them without a driver call (0: none);
//   sema ready[src]  set (GS_SEMA_SET) by rank src when its input is staged
//   sema done[src]   set by rank src when it no longer reads our staging
//                    (for reduce: when the root released us). Written by
//                    stream memory operations (sema.go), waited on and
//                    consumed (back to 0) by the pad's owner only.
// Counters only grow, so a pad is zeroed once when it is allocated and never
// reset between collectives; semaphores are back to 0 after every protocol
// round. Both are what makes replaying a captured CUDA graph safe.
static_assert(GS_PAD_COUNTERS >= GS_PAD_FLAGS + GS_MAX_BLOCKS * GS_MAX_RANKS, "pad: flags overlap");
static_assert(GS_PAD_ERROR >= GS_PAD_COUNTERS + GS_MAX_BLOCKS * GS_MAX_RANKS, "pad: counters overlap");
static_assert(GS_PAD_HOST_ERROR > GS_PAD_ERROR_MISSING && GS_PAD_HOST_ERROR % 2 == 0,
              "pad: the host error pointer overlaps the error words or is misaligned");
static_assert(GS_PAD_SEMA_READY >= GS_PAD_HOST_ERROR + 2 && GS_PAD_SEMA_READY % 16 == 0,
              "pad: semaphores overlap the error words");
static_assert(GS_PAD_SEMA_DONE >= GS_PAD_SEMA_READY + GS_MAX_RANKS, "pad: semaphores overlap");
static_assert(GS_PAD_USED >= GS_PAD_SEMA_DONE + GS_MAX_RANKS && GS_PAD_USED * 4 <= GS_PAD_BYTES,
              "pad: layout does not fit");

// ---- memory ordering --------------------------------------------------------
//
// GS_EMULATION is defined only by the host-side emulation test
// (testdata/emu.h), which runs these sources as plain C++ with one OS thread
// per rank to check the index arithmetic and the barrier protocol.

#ifndef GS_EMULATION
__device__ __forceinline__ void gs_st_release(gs_u32 *p, gs_u32 v) {
	asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ gs_u32 gs_ld_acquire(const gs_u32 *p) {
	gs_u32 v;
	asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
	return v;
}

__device__ __forceinline__ gs_u64 gs_globaltimer() {
	gs_u64 t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}
#else
__device__ __forceinline__ void gs_st_release(gs_u32 *p, gs_u32 v) {
	__atomic_store_n(p, v, __ATOMIC_RELEASE);
}
__device__ __forceinline__ gs_u32 gs_ld_acquire(const gs_u32 *p) {
	gs_emu_spin(); // let the peer's thread run: ranks share a few cores
	return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
__device__ __forceinline__ gs_u64 gs_globaltimer() { return gs_emu_globaltimer(); }
#endif

// Records the first error seen on this rank's pad; later ones only add to
// the missing-rank mask. When the pad names a host error block, the error
// goes there too (the host checks it before each op): the mask from every
// recorder, detail and then the code (release, system scope) from the
// first, so a host that sees the code sees its detail.
__device__ __forceinline__ void gs_record_error(gs_u32 *pad, gs_u32 code, gs_u32 detail,
                                                gs_u32 missing) {
	if (!pad)
		return;
	const bool first = atomicCAS(pad + GS_PAD_ERROR, 0u, code) == 0u;
	if (first)
		atomicExch(pad + GS_PAD_ERROR_DETAIL, detail);
	const gs_u32 all = atomicOr(pad + GS_PAD_ERROR_MISSING, missing) | missing;
	__threadfence_system();
	gs_u32 *host = *(gs_u32 *const volatile *)(pad + GS_PAD_HOST_ERROR);
	if (!host)
		return;
	gs_st_release(host + GS_HOST_ERROR_MISSING, all);
	if (first) {
		gs_st_release(host + GS_HOST_ERROR_DETAIL, detail);
		gs_st_release(host + GS_HOST_ERROR_CODE, code);
	}
	__threadfence_system();
}

// Checks what every kernel relies on. The answer is the same for all
// threads of a block; a bad rank cannot be reported (no pad to write to).
// max_blocks: GS_MAX_BLOCKS (the pad's per-block barrier words), or the LL
// launches' own limit (GS_LL_BLOCKS: one sequence word a block).
__device__ __forceinline__ bool gs_config_ok(gs_u32 *const *pads, int world, int rank,
                                             unsigned max_blocks = GS_MAX_BLOCKS) {
	if (world < 1 || world > GS_MAX_RANKS || rank < 0 || rank >= world)
		return false;
	if (gridDim.x > max_blocks || gridDim.y != 1 || gridDim.z != 1 ||
	    blockDim.x < 32 || blockDim.y != 1 || blockDim.z != 1) {
		if (threadIdx.x == 0)
			gs_record_error(pads[rank], GS_ERR_CONFIG,
			                (gridDim.x << 16) | (blockDim.x & 0xffffu), 0);
		return false;
	}
	return true;
}

// A host left an abort on pad: a peer's (a rank that refused the op, its
// arguments differing: gobackend/internal/gpu/sig.go) or this rank's own
// (a peer was lost: gobackend/watchdog.go). Recorded as this rank's error
// (the detail is on the pad before the code), and the wait gives up.
__device__ __forceinline__ bool gs_aborted(gs_u32 *pad) {
	if (!pad)
		return false;
	const gs_u32 code = gs_ld_acquire(pad + GS_PAD_ABORT);
	if (code == 0)
		return false;
	gs_record_error(pad, code, gs_ld_acquire(pad + GS_PAD_ABORT_DETAIL), 0);
	return true;
}

// Spins until ready() holds; false if that took longer than timeout_ns (0
// waits forever) or aborted() said so (it records the abort). The one
// deadline loop of every wait: flags (gs_poll, gs_p2p_wait) and LL lines
// (ll.cuh). The abort is read every 64th turn: a wait that ends soon never
// reads it.
template <class Ready, class Aborted>
__device__ __forceinline__ bool gs_wait_or(Ready ready, gs_u64 timeout_ns, Aborted aborted) {
	gs_u64 start = 0;
	for (gs_u32 turn = 1; !ready(); turn++) {
		if ((turn & 63u) == 0 && aborted())
			return false;
		if (timeout_ns == 0)
			continue;
		const gs_u64 now = gs_globaltimer();
		if (start == 0)
			start = now;
		else if (now - start > timeout_ns)
			return false;
	}
	return true;
}

// gs_wait_or with the abort word of pad (this rank's own pad; null for
// waits no abort concerns).
template <class Ready>
__device__ __forceinline__ bool gs_wait(Ready ready, gs_u64 timeout_ns, gs_u32 *pad) {
	return gs_wait_or(ready, timeout_ns, [&] { return gs_aborted(pad); });
}

// Polls *flag (acquire) until done(value); false if that took longer than
// timeout_ns (0 waits forever) or pad was aborted (gs_wait).
template <class Done>
__device__ __forceinline__ bool gs_poll(const gs_u32 *flag, Done done, gs_u64 timeout_ns, gs_u32 *pad) {
	return gs_wait([&] { return done(gs_ld_acquire(flag)); }, timeout_ns, pad);
}

// A barrier flag has reached want (cyclic comparison).
struct GsReached {
	gs_u32 want;
	__device__ __forceinline__ bool operator()(gs_u32 v) const { return (int)(v - want) >= 0; }
};

// Barrier between block blockIdx.x of every rank (the pattern of vLLM's
// custom all-reduce after PR #8558 and of PyTorch's sync_remote_blocks).
// Thread t < world handles peer t: it bumps its local counter, publishes the
// new value in the peer's flag slot with release semantics, then waits with
// acquire semantics until the peer's value in our slot has caught up. The
// comparison is cyclic, so a peer that already moved on to the next barrier
// (and wrote a larger value) releases us too, and wrap-around is harmless.
// The __syncthreads before and after extend the ordering to the whole block.
// Returns false, with the error recorded on our pad, if some peer did not
// arrive within timeout_ns (0 waits forever); the caller must then return,
// and the channel's pads must be re-zeroed on every rank before reuse.
__device__ __forceinline__ bool gs_block_barrier(gs_u32 *const *pads, int world, int rank,
                                                 gs_u64 timeout_ns) {
	__syncthreads();
	int failed = 0;
	const int t = threadIdx.x;
	if (t < world && t != rank) {
		gs_u32 *own = pads[rank];
		const gs_u32 slot = blockIdx.x * GS_MAX_RANKS;
		gs_u32 *counter = own + GS_PAD_COUNTERS + slot + t;
		const gs_u32 want = *counter + 1u;
		*counter = want;
		gs_st_release(pads[t] + GS_PAD_FLAGS + slot + rank, want);
		if (!gs_poll(own + GS_PAD_FLAGS + slot + t, GsReached{want}, timeout_ns, own)) {
			gs_record_error(own, GS_ERR_TIMEOUT, (blockIdx.x << 8) | (gs_u32)t, 1u << t);
			failed = 1;
		}
	}
	return !__syncthreads_or(failed);
}

// ---- element types ------------------------------------------------------------
//
// S is the stored type, A the accumulator. Half, bfloat16 and fp8 travel as
// their bit patterns and accumulate in float; integers accumulate in their
// own type (8-bit ones in int) with two's-complement wrap-around. A type is
// one typedef or struct here and one line of GS_AR_KERNELS (allreduce.cu).

#ifndef GS_EMULATION
__device__ __forceinline__ float gs_h2f(unsigned short h) {
	float f;
	asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
	return f;
}

__device__ __forceinline__ unsigned short gs_f2h(float f) {
	unsigned short h;
	asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
	return h;
}
#else // the host data plane's exact conversions (reduce_kernels.h)
__device__ __forceinline__ float gs_h2f(unsigned short h) {
	const gs_u32 sign = (gs_u32)(h & 0x8000u) << 16, em = h & 0x7fffu;
	gs_u32 r;
	if (em >= 0x7c00u)
		r = (em << 13) | 0x7f800000u;
	else if (em < 0x0400u)
		r = __float_as_uint((float)(int)em * 0x1p-24f);
	else
		r = (em << 13) + 0x38000000u;
	return __uint_as_float(r | sign);
}

__device__ __forceinline__ unsigned short gs_f2h(float f) {
	gs_u32 u = __float_as_uint(f);
	const gs_u32 sign = (u >> 16) & 0x8000u;
	u &= 0x7fffffffu;
	gs_u32 r;
	if (u >= 0x47800000u)
		r = u > 0x7f800000u ? (0x7e00u | ((u >> 13) & 0x3ffu)) : 0x7c00u;
	else if (u < 0x38800000u)
		r = __float_as_uint(__uint_as_float(u) + 0.5f) - 0x3f000000u;
	else
		r = (u + 0xc8000fffu + ((u >> 13) & 1u)) >> 13;
	return (unsigned short)(r | sign);
}
#endif

// Every kernel's first statement. The engine may launch any kernel with
// programmatic stream serialization (cuda.Module.SetDependentLaunch): it can
// then start while the previous kernel of its stream still runs, once that
// kernel's blocks have all passed their gs_kernel_begin. The wait returns when
// the previous grid has finished and its memory is visible, so nothing of
// ours reads or writes before it; the trigger after it lets the next kernel
// of the stream start early in turn (one parked grid per stream at most: a
// kernel triggers only after its own wait). Without the launch attribute both
// are no-ops; before sm_90, and in the host emulation, they are not emitted.
__device__ __forceinline__ void gs_kernel_begin() {
#if !defined(GS_EMULATION) && __CUDA_ARCH__ >= 900
	asm volatile("griddepcontrol.wait;" ::: "memory");
	asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ float gs_b2f(unsigned short b) {
	return __uint_as_float(((gs_u32)b) << 16);
}

// Round to nearest even; NaN stays NaN.
__device__ __forceinline__ unsigned short gs_f2b(float f) {
#if !defined(GS_EMULATION) && __CUDA_ARCH__ >= 800
	unsigned short b;
	asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(f));
	return b;
#else
	const gs_u32 u = __float_as_uint(f);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (unsigned short)((u >> 16) | 0x0040u);
	return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
#endif
}

// fp8 (OCP e4m3fn and e5m2), as NCCL 2.28 reduces it: widened to float,
// folded in float, rounded once to nearest even and saturated to the
// largest finite value (NCCL converts with __NV_SATFINITE; NaN stays NaN).
//
// Widening goes through half, which holds every fp8 value: e5m2 is the top
// byte of a half; an e4m3fn magnitude shifted into a half's bits is the
// value times 2^-8 (the biases are 15 and 7), and its one NaN (0x7f) would
// read as a number.
__device__ __forceinline__ float gs_e5m2_to_f(gs_u32 s) { return gs_h2f((unsigned short)(s << 8)); }
__device__ __forceinline__ float gs_e4m3_to_f(gs_u32 s) {
	const float v = gs_h2f((unsigned short)(((s & 0x80u) << 8) | ((s & 0x7fu) << 7))) * 256.0f;
	return (s & 0x7fu) == 0x7fu ? __uint_as_float(0x7fc00000u) : v;
}

// Narrowing: the sm_89+ instruction where there is one (the low byte of
// the pair it converts), else integer arithmetic with the same rounding,
// M mantissa bits, exponent bias B and, with kInf, an all-ones exponent
// for infinity and NaN (e5m2) rather than one NaN code (e4m3fn).
template <int M, int B, bool kInf> __device__ __forceinline__ unsigned char gs_f_to_f8_soft(float f) {
	const gs_u32 u = __float_as_uint(f), sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
	const gs_u32 maxcode = kInf ? (((0x7fu >> M) - 1u) << M) | ((1u << M) - 1u) : 0x7eu;
	if (a > 0x7f800000u)
		return (unsigned char)(sign | 0x7fu);
	gs_u32 r;
	if (a >= (gs_u32)(127 + 1 - B) << 23) { // normal: rebias, round off 23-M bits
		const gs_u32 v = a - ((gs_u32)(127 - B) << 23);
		r = (v + (1u << (22 - M)) - 1u + ((v >> (23 - M)) & 1u)) >> (23 - M);
	} else { // subnormal: the significand in units of 2^(1-B-M)
		const int sh = 23 + 1 - B - M - ((int)(a >> 23) - 127);
		const gs_u32 mm = (a & 0x7fffffu) | 0x800000u;
		if (a < 0x800000u || sh > 25) {
			r = 0;
		} else {
			const gs_u32 q = mm >> sh, rem = mm & ((1u << sh) - 1u), half = 1u << (sh - 1);
			r = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
		}
	}
	return (unsigned char)(sign | (r < maxcode ? r : maxcode));
}

#if !defined(GS_EMULATION) && __CUDA_ARCH__ >= 890
__device__ __forceinline__ unsigned char gs_f_to_e4m3(float f) {
	unsigned short d;
	asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(d) : "f"(0.0f), "f"(f));
	return (unsigned char)d;
}
__device__ __forceinline__ unsigned char gs_f_to_e5m2(float f) {
	unsigned short d;
	asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(d) : "f"(0.0f), "f"(f));
	return (unsigned char)d;
}
#else
__device__ __forceinline__ unsigned char gs_f_to_e4m3(float f) { return gs_f_to_f8_soft<3, 7, false>(f); }
__device__ __forceinline__ unsigned char gs_f_to_e5m2(float f) { return gs_f_to_f8_soft<2, 15, true>(f); }
#endif

// A type that loads and stores by plain conversion.
template <class Stored, class Acc, bool Float> struct GsPlain {
	typedef Stored S;
	typedef Acc A;
	static const bool kFloat = Float;
	static __device__ __forceinline__ A load(S s) { return (A)s; }
	static __device__ __forceinline__ S store(A a) { return (S)a; }
};

typedef GsPlain<float, float, true> GsF32;
typedef GsPlain<double, double, true> GsF64;
typedef GsPlain<int, int, false> GsI32;
typedef GsPlain<long long, long long, false> GsI64;

// A type stored as bits that accumulates in float, through its converters.
#define GS_VIA_FLOAT(Name, Stored, to_float, from_float)                                          \
	struct Name {                                                                              \
		typedef Stored S;                                                                  \
		typedef float A;                                                                   \
		static const bool kFloat = true;                                                   \
		static __device__ __forceinline__ A load(S s) { return to_float(s); }              \
		static __device__ __forceinline__ S store(A a) { return from_float(a); }           \
	};

GS_VIA_FLOAT(GsF16, unsigned short, gs_h2f, gs_f2h)
GS_VIA_FLOAT(GsBF16, unsigned short, gs_b2f, gs_f2b)
GS_VIA_FLOAT(GsF8E4M3, unsigned char, gs_e4m3_to_f, gs_f_to_e4m3)
GS_VIA_FLOAT(GsF8E5M2, unsigned char, gs_e5m2_to_f, gs_f_to_e5m2)

// 8-bit integers fold in int and keep the low byte: the bits of folding in
// the 8-bit type with two's-complement wrap-around.
template <class Stored> struct GsByte {
	typedef Stored S;
	typedef int A;
	static const bool kFloat = false;
	static __device__ __forceinline__ A load(S s) { return (A)s; }
	static __device__ __forceinline__ S store(A a) { return (S)(unsigned char)(gs_u32)a; }
};
typedef GsByte<signed char> GsI8;
typedef GsByte<unsigned char> GsU8;

// ---- reduction operators ------------------------------------------------------

__device__ __forceinline__ float gs_add(float a, float b) { return a + b; }
__device__ __forceinline__ double gs_add(double a, double b) { return a + b; }
__device__ __forceinline__ int gs_add(int a, int b) { return (int)((gs_u32)a + (gs_u32)b); }
__device__ __forceinline__ long long gs_add(long long a, long long b) {
	return (long long)((gs_u64)a + (gs_u64)b);
}
__device__ __forceinline__ float gs_mul(float a, float b) { return a * b; }
__device__ __forceinline__ double gs_mul(double a, double b) { return a * b; }
__device__ __forceinline__ int gs_mul(int a, int b) { return (int)((gs_u32)a * (gs_u32)b); }
__device__ __forceinline__ long long gs_mul(long long a, long long b) {
	return (long long)((gs_u64)a * (gs_u64)b);
}

// NaN-propagating like torch.minimum/maximum (and the host data plane): a NaN
// operand wins, the first one if both are; ties keep the first operand.
template <class F> __device__ __forceinline__ F gs_fmin(F a, F b) {
	F r = b < a ? b : a;
	r = b != b ? b : r;
	return a != a ? a : r;
}
template <class F> __device__ __forceinline__ F gs_fmax(F a, F b) {
	F r = b > a ? b : a;
	r = b != b ? b : r;
	return a != a ? a : r;
}
__device__ __forceinline__ float gs_min(float a, float b) { return gs_fmin(a, b); }
__device__ __forceinline__ double gs_min(double a, double b) { return gs_fmin(a, b); }
__device__ __forceinline__ float gs_max(float a, float b) { return gs_fmax(a, b); }
__device__ __forceinline__ double gs_max(double a, double b) { return gs_fmax(a, b); }
template <class T> __device__ __forceinline__ T gs_min(T a, T b) { return b < a ? b : a; }
template <class T> __device__ __forceinline__ T gs_max(T a, T b) { return b > a ? b : a; }

// Scaling after a floating SUM, in the accumulator's precision (a float
// accumulator gets the factor rounded to float); integers never get here
// with post != 0.
template <class F> __device__ __forceinline__ F gs_fpost(F a, F scale, int post) {
	if (post == GS_POST_MUL)
		return a * scale;
	if (post == GS_POST_DIV)
		return a / scale;
	return a;
}
__device__ __forceinline__ float gs_post(float a, double scale, int post) {
	return gs_fpost(a, (float)scale, post);
}
__device__ __forceinline__ double gs_post(double a, double scale, int post) {
	return gs_fpost(a, scale, post);
}
template <class T> __device__ __forceinline__ T gs_post(T a, double, int) { return a; }

struct GsSum {
	static const bool kScales = true;
	template <class A> static __device__ __forceinline__ A apply(A a, A b) { return gs_add(a, b); }
};
struct GsProd {
	static const bool kScales = false;
	template <class A> static __device__ __forceinline__ A apply(A a, A b) { return gs_mul(a, b); }
};
struct GsMin {
	static const bool kScales = false;
	template <class A> static __device__ __forceinline__ A apply(A a, A b) { return gs_min(a, b); }
};
struct GsMax {
	static const bool kScales = false;
	template <class A> static __device__ __forceinline__ A apply(A a, A b) { return gs_max(a, b); }
};

// ---- 16-byte vectors ----------------------------------------------------------

struct alignas(16) gs_v16 {
	gs_u32 w[4];
};

// A 16-byte vector seen as elements of T.
template <class T> union GsPack {
	static const int kN = 16 / sizeof(typename T::S);
	gs_v16 v;
	typename T::S e[kN];
};

__device__ __forceinline__ gs_u64 gs_thread_index() {
	return (gs_u64)blockIdx.x * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ gs_u64 gs_thread_count() { return (gs_u64)gridDim.x * blockDim.x; }

#endif // GOSYM_COMMON_CUH
