// All-reduce kernels over buffers that every rank can address directly
// (CUDA IPC or VMM mappings of the peers' memory), in the manner of vLLM's
// custom all-reduce and PyTorch's symmetric-memory one-/two-shot kernels.
//
//   gs_oneshot_<type>_<op>  every rank reads all peers and writes its own
//                           (with in set, it first stages in itself)
//                           out (pull); with src_offset = rank * numel it is
//                           the reduce-scatter half of a two-shot.
//   gs_twoshot_<type>_<op>  in place: rank r reduces slice r from all peers
//                           and writes it into every peer's buffer (push).
//   gs_pull_<type>_<op>     one-shot without its barriers: the caller orders
//                           the launch after every peer's input is ready and
//                           before anyone reuses it (the semaphore protocol).
//   gs_arpush_<type>_<op>   two-shot whose reduce-scatter half pushes into the
//                           peers' stagings (in rounds) and folds locally.
//   gs_ll_<type>_<op>       low latency, for small inputs: every rank stores
//                           its input into every peer's LL area as lines
//                           that carry their own flag, and reduces the lines
//                           that arrive in its own: no barrier at all (with
//                           in_stride: reduce_scatter, piece q to rank q).
//
// types: f32, f64, f16, bf16, f8e4m3, f8e5m2 (the last four with fp32
// accumulation), i32, i64, i8, u8 (bool too, as torch hands it to NCCL);
// ops: sum, prod, min, max (the types of kernelspec.go's reduceTypes).
// AVG and PREMUL_SUM are sum with post = GS_POST_DIV / GS_POST_MUL.
// Partial sums are folded in rank order 0..world-1 on every rank, so all
// ranks get identical bits. Elements move as 16-byte vectors where every
// pointer shares the same alignment, with scalar heads and tails for the rest
// (any numel, any element-aligned start).
//
// Launch: block = GS_BLOCK_THREADS threads, grid <= GS_MAX_BLOCKS, the same
// grid on every rank for the same call (barrier slots are per block). out
// must not alias any peer's buffer in one-shot: peers are still reading it.
#include "copy.cuh"
#include "ll.cuh"

// Folds element i of every peer.
template <class T, class Op>
__device__ __forceinline__ typename T::A gs_fold1(const char *const *src, int world, gs_u64 i) {
	typedef typename T::S S;
	typename T::A acc = T::load(((const S *)src[0])[i]);
#pragma unroll
	for (int r = 1; r < GS_MAX_RANKS; ++r)
		if (r < world)
			acc = Op::apply(acc, T::load(((const S *)src[r])[i]));
	return acc;
}

template <class T, class Op>
__device__ __forceinline__ typename T::S gs_finish(typename T::A a, double scale, int post) {
	if (Op::kScales && T::kFloat)
		a = gs_post(a, scale, post);
	return T::store(a);
}

