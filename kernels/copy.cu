// Data movement and synchronisation kernels.
//
//   gs_copy     up to GS_MAX_SEGS (dst, src, bytes) copies in one launch, for
//               all-gather and all-to-all over peer mappings; sync adds a
//               barrier before (peers' data ready) and/or after (peers may
//               reuse their buffers); the first npre segments stage this
//               rank's data before the first barrier. Uses the widest access
//               (16/8/4/2/1 bytes) that dst and src are co-aligned for.
//   gs_llmove   moves up to GS_LL_BLOCKS * GS_LL_LINES * 8 bytes between
//               every pair of ranks as LL lines (ll.cuh): broadcast,
//               all-gather, all-to-all, gather and scatter of small inputs in
//               one launch with no barrier.
//   gs_bcast_relay  a broadcast by scatter and relay: each byte leaves the
//               root once (large broadcasts at three ranks or more).
//   gs_copy_steps  gs_copy launched before its parameters exist: waits for a
//               word (host memory, written with no driver call), then runs
//               the steps it names (the deferred ops' launch at the call).
//   gs_barrier  a stream-ordered barrier of all ranks: launch 1 block of 32.
//   gs_sema_wait  the waiting half of the semaphore protocol (sema.go):
//               launch 1 block of 32.
#include "copy.cuh"
#include "ll.cuh"

// This block's share of a segment when the launch stages (p.npre > 0): the
// same byte range [lo, hi) of every segment of a given length, whatever the
// alignment, so that block b of the rank that stages a range and block b of
// the rank that pulls it agree on the range their block barrier covers.
__device__ __forceinline__ void gs_copy_block_share(char *dst, const char *src, gs_u64 bytes) {
	const gs_u64 per = gs_share16(bytes, gridDim.x);
	gs_u64 lo = (gs_u64)blockIdx.x * per, hi = lo + per;
	lo = lo < bytes ? lo : bytes;
	hi = hi < bytes ? hi : bytes;
	gs_copy_seg(dst + lo, src + lo, hi - lo, threadIdx.x, blockDim.x);
}

// One gs_copy launch's work (gs_copy, and each step of gs_copy_steps);
// false where it failed (recorded on the rank's pad).
__device__ __forceinline__ bool gs_copy_run(const gs_copy_params &p) {
	if (!gs_config_ok(p.pads, p.world, p.rank))
		return false;
	if (p.nseg < 0 || p.nseg > GS_MAX_SEGS) {
		if (threadIdx.x == 0)
			gs_record_error(p.pads[p.rank], GS_ERR_CONFIG, (gs_u32)p.nseg, 0);
		return false;
	}
	if (p.npre < 0 || p.npre > p.nseg) {
		if (threadIdx.x == 0)
			gs_record_error(p.pads[p.rank], GS_ERR_CONFIG, (gs_u32)p.npre, 1);
		return false;
	}
	// Staging: segments [0, npre) copy this rank's data into its own staging
	// before the start barrier (so the launch replaces a copy and a launch).
	for (int s = 0; s < p.npre; ++s)
		gs_copy_block_share((char *)p.dst[s], (const char *)p.src[s], p.bytes[s]);
	if (p.npre > 0)
		__threadfence_system();
	if ((p.sync & GS_SYNC_START) && !gs_block_barrier(p.pads, p.world, p.rank, p.timeout_ns))
		return false;
	// A staged move: the start barrier is block b's of every rank, so block b
	// may read of a peer's staging only the range the peer's block b staged,
	// its share. A rank that stages nothing here (a broadcast's or a
	// scatter's receivers) must take shares too (GS_SYNC_SHARES): a
	// grid-wide stride read bytes that other blocks of the root had not
	// staged yet (the fuzzer's broadcasts, two ranks on one GPU).
	const bool shares = p.npre > 0 || (p.sync & GS_SYNC_SHARES);
#pragma unroll
	for (int s = 0; s < GS_MAX_SEGS; ++s)
		if (s >= p.npre && s < p.nseg) {
			if (shares)
				gs_copy_block_share((char *)p.dst[s], (const char *)p.src[s], p.bytes[s]);
			else
				gs_copy_seg((char *)p.dst[s], (const char *)p.src[s], p.bytes[s], gs_thread_index(),
				            gs_thread_count());
		}
	if (p.sync & GS_SYNC_END)
		return gs_block_barrier(p.pads, p.world, p.rank, p.timeout_ns);
	return true;
}

