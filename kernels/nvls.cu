// NVLink SHARP (NVLS) reductions: multimem.ld_reduce through a multicast
// mapping of every rank's buffer (sm_90 and newer, NVSwitch systems).
//
//   gs_nvls_<type>_<op>(gs_nvls_params)
//     mode GS_NVLS_ONESHOT  out[i] = op over the ranks of element i of mc,
//                           i < numel, into this rank's own (unicast) out:
//                           reduce at the root, or a one-shot all-reduce.
//     mode GS_NVLS_INPLACE  rank r reduces its 1/world slice and stores the
//                           result through mc (multimem.st) into every
//                           rank's copy: an all-reduce in which every rank
//                           ends with the same bits and the switch, not
//                           the GPUs, does the folding.
//
// types x ops: f32 sum; f16 and bf16 sum (accumulated in fp32 by the
// switch, .acc::f32), min and max. That is what PTX offers: no f32 min/max,
// no product, no .acc::f32 for min/max. The switch folds in no fixed order,
// so two one-shot ranks may differ in the last bit; in place they cannot.
//
// Accesses: multimem moves 4 or 16 bytes (there is no 16-bit form), so each
// element is reached through the aligned 4-byte word that holds it, and
// through 16-byte vectors where mc is aligned. Contract:
//   - mc is element-aligned, and the words holding the first and the last
//     element are mapped: a 16-bit range that starts or ends mid-word reads
//     its neighbour too and discards it;
//   - in place, mc is 4-byte aligned, and the half word after an odd-length
//     16-bit range is scratch: it receives the reduction of whatever the
//     ranks hold there;
//   - out may have any element alignment: 16-byte stores where it is
//     co-aligned with mc, element stores elsewhere.
// Every element of [0, numel) is written; none is dropped.
//
// Launch: block = GS_BLOCK_THREADS, grid <= GS_MAX_BLOCKS; in place, the
// same numel on every rank (the slices derive from numel, world and rank).
// No barrier inside: the caller orders the launch after every rank staged
// its data and before anyone reuses it (the semaphore protocol, sema.go).
#include "common.cuh"

// GsMM<T, Op>: the multimem instructions for one element type and operator.
// ld4/ld1 reduce 16/4 bytes over every rank's copy; st4/st1 store to all.
template <class T, class Op> struct GsMM;

#ifndef GS_EMULATION
#define GS_MM(T, Op, OPS, TY)                                                                  \
	template <> struct GsMM<T, Op> {                                                       \
		static __device__ __forceinline__ gs_v16 ld4(const char *a) {                  \
			gs_v16 v;                                                               \
			asm volatile("multimem.ld_reduce.relaxed.sys.global" OPS ".v4" TY       \
			             " {%0,%1,%2,%3}, [%4];"                                    \
			             : "=r"(v.w[0]), "=r"(v.w[1]), "=r"(v.w[2]), "=r"(v.w[3])   \
			             : "l"(a)                                                   \
			             : "memory");                                               \
			return v;                                                               \
		}                                                                               \
		static __device__ __forceinline__ gs_u32 ld1(const char *a) {                  \
			gs_u32 w;                                                               \
			asm volatile("multimem.ld_reduce.relaxed.sys.global" OPS TY " %0, [%1];" \
			             : "=r"(w)                                                  \
			             : "l"(a)                                                   \
			             : "memory");                                               \
			return w;                                                               \
		}                                                                               \
		static __device__ __forceinline__ void st4(char *a, const gs_v16 &v) {         \
			asm volatile("multimem.st.relaxed.sys.global.v4" TY " [%0], {%1,%2,%3,%4};" \
			             ::"l"(a),                                                  \
			             "r"(v.w[0]), "r"(v.w[1]), "r"(v.w[2]), "r"(v.w[3])         \
			             : "memory");                                               \
		}                                                                               \
		static __device__ __forceinline__ void st1(char *a, gs_u32 w) {                \
			asm volatile("multimem.st.relaxed.sys.global" TY " [%0], %1;" ::"l"(a), \
			             "r"(w)                                                     \
			             : "memory");                                               \
		}                                                                               \
	};