// Reduces elements [lo, hi) and writes each result to dst[0..ndst). Vectors
// start at element head (where all pointers are 16-byte aligned) and recur
// every kN elements; head == count means no vectors at all.
template <class T, class Op>
__device__ __forceinline__ void gs_reduce_range(const char *const *src, int world,
                                                char *const *dst, int ndst, gs_u64 lo,
                                                gs_u64 hi, gs_u64 head, double scale,
                                                int post, gs_u64 g, gs_u64 stride) {
	typedef typename T::S S;
	typedef typename T::A A;
	const int N = GsPack<T>::kN;
	gs_u64 vlo = hi, vhi = hi;
	if (hi > head) {
		const gs_u64 a = lo > head ? lo : head;
		vlo = head + (a - head + N - 1) / N * N;
		vhi = head + (hi - head) / N * N;
		if (vlo >= vhi)
			vlo = vhi = hi;
	}

	for (gs_u64 i = lo + g; i < vlo; i += stride) {
		const S r = gs_finish<T, Op>(gs_fold1<T, Op>(src, world, i), scale, post);
#pragma unroll
		for (int d = 0; d < GS_MAX_RANKS; ++d)
			if (d < ndst)
				((S *)dst[d])[i] = r;
	}

	const gs_u64 nvec = (vhi - vlo) / N;
	for (gs_u64 v = g; v < nvec; v += stride) {
		const gs_u64 byte = (vlo + v * N) * sizeof(S);
		GsPack<T> in[GS_MAX_RANKS];
#pragma unroll
		for (int r = 0; r < GS_MAX_RANKS; ++r)
			if (r < world)
				in[r].v = *(const gs_v16 *)(src[r] + byte);
		A acc[N];
#pragma unroll
		for (int k = 0; k < N; ++k)
			acc[k] = T::load(in[0].e[k]);
#pragma unroll
		for (int r = 1; r < GS_MAX_RANKS; ++r)
			if (r < world) {
#pragma unroll
				for (int k = 0; k < N; ++k)
					acc[k] = Op::apply(acc[k], T::load(in[r].e[k]));
			}
		GsPack<T> out;
#pragma unroll
		for (int k = 0; k < N; ++k)
			out.e[k] = gs_finish<T, Op>(acc[k], scale, post);
#pragma unroll
		for (int d = 0; d < GS_MAX_RANKS; ++d)
			if (d < ndst)
				*(gs_v16 *)(dst[d] + byte) = out.v;
	}

	for (gs_u64 i = vhi + g; i < hi; i += stride) {
		const S r = gs_finish<T, Op>(gs_fold1<T, Op>(src, world, i), scale, post);
#pragma unroll
		for (int d = 0; d < GS_MAX_RANKS; ++d)
			if (d < ndst)
				((S *)dst[d])[i] = r;
	}
}

// The peers' element pointers, shifted by src_offset; slots past world are
// copies of slot 0 so that alignment checks can look at all of them.
template <class T>
__device__ __forceinline__ void gs_sources(const gs_ar_params &p, const char **src) {
#pragma unroll
	for (int r = 0; r < GS_MAX_RANKS; ++r) {
		const int q = r < p.world ? r : 0;
		src[r] = (const char *)p.peers[q] + p.src_offset * sizeof(typename T::S);
	}
}

template <class T>
__device__ __forceinline__ gs_u64 gs_head_of(const char *const *ptrs, gs_u64 count) {
	typedef typename T::S S;
	const gs_u64 mis = (gs_u64)ptrs[0] & 15u;
	bool same = true;
#pragma unroll
	for (int r = 1; r < GS_MAX_RANKS + 1; ++r)
		same = same && (((gs_u64)ptrs[r] & 15u) == mis);
	if (!same || mis % sizeof(S) != 0)
		return count;
	const gs_u64 head = ((16u - mis) & 15u) / sizeof(S);
	return head < count ? head : count;
}

// Every element of every peer into this rank's out.
template <class T, class Op> __device__ __forceinline__ void gs_pull_all(const gs_ar_params &p) {
	const char *ptrs[GS_MAX_RANKS + 1];
	gs_sources<T>(p, ptrs);
	ptrs[GS_MAX_RANKS] = (const char *)p.out;
	char *const dst[1] = {(char *)p.out};
	const gs_u64 head = gs_head_of<T>(ptrs, p.numel);
	gs_reduce_range<T, Op>(ptrs, p.world, dst, 1, 0, p.numel, head, p.scale, p.post,
	                       gs_thread_index(), gs_thread_count());
}

