// The LL (low-latency) protocol shared by gs_ll (allreduce.cu) and gs_llmove
// (copy.cu): data travels as lines that carry their own flag, so a receiver
// needs no barrier and no fence.
//
// A line is 16 bytes: 8 bytes of data, each 4-byte half followed by the
// launch's flag, stored as one 16-byte access and read back until both
// flags match. The access is a vector of two 64-bit elements, each a data
// half with its flag (v2.u64): the PTX memory model makes each element
// single-copy atomic, which is all the reader needs (docs/ARCHITECTURE.md).
// NCCL's LL stores four 32-bit elements and relies on the hardware
// observing them whole.
//
// Rank r's LL area holds, for block b, parity 0 and 1, and source rank q,
// GS_LL_LINES lines. Block b's launch number seq (word GS_PAD_LL_SEQ + b of
// the rank's own pad) names its flag, seq + 1, and its parity, seq & 1.
// Block b of every rank runs the same LL launches (of either kernel) in the
// same order (every rank runs the same collectives with the same grids), so
// their seq agree. A line is never read as the wrong launch's: it holds
// zero or the flag of an earlier launch of its block, seq - 1 or older
// where a smaller launch left it untouched, and seq + 1 equals neither
// unless the line sat unused for 2^32 launches of its block (not guarded:
// at 3 µs a launch, 3.6 hours of nothing but smaller launches of that
// block, and then a larger one landing on the exact count). The grid must
// be LLGrid's for the size, with at least one line per block, for the next
// rule to hold (gs_ll_shape_ok refuses any other grid). A region is never overwritten while its reader needs it: in
// every launch, block b of every rank sends at least one line to every peer and
// waits for at least one from every peer (a rank with no data for a peer
// sends the handshake line 0 alone). So rank r writes parity p for seq + 2
// after its launch seq + 1 received a line from every peer's block b, which
// each peer sent from a later launch than the one in which it read parity p
// for seq.
#ifndef GOSYM_LL_CUH
#define GOSYM_LL_CUH

#include "common.cuh"

#ifndef GS_EMULATION
// One 16-byte access of two 64-bit elements, each a data half with the flag
// above it: the PTX memory model makes each element single-copy atomic, so
// a reader that sees an element's flag sees that element's data half.
__device__ __forceinline__ void gs_ll_store(char *line, gs_u64 data, gs_u32 flag) {
	const gs_u64 f = (gs_u64)flag << 32;
	asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(line),
	             "l"((data & 0xffffffffu) | f), "l"((data >> 32) | f)
	             : "memory");
}

// Whether line holds flag (both halves); its data if so.
__device__ __forceinline__ bool gs_ll_load(const char *line, gs_u32 flag, gs_u64 &data) {
	gs_u64 a, b;
	asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];"
	             : "=l"(a), "=l"(b)
	             : "l"(line)
	             : "memory");
	data = (a & 0xffffffffu) | (b << 32);
	return (gs_u32)(a >> 32) == flag && (gs_u32)(b >> 32) == flag;
}
#else // two 8-byte atomics: exactly the guarantee the GPU code relies on
__device__ __forceinline__ void gs_ll_store(char *line, gs_u64 data, gs_u32 flag) {
	__atomic_store_n((gs_u64 *)line, (data & 0xffffffffu) | ((gs_u64)flag << 32), __ATOMIC_RELAXED);
	__atomic_store_n((gs_u64 *)line + 1, (data >> 32) | ((gs_u64)flag << 32), __ATOMIC_RELAXED);
}
__device__ __forceinline__ bool gs_ll_load(const char *line, gs_u32 flag, gs_u64 &data) {
	gs_emu_spin();
	const gs_u64 a = __atomic_load_n((const gs_u64 *)line, __ATOMIC_RELAXED);
	const gs_u64 b = __atomic_load_n((const gs_u64 *)line + 1, __ATOMIC_RELAXED);
	data = (a & 0xffffffffu) | (b << 32);
	return (gs_u32)(a >> 32) == flag && (gs_u32)(b >> 32) == flag;
}
#endif

// The 8 bytes of line l (elements l*E .. l*E+E-1, zero past numel).
template <class S>
__device__ __forceinline__ gs_u64 gs_ll_gather(const S *in, gs_u64 numel, gs_u64 l) {
	const gs_u64 E = 8 / sizeof(S), e0 = l * E;
	union {
		gs_u64 u;
		S e[8 / sizeof(S)];
	} w;
	if (e0 + E <= numel && ((gs_u64)(in + e0) & 7u) == 0)
		return *(const gs_u64 *)(in + e0);
	w.u = 0;
	for (gs_u64 k = 0; k < E; ++k)
		if (e0 + k < numel)
			w.e[k] = in[e0 + k];
	return w.u;
}

