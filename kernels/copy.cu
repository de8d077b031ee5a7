// Data movement and synchronisation kernels.
//
//   gs_copy     up to GS_MAX_SEGS (dst, src, bytes) copies in one launch, for
//               all-gather and all-to-all over peer mappings; sync adds a
//               barrier before (peers' data ready) and/or after (peers may
//               reuse their buffers). Uses the widest access (16/8/4/2/1
//               bytes) that dst and src are co-aligned for.
//   gs_barrier  a stream-ordered barrier of all ranks: launch 1 block of 32.
//   gs_sema_wait  the waiting half of the semaphore protocol (sema.go):
//               launch 1 block of 32.
#include "common.cuh"

template <class W>
__device__ __forceinline__ void gs_copy_units(char *dst, const char *src, gs_u64 units) {
	const gs_u64 g = gs_thread_index(), stride = gs_thread_count();
	for (gs_u64 i = g; i < units; i += stride)
		((W *)dst)[i] = ((const W *)src)[i];
}

__device__ __forceinline__ void gs_copy_bytes(char *dst, const char *src, gs_u64 lo, gs_u64 hi) {
	const gs_u64 g = gs_thread_index(), stride = gs_thread_count();
	for (gs_u64 i = lo + g; i < hi; i += stride)
		dst[i] = src[i];
}

__device__ __forceinline__ void gs_copy_seg(char *dst, const char *src, gs_u64 bytes) {
	const gs_u64 x = ((gs_u64)dst ^ (gs_u64)src) & 15u;
	const gs_u64 w = x == 0 ? 16u : (x & (~x + 1u)); // lowest set bit
	gs_u64 head = (w - ((gs_u64)dst & (w - 1u))) & (w - 1u);
	head = head < bytes ? head : bytes;
	const gs_u64 units = (bytes - head) / w, tail = head + units * w;
	gs_copy_bytes(dst, src, 0, head);
	switch (w) {
	case 16:
		gs_copy_units<gs_v16>(dst + head, src + head, units);
		break;
	case 8:
		gs_copy_units<gs_u64>(dst + head, src + head, units);
		break;
	case 4:
		gs_copy_units<gs_u32>(dst + head, src + head, units);
		break;
	case 2:
		gs_copy_units<unsigned short>(dst + head, src + head, units);
		break;
	default:
		gs_copy_bytes(dst + head, src + head, 0, units);
	}
	gs_copy_bytes(dst, src, tail, bytes);
}

extern "C" __global__ void __launch_bounds__(GS_BLOCK_THREADS) gs_copy(gs_copy_params p) {
	if (!gs_config_ok(p.pads, p.world, p.rank))
		return;
	if (p.nseg < 0 || p.nseg > GS_MAX_SEGS) {
		if (threadIdx.x == 0)
			gs_record_error(p.pads[p.rank], GS_ERR_CONFIG, (gs_u32)p.nseg, 0);
		return;
	}
	if ((p.sync & GS_SYNC_START) && !gs_block_barrier(p.pads, p.world, p.rank, p.timeout_ns))
		return;
#pragma unroll
	for (int s = 0; s < GS_MAX_SEGS; ++s)
		if (s < p.nseg)
			gs_copy_seg((char *)p.dst[s], (const char *)p.src[s], p.bytes[s]);
	if (p.sync & GS_SYNC_END)
		gs_block_barrier(p.pads, p.world, p.rank, p.timeout_ns);
}

extern "C" __global__ void __launch_bounds__(32) gs_barrier(gs_barrier_params p) {
	if (!gs_config_ok(p.pads, p.world, p.rank))
		return;
	gs_block_barrier(p.pads, p.world, p.rank, p.timeout_ns);
}

// A semaphore is set.
struct GsIsSet {
	__device__ __forceinline__ bool operator()(gs_u32 v) const { return v == GS_SEMA_SET; }
};

// Waits until every rank r in mask has set semaphore word + r of this rank's
// pad, then consumes it (back to 0), so that every protocol round leaves
// the semaphores as it found them: what makes back-to-back rounds and
// replays of a captured graph safe with constant-valued stream writes. A
// rank that does not arrive within timeout_ns (0: wait forever) is named in
// the pad's error words (detail: word << 8 | rank) and its semaphore is left
// alone. Thread r handles rank r.
extern "C" __global__ void __launch_bounds__(32) gs_sema_wait(gs_sema_params p) {
	const int t = threadIdx.x;
	if (!p.pad || (p.word != GS_PAD_SEMA_READY && p.word != GS_PAD_SEMA_DONE) || gridDim.x != 1 ||
	    blockDim.x < GS_MAX_RANKS || (p.mask >> GS_MAX_RANKS) != 0) {
		if (t == 0 && blockIdx.x == 0)
			gs_record_error(p.pad, GS_ERR_CONFIG, (gs_u32)p.word, 0);
		return;
	}
	if (t >= GS_MAX_RANKS || ((p.mask >> t) & 1u) == 0)
		return;
	gs_u32 *sem = p.pad + p.word + t;
	if (!gs_poll(sem, GsIsSet{}, p.timeout_ns)) {
		gs_record_error(p.pad, GS_ERR_TIMEOUT, ((gs_u32)p.word << 8) | (gs_u32)t, 1u << t);
		return;
	}
	gs_st_release(sem, 0u);
}