// Copies elements [lo, hi) of src to dst with this block's threads: 16-byte
// vectors where the two are co-aligned, elements elsewhere.
template <class S>
__device__ __forceinline__ void gs_block_copy(S *dst, const S *src, gs_u64 lo, gs_u64 hi) {
	const gs_u64 t = threadIdx.x, n = blockDim.x;
	const gs_u64 V = 16 / sizeof(S);
	gs_u64 a = hi, b = hi; // the vector part [a, b)
	if ((((gs_u64)(dst + lo) ^ (gs_u64)(src + lo)) & 15u) == 0) {
		const gs_u64 mis = (gs_u64)(dst + lo) & 15u;
		a = lo + ((16u - mis) & 15u) / sizeof(S);
		a = a < hi ? a : hi;
		b = a + (hi - a) / V * V;
	}
	for (gs_u64 i = lo + t; i < a; i += n)
		dst[i] = src[i];
	for (gs_u64 v = t; v < (b - a) / V; v += n)
		((gs_v16 *)(dst + a))[v] = ((const gs_v16 *)(src + a))[v];
	for (gs_u64 i = b + t; i < hi; i += n)
		dst[i] = src[i];
}

// One-shot with the staging copy fused in (p.in set): block b copies its
// range of this rank's input (for reduce_scatter, of each of its world
// pieces) into this rank's staging, the block barrier
// then tells peer block b that exactly that range is there, and block b
// reduces the same range from every peer. One launch per chunk instead of a
// copy and a launch. A rank with no output (reduce, p.out == 0) only stages.
// The closing barrier keeps a rank from restaging while peers still read it.
template <class T, class Op> __device__ __forceinline__ void gs_oneshot_fused(const gs_ar_params &p) {
	typedef typename T::S S;
	const gs_u64 N = GsPack<T>::kN;
	const gs_u64 per = ((p.numel + gridDim.x - 1) / gridDim.x + N - 1) / N * N;
	gs_u64 lo = (gs_u64)blockIdx.x * per, hi = lo + per;
	lo = lo < p.numel ? lo : p.numel;
	hi = hi < p.numel ? hi : p.numel;
	if (p.in_stride) { // reduce_scatter: every rank's piece, each into its region
		for (int r = 0; r < p.world; ++r)
			gs_block_copy<S>((S *)p.peers[p.rank] + (gs_u64)r * p.stage_stride,
			                 (const S *)p.in + (gs_u64)r * p.in_stride, lo, hi);
	} else {
		gs_block_copy<S>((S *)p.peers[p.rank] + p.src_offset, (const S *)p.in, lo, hi);
	}
	__threadfence_system();
	if (!gs_block_barrier(p.pads, p.world, p.rank, p.timeout_ns))
		return;
	if (p.out) {
		const char *ptrs[GS_MAX_RANKS + 1];
		gs_sources<T>(p, ptrs);
		ptrs[GS_MAX_RANKS] = (const char *)p.out;
		char *const dst[1] = {(char *)p.out};
		const gs_u64 head = gs_head_of<T>(ptrs, p.numel);
		gs_reduce_range<T, Op>(ptrs, p.world, dst, 1, lo, hi, head, p.scale, p.post,
		                       threadIdx.x, blockDim.x);
	}
	gs_block_barrier(p.pads, p.world, p.rank, p.timeout_ns);
}

template <class T, class Op>
__device__ __forceinline__ void gs_oneshot(const gs_ar_params &p) {
	if (!gs_config_ok(p.pads, p.world, p.rank))
		return;
	if (p.in) {
		gs_oneshot_fused<T, Op>(p);
		return;
	}
	if (!gs_block_barrier(p.pads, p.world, p.rank, p.timeout_ns))
		return;
	gs_pull_all<T, Op>(p);
	// Peers may overwrite their inputs once everyone has read them.
	gs_block_barrier(p.pads, p.world, p.rank, p.timeout_ns);
}

template <class T, class Op> __device__ __forceinline__ void gs_pull(const gs_ar_params &p) {
	if (gs_config_ok(p.pads, p.world, p.rank))
		gs_pull_all<T, Op>(p);
}