// __grid_constant__: gs_copy_run reads the parameter in place, no per-thread copy.
extern "C" __global__ void __launch_bounds__(GS_BLOCK_THREADS) gs_copy(const __grid_constant__ gs_copy_params p) {
	gs_kernel_begin();
	gs_copy_run(p);
}

// The number of steps gs_copy_steps may run once g.head[0] reached g.want
// (cyclic compare); -1 if the wait timed out or was aborted, or the count
// is out of range (recorded on g.pad).
__device__ __forceinline__ int gs_steps_wait(const gs_steps_params &g) {
	if (!gs_poll(g.head, GsReached{g.want}, g.timeout_ns, g.pad)) {
		gs_record_error(g.pad, GS_ERR_TIMEOUT, 0xffffffffu, 0);
		return -1;
	}
	__threadfence_system(); // the count and the steps were written before the word
	const int c = *(const volatile int *)(g.head + 1);
	if (c < 0 || c > g.max) {
		gs_record_error(g.pad, GS_ERR_CONFIG, (gs_u32)c, 2);
		return -1;
	}
	return c;
}

// Step s of g into p, word by word (volatile: the host may have written it
// after this launch began), by the threads from first on, stride apart.
__device__ __forceinline__ void gs_steps_read(const gs_steps_params &g, int s, gs_copy_params *p,
                                              unsigned first, unsigned stride) {
	const unsigned words = sizeof(gs_copy_params) / sizeof(gs_u64);
	const volatile gs_u64 *src = (const volatile gs_u64 *)((const gs_copy_params *)g.steps + s);
	gs_u64 *dst = (gs_u64 *)p;
	for (unsigned i = first; i < words; i += stride)
		dst[i] = src[i];
}

// gs_copy launched before its parameters exist (cuda.StepsParams): each
// block waits for the host (or a kernel) to publish the steps, then runs
// them in order, each read once per block into shared memory. Blocks move
// from step to step on their own: a staging that several steps reuse must
// get segments of the same length at every step (a block's share of a
// segment depends on its length alone), so that block b of every rank
// touches the same range of it each time and block b's barriers order the
// reuse; a last, shorter chunk starts earlier instead and copies some bytes
// again.
extern "C" __global__ void __launch_bounds__(GS_BLOCK_THREADS) gs_copy_steps(gs_steps_params g) {
	gs_kernel_begin();
#ifdef GS_EMULATION
	// __shared__ is per OS thread here: every thread waits and reads for itself
	const int n = gs_steps_wait(g);
	gs_copy_params p;
#else
	__shared__ int n;
	__shared__ gs_copy_params p;
	if (threadIdx.x == 0)
		n = gs_steps_wait(g);
	__syncthreads();
#endif
	for (int s = 0; s < n; ++s) {
#ifdef GS_EMULATION
		gs_steps_read(g, s, &p, 0, 1);
#else
		gs_steps_read(g, s, &p, threadIdx.x, blockDim.x);
		__syncthreads();
#endif
		const bool ok = gs_copy_run(p);
		__syncthreads(); // every thread is done with p before the next step overwrites it
		if (!ok)
			return;
	}
}