GS_MM(GsF32, GsSum, ".add", ".f32")
GS_MM(GsF16, GsSum, ".add.acc::f32", ".f16x2")
GS_MM(GsF16, GsMin, ".min", ".f16x2")
GS_MM(GsF16, GsMax, ".max", ".f16x2")
GS_MM(GsBF16, GsSum, ".add.acc::f32", ".bf16x2")
GS_MM(GsBF16, GsMin, ".min", ".bf16x2")
GS_MM(GsBF16, GsMax, ".max", ".bf16x2")
#else
// Host emulation (testdata/emu.h): gs_emu_mc_peer maps a multicast address
// to rank r's copy; the fold runs in rank order with the accumulator of T
// and one rounding, which is what .acc::f32 promises (in some order).
template <class T, class Op> struct GsMM {
	typedef typename T::S S;
	union Word {
		gs_u32 w;
		S e[4 / sizeof(S)];
	};
	static gs_u32 ld1(const char *a) {
		const int world = gs_emu_mc_world(a);
		Word out;
		for (unsigned k = 0; k < 4 / sizeof(S); ++k) {
			Word in;
			memcpy(&in, gs_emu_mc_peer(a, 0), 4);
			typename T::A acc = T::load(in.e[k]);
			for (int r = 1; r < world; ++r) {
				memcpy(&in, gs_emu_mc_peer(a, r), 4);
				acc = Op::apply(acc, T::load(in.e[k]));
			}
			out.e[k] = T::store(acc);
		}
		return out.w;
	}
	static gs_v16 ld4(const char *a) {
		gs_v16 v;
		for (int k = 0; k < 4; ++k)
			v.w[k] = ld1(a + 4 * k);
		return v;
	}
	static void st1(char *a, gs_u32 w) {
		for (int r = 0; r < gs_emu_mc_world(a); ++r)
			memcpy(gs_emu_mc_peer(a, r), &w, 4);
	}
	static void st4(char *a, const gs_v16 &v) {
		for (int k = 0; k < 4; ++k)
			st1(a + 4 * k, v.w[k]);
	}
};
#endif

// A 4-byte word seen as elements of T.
template <class T> union GsWord {
	gs_u32 w;
	typename T::S e[4 / sizeof(typename T::S)];
};

// Writes the elements of unit x (a GsWord or GsPack read at multicast
// address u) that lie in [a0, a1) to out, where element i of out belongs to
// address a0 + i * sizeof(S): the whole unit at once where it is inside
// and out is aligned for it, element by element otherwise.
template <class T, class U>
__device__ __forceinline__ void gs_nvls_put(char *out, gs_u64 a0, gs_u64 a1, gs_u64 u, const U &x) {
	typedef typename T::S S;
	if (u >= a0 && u + sizeof(U) <= a1 && ((gs_u64)out + (u - a0)) % sizeof(U) == 0) {
		*(U *)(out + (u - a0)) = x;
		return;
	}
#pragma unroll
	for (unsigned k = 0; k < sizeof(U) / sizeof(S); ++k) {
		const gs_u64 at = u + k * sizeof(S);
		if (at >= a0 && at < a1)
			((S *)out)[(at - a0) / sizeof(S)] = x.e[k];
	}
}

// Words [lo, hi) (4-byte aligned multicast addresses).
template <class T, class Op>
__device__ __forceinline__ void gs_nvls_words(const gs_nvls_params &p, gs_u64 a0, gs_u64 a1, gs_u64 lo,
                                              gs_u64 hi) {
	const gs_u64 g = gs_thread_index(), stride = gs_thread_count();
	for (gs_u64 u = lo + 4 * g; u < hi; u += 4 * stride) {
		GsWord<T> x;
		x.w = GsMM<T, Op>::ld1((const char *)u);
		if (p.mode == GS_NVLS_INPLACE)
			GsMM<T, Op>::st1((char *)u, x.w);
		else
			gs_nvls_put<T>((char *)p.out, a0, a1, u, x);
	}
}