template <class T, class Op>
__device__ __forceinline__ void gs_twoshot(const gs_ar_params &p) {
	if (!gs_config_ok(p.pads, p.world, p.rank))
		return;
	if (!gs_block_barrier(p.pads, p.world, p.rank, p.timeout_ns))
		return;
	const char *ptrs[GS_MAX_RANKS + 1];
	gs_sources<T>(p, ptrs);
	ptrs[GS_MAX_RANKS] = ptrs[0];
	char *dst[GS_MAX_RANKS];
#pragma unroll
	for (int r = 0; r < GS_MAX_RANKS; ++r)
		dst[r] = (char *)ptrs[r];
	const gs_u64 n = p.numel, head = gs_head_of<T>(ptrs, n);
	const gs_u64 W = (gs_u64)p.world, r = (gs_u64)p.rank;
	gs_u64 lo, hi;
	if (head >= n) { // no vectors: split the elements evenly
		const gs_u64 per = (n + W - 1) / W;
		lo = r * per < n ? r * per : n;
		hi = lo + per < n ? lo + per : n;
	} else { // split whole vectors; rank 0 takes the head, the last rank the tail
		const int N = GsPack<T>::kN;
		const gs_u64 vend = head + (n - head) / N * N;
		const gs_u64 per = ((n - head) / N + W - 1) / W * N;
		lo = r == 0 ? 0 : (head + r * per < vend ? head + r * per : vend);
		hi = r + 1 == W ? n : (head + (r + 1) * per < vend ? head + (r + 1) * per : vend);
	}
	gs_reduce_range<T, Op>(ptrs, p.world, dst, p.world, lo, hi, head, p.scale, p.post,
	                       gs_thread_index(), gs_thread_count());
	// Every slice has landed everywhere once all ranks pass this.
	gs_block_barrier(p.pads, p.world, p.rank, p.timeout_ns);
}

// ---- two-shot with a push reduce-scatter -------------------------------------------
//
// gs_arpush: two-shot's op (in place on the peers' buffers p.peers), but the
// reduce-scatter half pushes: in rounds, each rank stores slice q of its
// buffer into rank q's staging (p.stages[q], slot rank), and rank q folds
// slice q from its own buffer and its own staging (local loads only), in
// rank order, and stores the result into every rank's buffer. Stores cross
// the switch without waiting for a reply, where two-shot's loads from the
// peers wait a round trip each. A round's slices are an equal share of
// what is left, a multiple of 16 bytes, at most p.slot elements (the
// staging holds world slots of p.slot elements and 16 bytes; block b keeps
// to its own part of every slot, whatever the round). Block b of
// every rank handles sub-range b of every slice, so the block barriers are
// the only synchronisation: one at the start (every rank's buffer and
// staging are free), one after the pushes (the pieces are there), one
// after the results (the staging may take the next round, the buffers are
// final). A piece lands in a slot at its destination buffer's 16-byte
// phase, so that the fold meets its sources and its own buffer in step.
// Elements of a slice of s elements from base, within numel.
__device__ __forceinline__ gs_u64 gs_slice_len(gs_u64 base, gs_u64 s, gs_u64 numel) {
	return base < numel ? (numel - base < s ? numel - base : s) : 0;
}