// Every rank sends p.bytes from src[q] to each peer q (src[q] == 0: only
// the handshake line) and writes what each peer q sent into dst[q] (dst[q]
// == 0: q sends only the handshake); src[rank] goes to dst[rank] locally
// (skipped when either is 0 or they are equal). Rank q's src[r] is set
// exactly when rank r's dst[q] is. Thread j of block b owns line
// b * GS_LL_LINES + j (+ k * GS_LL_THREADS) of every segment: it reads
// all of them before it writes any, so in-place ops (a dst that is a src)
// are safe. Grid: the same on every rank, as LLGrid gives for p.bytes.
extern "C" __global__ void __launch_bounds__(GS_BLOCK_THREADS) gs_llmove(gs_llmove_params p) {
	gs_kernel_begin();
	const int K = GS_LL_LINES / GS_LL_THREADS; // lines per thread
	const gs_u64 lines = (p.bytes + 7u) / 8u;
	if (!gs_ll_shape_ok(p.pads, p.world, p.rank, lines))
		return;
	GsLL ll;
	gs_ll_begin(p.pads, p.world, p.rank, ll);
	const gs_u64 first = (gs_u64)blockIdx.x * GS_LL_LINES;
	const char *self = (const char *)p.src[p.rank];
	const bool copy_self = self && p.dst[p.rank] && p.dst[p.rank] != self;
	gs_u64 mine[K];
#pragma unroll
	for (int k = 0; k < K; ++k) {
		const gs_u64 j = threadIdx.x + (gs_u64)k * GS_LL_THREADS, l = first + j;
		if (l >= lines)
			break;
		for (int q = 0; q < p.world; ++q) {
			const unsigned char *src = (const unsigned char *)p.src[q];
			if (q == p.rank || !src)
				continue;
			gs_ll_store((char *)p.areas[q] + ll.at(p.rank, j), gs_ll_gather(src, p.bytes, l), ll.flag);
		}
		if (copy_self)
			mine[k] = gs_ll_gather((const unsigned char *)self, p.bytes, l);
	}
	if (threadIdx.x == 0)
		for (int q = 0; q < p.world; ++q)
			if (q != p.rank && !p.src[q])
				gs_ll_store((char *)p.areas[q] + ll.at(p.rank, 0), 0, ll.flag);

	bool failed = false;
#pragma unroll
	for (int k = 0; k < K; ++k) {
		const gs_u64 j = threadIdx.x + (gs_u64)k * GS_LL_THREADS, l = first + j;
		if (l >= lines || failed)
			break;
		for (int q = 0; q < p.world && !failed; ++q) {
			char *dst = (char *)p.dst[q];
			gs_u64 d = 0;
			if (q == p.rank) {
				if (copy_self)
					gs_ll_put(dst, p.bytes, l, mine[k]);
			} else if (dst) {
				failed = !gs_ll_wait(ll, (const char *)p.areas[p.rank] + ll.at(q, j), d, p.timeout_ns,
				                     p.pads[p.rank], q);
				if (!failed)
					gs_ll_put(dst, p.bytes, l, d);
			}
		}
	}
	if (threadIdx.x == 0)
		for (int q = 0; q < p.world && !failed; ++q) {
			gs_u64 d;
			if (q != p.rank && !p.dst[q])
				failed = !gs_ll_wait(ll, (const char *)p.areas[p.rank] + ll.at(q, 0), d, p.timeout_ns,
				                     p.pads[p.rank], q);
		}
	gs_ll_end(ll);
}

extern "C" __global__ void __launch_bounds__(32) gs_barrier(gs_barrier_params p) {
	gs_kernel_begin();
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
	gs_kernel_begin();
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
	if (!gs_poll(sem, GsIsSet{}, p.timeout_ns, p.pad)) {
		gs_record_error(p.pad, GS_ERR_TIMEOUT, ((gs_u32)p.word << 8) | (gs_u32)t, 1u << t);
		return;
	}
	gs_st_release(sem, 0u);
}

// The push mode of gs_bcast_relay (p.push): the whole grid of a non-root
// pulls its own chunk from the root once and stores each piece into its
// own output and every other non-root's: no flags, the closing barrier
// (after a system fence) is what tells a rank that its output is whole.
// The root copies its input to its output when apart.
__device__ __forceinline__ void gs_bcast_push(const gs_relay_params &p, gs_u64 chunk) {
	const gs_u64 g = gs_thread_index(), stride = gs_thread_count();
	if (p.rank == p.root) {
		if (p.outs[p.rank] != p.src)
			gs_copy_seg((char *)p.outs[p.rank], (const char *)p.src, p.bytes, g, stride);
		return;
	}
	const int j = p.rank < p.root ? p.rank : p.rank - 1;
	const gs_u64 lo = j * chunk < p.bytes ? j * chunk : p.bytes;
	const gs_u64 hi = lo + chunk < p.bytes ? lo + chunk : p.bytes;
	char *to[GS_MAX_RANKS - 1];
	int nd = 0;
	to[nd++] = (char *)p.outs[p.rank] + lo; // this rank's own first: the rest cross the switch
	for (int q = 0; q < p.world && q < GS_MAX_RANKS; ++q)
		if (q != p.rank && q != p.root)
			to[nd++] = (char *)p.outs[q] + lo;
	gs_copy_seg_to<GS_MAX_RANKS - 1>(to, nd, (const char *)p.src + lo, hi - lo, g, stride);
}