// Writes the bytes of line l that lie within bytes (gs_ll_gather's inverse
// for bytes, little-endian).
__device__ __forceinline__ void gs_ll_put(char *out, gs_u64 bytes, gs_u64 l, gs_u64 data) {
	const gs_u64 b0 = l * 8u;
	if (b0 + 8u <= bytes && ((gs_u64)(out + b0) & 7u) == 0) {
		*(gs_u64 *)(out + b0) = data;
		return;
	}
	for (gs_u64 k = 0; k < 8u && b0 + k < bytes; ++k)
		out[b0 + k] = (char)(data >> (8u * k));
}

// What a block of an LL launch needs: its flag and its regions.
struct GsLL {
	gs_u32 *seqw;      // the block's launch counter in this rank's pad
	gs_u32 seq, flag;  // this launch's number and flag (seq + 1)
	gs_u64 region;     // the block's regions of this parity, in regions
	int world;

	// Byte offset, in an LL area, of line j of source rank q's region.
	__device__ __forceinline__ gs_u64 at(int q, gs_u64 j) const {
		return ((region + (gs_u64)q) * GS_LL_LINES + j) * 16u;
	}
};

// Whether this launch has the LL shape for `lines` lines per segment: the
// grid must be exactly one block per GS_LL_LINES lines (cuda.LLGrid) and fit
// the LL area: a block with no line would exchange nothing with its peers,
// which the region-reuse rule above forbids, and lines past the grid would
// be dropped. Anything else, including an empty launch, is recorded as a
// config error. Reads no memory, so a kernel may check the shape, start
// loading its input, and only then read its launch number (gs_ll_begin).
__device__ __forceinline__ bool gs_ll_shape_ok(gs_u32 *const *pads, int world, int rank, gs_u64 lines) {
	if (!gs_config_ok(pads, world, rank, GS_LL_BLOCKS))
		return false;
	const gs_u64 blocks = (lines + GS_LL_LINES - 1) / GS_LL_LINES;
	if (gridDim.x != blocks || blocks > GS_LL_BLOCKS || blockDim.x != GS_LL_THREADS) {
		if (threadIdx.x == 0)
			gs_record_error(pads[rank], GS_ERR_CONFIG, (gridDim.x << 16) | blockDim.x, 2);
		return false;
	}
	return true;
}

// Starts an LL launch whose shape gs_ll_shape_ok accepted: reads the
// block's launch number. Every thread reads it itself, with no barrier of
// the block between the kernel's start and its first store to a peer (the
// word is only written by gs_ll_end, after a barrier that follows every
// thread's read).
__device__ __forceinline__ void gs_ll_begin(gs_u32 *const *pads, int world, int rank, GsLL &ll) {
	ll.seqw = pads[rank] + GS_PAD_LL_SEQ + blockIdx.x;
	ll.seq = *(volatile gs_u32 *)ll.seqw;
	ll.flag = ll.seq + 1u;
	ll.region = ((gs_u64)blockIdx.x * 2u + (ll.seq & 1u)) * (gs_u64)world;
	ll.world = world;
}

// Waits for line (from rank q) to carry ll's flag and returns its data;
// false, with the wait named in the pad's error words, after timeout_ns.
__device__ __forceinline__ bool gs_ll_wait(const GsLL &ll, const char *line, gs_u64 &data,
                                           gs_u64 timeout_ns, gs_u32 *pad, int q) {
	if (gs_wait([&] { return gs_ll_load(line, ll.flag, data); }, timeout_ns, pad))
		return true;
	gs_record_error(pad, GS_ERR_TIMEOUT, GS_LL_WAIT | (blockIdx.x << 8) | (gs_u32)q, 1u << q);
	return false;
}

// Ends the launch for this block once every thread is done: only then may
// its next launch reuse the other parity's regions. Every thread calls it.
// The block's last thread writes the count: the host emulation runs a
// block's threads one after another, and the others must all have read it.
__device__ __forceinline__ void gs_ll_end(const GsLL &ll) {
	__syncthreads();
	if (threadIdx.x == blockDim.x - 1)
		*(volatile gs_u32 *)ll.seqw = ll.seq + 1u;
}

#endif // GOSYM_LL_CUH