template <class T, class Op> __device__ __forceinline__ void gs_arpush(const gs_ar_params &p) {
	typedef typename T::S S;
	if (!gs_config_ok(p.pads, p.world, p.rank))
		return;
	const gs_u64 N = GsPack<T>::kN, W = (gs_u64)p.world, es = sizeof(S), me = (gs_u64)p.rank;
	// Block b owns [b * most, (b + 1) * most) of every slot in every round: blocks run apart
	// (a barrier joins block b of every rank, not the blocks of one rank), so a part that
	// moved with the round's slice length could land where a peer's other block still folds.
	const gs_u64 most = p.slot / gridDim.x / N * N;
	if (most == 0 || p.slot % N != 0) {
		if (threadIdx.x == 0)
			gs_record_error(p.pads[p.rank], GS_ERR_CONFIG, (gs_u32)p.slot, 3);
		return;
	}
	if (!gs_block_barrier(p.pads, p.world, p.rank, p.timeout_ns))
		return;
	const gs_u64 slot_bytes = p.slot * es + 16u;
	const gs_u64 phase = (gs_u64)p.peers[me] & 15u;
	bool same = phase % es == 0; // every buffer in the same phase: the fold can use vectors
	for (int q = 0; q < p.world && q < GS_MAX_RANKS; ++q)
		same = same && (((gs_u64)p.peers[q] & 15u) == phase);
	const gs_u64 head = ((16u - phase) & 15u) / es; // the first element on a 16-byte boundary
	for (gs_u64 start = 0; start < p.numel;) {
		gs_u64 s = (p.numel - start + W - 1) / W;
		s = (s + N - 1) / N * N;
		s = s < most * gridDim.x ? s : most * gridDim.x;
		const gs_u64 per = ((s + gridDim.x - 1) / gridDim.x + N - 1) / N * N; // at most `most`
		const gs_u64 lo = (gs_u64)blockIdx.x * per, at = (gs_u64)blockIdx.x * most; // in the slice, the slot
		// this block's sub-range of slice q: [base + lo, base + hi)
		for (gs_u64 k = 1; k < W; ++k) {
			const gs_u64 q = (me + k) % W; // in turn: each rank's stores go to one peer at a time
			const gs_u64 base = start + q * s;
			const gs_u64 len = gs_slice_len(base, s, p.numel);
			const gs_u64 hi = lo + per < len ? lo + per : len;
			if (lo < hi)
				gs_copy_seg((char *)p.stages[q] + me * slot_bytes + ((gs_u64)p.peers[q] & 15u) + at * es,
				            (const char *)p.peers[me] + (base + lo) * es, (hi - lo) * es, threadIdx.x,
				            blockDim.x);
		}
		__threadfence_system();
		if (!gs_block_barrier(p.pads, p.world, p.rank, p.timeout_ns))
			return;
		const gs_u64 base = start + me * s;
		const gs_u64 len = gs_slice_len(base, s, p.numel);
		const gs_u64 hi = lo + per < len ? lo + per : len;
		if (lo < hi) {
			// element i of the slice: src[r] + i * es as rank r sent it, dst[q] + i * es on rank q
			// (base is a multiple of 16 bytes: the slice starts in every buffer's phase)
			const char *src[GS_MAX_RANKS];
			char *dst[GS_MAX_RANKS];
#pragma unroll
			for (int r = 0; r < GS_MAX_RANKS; ++r) {
				src[r] = (gs_u64)r == me || r >= p.world
				             ? (const char *)p.peers[me] + base * es
				             : (const char *)p.stages[me] + r * slot_bytes + phase + (at - lo) * es;
				dst[r] = (char *)p.peers[r < p.world ? r : 0] + base * es;
			}
			gs_reduce_range<T, Op>(src, p.world, dst, p.world, lo, hi, same ? head : len, p.scale, p.post,
			                       threadIdx.x, blockDim.x);
		}
		__threadfence_system();
		if (!gs_block_barrier(p.pads, p.world, p.rank, p.timeout_ns))
			return;
		start += W * s;
	}
}

// ---- low latency (LL) -----------------------------------------------------------
//
// Every rank stores its input into every peer's LL area as lines (ll.cuh
// has the protocol and why it needs no barrier), then waits for each peer's
// lines in its own area and folds them in rank order. With in_stride set
// (reduce_scatter) the input is world pieces in_stride elements apart, and
// piece q goes to rank q: each rank folds its own piece of every rank.