// Broadcast by scatter and relay (the pipelined ring's traffic on a switch):
// the bytes are cut into world-1 chunks, one per non-root; the non-root of
// index j (ranks in order, the root left out) pulls chunk j from the root
// into its own output, slice by slice, publishing each slice (PROG word of
// its block, release), while it pulls every other non-root's chunk from
// that rank's output as soon as the slices are there. The root's egress
// carries each byte once and every rank's ingress each byte once, so the
// op runs near one link's bandwidth, where every peer reading the root
// shares the root's egress world-1 ways. Blocks [0, G) of a non-root pull
// from the root (first, so that the host emulation, which runs blocks one
// after another, meets them before their readers); block i*G+b (i >= 1)
// relays sub-range b of the chunk of non-root j+i (mod world-1). Sub-range
// b of every chunk is a fixed per bytes; its slices are step bytes. The
// last thread of a block publishes, after every thread fenced its copy; the
// first thread polls (so both are right when a block's threads run one
// after another). The root's blocks copy its input to its output (when
// apart) and account for the slices it will not wait for (SEEN words), so
// that every rank's counts stay in step whoever is root.
extern "C" __global__ void __launch_bounds__(GS_BLOCK_THREADS) gs_bcast_relay(gs_relay_params p) {
	gs_kernel_begin();
	if (!gs_config_ok(p.pads, p.world, p.rank))
		return;
	gs_u32 *own = p.pads[p.rank];
	const int m = p.world - 1, G = p.blocks;
	if (m < 1 || G < 1 || p.root < 0 || p.root >= p.world || (int)gridDim.x != G * m || p.step == 0 ||
	    p.step % 16u != 0) {
		if (threadIdx.x == 0)
			gs_record_error(own, GS_ERR_CONFIG, (gs_u32)G, 2);
		return;
	}
	if (!gs_block_barrier(p.pads, p.world, p.rank, p.timeout_ns))
		return;
	const gs_u64 chunk = gs_share16(p.bytes, m);
	if (p.push) {
		gs_bcast_push(p, chunk);
		__threadfence_system();
		gs_block_barrier(p.pads, p.world, p.rank, p.timeout_ns);
		return;
	}
	const int role = blockIdx.x / G, b = blockIdx.x % G;
	const gs_u64 per = gs_share16(chunk, G);
	const gs_u64 slices = (per + p.step - 1) / p.step;
	if (p.rank == p.root) {
		const int q = role < p.root ? role : role + 1;
		if (threadIdx.x == 0)
			own[GS_PAD_RELAY_SEEN + q * GS_MAX_BLOCKS + b] += (gs_u32)slices;
		if (p.outs[p.rank] != p.src)
			gs_copy_block_share((char *)p.outs[p.rank], (const char *)p.src, p.bytes);
	} else {
		const int j = p.rank < p.root ? p.rank : p.rank - 1;
		const int cj = (j + role) % m;      // whose chunk: this rank's own for role 0
		const int q = cj < p.root ? cj : cj + 1; // that chunk's rank
		const char *from = role == 0 ? (const char *)p.src : (const char *)p.outs[q];
		char *to = (char *)p.outs[p.rank];
		const gs_u64 end = (cj + 1) * chunk < p.bytes ? (cj + 1) * chunk : p.bytes;
		const gs_u64 lo = cj * chunk + b * per;
		gs_u32 *prog = own + GS_PAD_RELAY_PROG + b;
		gs_u32 *seen = own + GS_PAD_RELAY_SEEN + q * GS_MAX_BLOCKS + b;
		const gs_u32 base = role == 0 ? *prog : *seen;
		gs_u32 have = base; // what the first thread last saw of q's count
		for (gs_u64 k = 0; k < slices; ++k) {
			gs_u64 s_lo = lo + k * p.step, s_hi = s_lo + p.step;
			s_hi = s_hi < lo + per ? s_hi : lo + per;
			s_hi = s_hi < end ? s_hi : end;
			if (role != 0) {
				int failed = 0;
				const gs_u32 want = base + (gs_u32)k + 1u;
				if (threadIdx.x == 0 && (int)(have - want) < 0) {
					const gs_u32 *flag = p.pads[q] + GS_PAD_RELAY_PROG + b;
					if (gs_poll(flag, GsReached{want}, p.timeout_ns, own))
						have = gs_ld_acquire(flag);
					else {
						gs_record_error(own, GS_ERR_TIMEOUT, GS_RELAY_DETAIL | ((gs_u32)b << 8) | (gs_u32)q,
						                1u << q);
						failed = 1;
					}
				}
				if (__syncthreads_or(failed))
					return;
			}
			if (s_lo < s_hi)
				gs_copy_seg(to + s_lo, from + s_lo, s_hi - s_lo, threadIdx.x, blockDim.x);
			if (role == 0) {
				__threadfence_system();
				__syncthreads();
				if (threadIdx.x == blockDim.x - 1)
					gs_st_release(prog, base + (gs_u32)k + 1u);
			}
		}
		if (role != 0 && threadIdx.x == 0)
			*seen = base + (gs_u32)slices;
	}
	__threadfence_system();
	gs_block_barrier(p.pads, p.world, p.rank, p.timeout_ns);
}