template <class T, class Op> __device__ __forceinline__ void gs_nvls(const gs_nvls_params &p) {
	typedef typename T::S S;
	const gs_u64 es = sizeof(S), a0 = (gs_u64)p.mc, a1 = a0 + p.numel * es;
	const bool inplace = p.mode == GS_NVLS_INPLACE;
	const bool ok = p.world >= 1 && p.world <= GS_MAX_RANKS && p.rank >= 0 && p.rank < p.world &&
	                p.mc && a0 % es == 0 && gridDim.x <= GS_MAX_BLOCKS && gridDim.y == 1 &&
	                gridDim.z == 1 && blockDim.y == 1 && blockDim.z == 1 &&
	                (inplace ? a0 % 4 == 0
	                         : p.mode == GS_NVLS_ONESHOT && p.out && (gs_u64)p.out % es == 0);
	if (!ok) {
		if (blockIdx.x == 0 && threadIdx.x == 0)
			gs_record_error(p.pad, GS_ERR_CONFIG, (gs_u32)p.mode, 0);
		return;
	}
	if (p.numel == 0)
		return;
	// Words [w0, v0), vectors [v0, v1), words [v1, w1); no room for a
	// vector means words only.
	const gs_u64 w0 = a0 & ~3ull, w1 = (a1 + 3) & ~3ull;
	gs_u64 v0 = (w0 + 15) & ~15ull, v1 = w1 & ~15ull;
	if (v0 >= v1)
		v0 = v1 = w1;
	gs_u64 vlo = v0, vhi = v1;
	bool head = true, tail = true;
	if (inplace) { // whole vectors per rank; rank 0 takes the head, the last rank the tail
		const gs_u64 nv = (v1 - v0) / 16, W = p.world, r = p.rank, per = (nv + W - 1) / W;
		vlo = v0 + (r * per < nv ? r * per : nv) * 16;
		vhi = v0 + ((r + 1) * per < nv ? (r + 1) * per : nv) * 16;
		head = r == 0;
		tail = r + 1 == W;
	}
	if (head)
		gs_nvls_words<T, Op>(p, a0, a1, w0, v0);
	const gs_u64 g = gs_thread_index(), stride = gs_thread_count();
	for (gs_u64 u = vlo + 16 * g; u < vhi; u += 16 * stride) {
		GsPack<T> x;
		x.v = GsMM<T, Op>::ld4((const char *)u);
		if (inplace)
			GsMM<T, Op>::st4((char *)u, x.v);
		else
			gs_nvls_put<T>((char *)p.out, a0, a1, u, x);
	}
	if (tail)
		gs_nvls_words<T, Op>(p, a0, a1, v1, w1);
}

#define GS_NVLS_KERNEL(tname, T, oname, Op)                                                   \
	extern "C" __global__ void __launch_bounds__(GS_BLOCK_THREADS)                         \
	    gs_nvls_##tname##_##oname(gs_nvls_params p) {                                     \
		gs_kernel_begin();                                                             \
		gs_nvls<T, Op>(p);                                                             \
	}

GS_NVLS_KERNEL(f32, GsF32, sum, GsSum)
GS_NVLS_KERNEL(f16, GsF16, sum, GsSum)
GS_NVLS_KERNEL(f16, GsF16, min, GsMin)
GS_NVLS_KERNEL(f16, GsF16, max, GsMax)
GS_NVLS_KERNEL(bf16, GsBF16, sum, GsSum)
GS_NVLS_KERNEL(bf16, GsBF16, min, GsMin)
GS_NVLS_KERNEL(bf16, GsBF16, max, GsMax)