template <class T, class Op> __device__ __forceinline__ void gs_ll(const gs_ar_params &p) {
	typedef typename T::S S;
	const gs_u64 E = 8 / sizeof(S);
	const int K = GS_LL_LINES / GS_LL_THREADS; // lines per thread
	const gs_u64 lines = (p.numel + E - 1) / E;
	if (!gs_ll_shape_ok(p.pads, p.world, p.rank, lines))
		return;
	const S *in = (const S *)p.in;

	// the own lines' loads go out before the launch number's: neither waits for the other
	gs_u64 mine[K];
#pragma unroll
	for (int k = 0; k < K; ++k) {
		const gs_u64 l = (gs_u64)blockIdx.x * GS_LL_LINES + threadIdx.x + (gs_u64)k * GS_LL_THREADS;
		if (l < lines)
			mine[k] = gs_ll_gather<S>(in + (gs_u64)p.rank * p.in_stride, p.numel, l);
	}
	GsLL ll;
	gs_ll_begin(p.pads, p.world, p.rank, ll);
#pragma unroll
	for (int k = 0; k < K; ++k) {
		const gs_u64 j = threadIdx.x + (gs_u64)k * GS_LL_THREADS;
		const gs_u64 l = (gs_u64)blockIdx.x * GS_LL_LINES + j;
		if (l >= lines)
			break;
		for (int q = 0; q < p.world; ++q)
			if (q != p.rank)
				gs_ll_store((char *)p.peers[q] + ll.at(p.rank, j),
				            p.in_stride ? gs_ll_gather<S>(in + (gs_u64)q * p.in_stride, p.numel, l) : mine[k],
				            ll.flag);
	}

	bool failed = false;
#pragma unroll
	for (int k = 0; k < K; ++k) {
		const gs_u64 j = threadIdx.x + (gs_u64)k * GS_LL_THREADS;
		const gs_u64 l = (gs_u64)blockIdx.x * GS_LL_LINES + j;
		if (l >= lines || failed)
			break;
		union {
			gs_u64 u;
			S e[8 / sizeof(S)];
		} d[GS_MAX_RANKS];
		for (int q = 0; q < p.world && !failed; ++q) {
			if (q == p.rank)
				d[q].u = mine[k];
			else
				failed = !gs_ll_wait(ll, (const char *)p.peers[p.rank] + ll.at(q, j), d[q].u,
				                     p.timeout_ns, p.pads[p.rank], q);
		}
		if (failed)
			break;
		S *out = (S *)p.out;
		for (gs_u64 k2 = 0; k2 < E; ++k2) {
			const gs_u64 e = l * E + k2;
			if (e >= p.numel)
				break;
			typename T::A acc = T::load(d[0].e[k2]);
			for (int q = 1; q < p.world; ++q)
				acc = Op::apply(acc, T::load(d[q].e[k2]));
			out[e] = gs_finish<T, Op>(acc, p.scale, p.post);
		}
	}
	gs_ll_end(ll);
}

#define GS_AR_KERNEL(algo, tname, T, oname, Op)                                               \
	extern "C" __global__ void __launch_bounds__(GS_BLOCK_THREADS)                         \
	    gs_##algo##_##tname##_##oname(gs_ar_params p) {                                   \
		gs_kernel_begin();                                                             \
		gs_##algo<T, Op>(p);                                                           \
	}

#define GS_AR_OPS(algo, tname, T)                                                             \
	GS_AR_KERNEL(algo, tname, T, sum, GsSum)                                               \
	GS_AR_KERNEL(algo, tname, T, prod, GsProd)                                             \
	GS_AR_KERNEL(algo, tname, T, min, GsMin)                                               \
	GS_AR_KERNEL(algo, tname, T, max, GsMax)

#define GS_AR_KERNELS(tname, T)                                                               \
	GS_AR_OPS(oneshot, tname, T)                                                           \
	GS_AR_OPS(twoshot, tname, T) GS_AR_OPS(pull, tname, T) GS_AR_OPS(ll, tname, T)           \
	    GS_AR_OPS(arpush, tname, T)

// Every element type, as X(kernel name part, element type), in the order of
// kernelspec.go's reduceTypes; the host emulation and the fake driver list
// the kernels through it too.
#define GS_AR_TYPES(X)                                                                            \
	X(f32, GsF32) X(f16, GsF16) X(bf16, GsBF16) X(i32, GsI32) X(i64, GsI64) X(f64, GsF64)    \
	    X(i8, GsI8) X(u8, GsU8) X(f8e4m3, GsF8E4M3) X(f8e5m2, GsF8E5M2)

GS_AR_TYPES(GS_AR_KERNELS)
