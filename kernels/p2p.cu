// Point-to-point kernels: one message over one direction of a channel
// between two ranks (gobackend/internal/cuda/p2p.go sets the channel up).
//
//   gs_p2p_send  copies the message into this rank's outbox, slot by slot,
//                and tells the receiver each slot is ready;
//   gs_p2p_recv  copies each ready slot from the sender's outbox (a peer
//                mapping: NVLink reads) into the destination and tells the
//                sender the slot is free again.
//   gs_a2av      the same protocol between every pair of a group at once,
//                over the group's staging and signal pads: all_to_all(v)
//                with no barrier of all ranks and no host agreement (end of
//                this file).
//
// Launch both with GS_P2P_BLOCKS blocks (any number up to it works if both
// sides use the same) of at least 32 threads. The message is cut into
// rounds of slot_bytes per block; in each round block b moves its 16-byte
// aligned share. Every block moves exactly the same number of chunks for a
// message, one per round (possibly empty), so per-block counters advance
// alike on both sides, and a receiver that expected another size can still
// drain the message in step: it reads the sender's size from the header of
// its first chunk.
//
// Counters (one 128-byte line each, in the control allocations):
//   READY[b]  in the receiver's control, written by the sender (release):
//             chunks block b of the sender made ready;
//   ACK[b]    in the sender's control, written by the receiver (release):
//             chunks block b of the receiver consumed;
//   SENT[b], RECVD[b]  each side's own count, never read by the peer.
// Chunk k of block b uses slot k % GS_P2P_SLOTS; the sender fills it once
// ACK[b] shows chunk k - GS_P2P_SLOTS consumed, so it runs at most
// GS_P2P_SLOTS chunks ahead and then waits on the device. All counters live
// on the device and only grow (cyclic comparison), so a replayed CUDA graph
// carries on from where the last launch left them.
#include "copy.cuh"

static_assert(GS_P2P_ACK >= GS_P2P_READY + GS_P2P_BLOCKS * GS_P2P_LINE, "p2p: ready overlaps ack");
static_assert(GS_P2P_SENT >= GS_P2P_ACK + GS_P2P_BLOCKS * GS_P2P_LINE, "p2p: ack overlaps sent");
static_assert(GS_P2P_RECVD >= GS_P2P_SENT + GS_P2P_BLOCKS * GS_P2P_LINE, "p2p: sent overlaps recvd");
static_assert(GS_P2P_HDR >= GS_P2P_RECVD + GS_P2P_BLOCKS * GS_P2P_LINE, "p2p: recvd overlaps hdr");
static_assert(GS_P2P_ERROR >= GS_P2P_HDR + GS_P2P_BLOCKS * GS_P2P_SLOTS * GS_P2P_HDR_WORDS,
              "p2p: headers overlap the error words");
static_assert(GS_P2P_GONE >= GS_P2P_ERROR + GS_P2P_ERROR_WORDS && (GS_P2P_GONE + 1) * 4 <= GS_P2P_CTRL_BYTES,
              "p2p: control does not fit");

// What a block was waiting for when it timed out (low byte of the detail).
#define GS_P2P_WAIT_SLOT 0  // the sender, for a free slot
#define GS_P2P_WAIT_DATA 1  // the receiver, for a ready chunk

// Records the first error on this side's control words; a0..a3 go with it.
// With p.host_err set, the first error is copied to that pinned host block
// too (code last, release), so that the host sees it with one atomic load
// before the channel's next op (internal/gpu/p2p.go) and raises it.
__device__ __forceinline__ void gs_p2p_error(const gs_p2p_params &p, gs_u32 code, gs_u32 detail,
                                             gs_u32 a0, gs_u32 a1, gs_u32 a2, gs_u32 a3) {
	gs_u32 *e = p.ctrl + GS_P2P_ERROR;
	if (atomicCAS(e, 0u, code) == 0u) {
		const gs_u32 w[GS_P2P_ERROR_WORDS] = {code, detail, a0, a1, a2, a3};
		for (int i = 1; i < GS_P2P_ERROR_WORDS; ++i)
			atomicExch(e + i, w[i]);
		__threadfence_system();
		if (p.host_err) {
			for (int i = 1; i < GS_P2P_ERROR_WORDS; ++i)
				gs_st_release(p.host_err + i, w[i]);
			gs_st_release(p.host_err, code);
		}
	}
	__threadfence_system();
}

__device__ __forceinline__ bool gs_p2p_config_ok(const gs_p2p_params &p) {
	if (!p.ctrl)
		return false;
	const bool ok = p.peer_ctrl && p.box && (p.buf || p.bytes == 0) && p.slot_bytes >= 16 &&
	                p.slot_bytes % 16 == 0 && gridDim.x >= 1 && gridDim.x <= GS_P2P_BLOCKS &&
	                gridDim.y == 1 && gridDim.z == 1 && blockDim.x >= 32 && blockDim.y == 1 &&
	                blockDim.z == 1;
	if (!ok && threadIdx.x == 0)
		gs_p2p_error(p, GS_ERR_CONFIG, (gridDim.x << 16) | (blockDim.x & 0xffffu),
		             (gs_u32)p.slot_bytes, 0, 0, 0);
	return ok;
}

// Rounds of a message of bytes over nb blocks: at least one, so that an
// empty message still meets its receiver.
__device__ __forceinline__ gs_u64 gs_p2p_rounds(gs_u64 bytes, gs_u64 slot_bytes, gs_u32 nb) {
	const gs_u64 round = slot_bytes * nb;
	return bytes == 0 ? 1 : (bytes + round - 1) / round;
}

// Block b's share (of nb) of round j: *len bytes at message offset *off,
// at most slot_bytes (16-byte aligned pieces, the last one shorter).
__device__ __forceinline__ void gs_p2p_share(gs_u64 bytes, gs_u64 slot_bytes, gs_u32 nb, gs_u32 b, gs_u64 j,
                                             gs_u64 *off, gs_u64 *len) {
	const gs_u64 round = slot_bytes * nb, base = j * round;
	const gs_u64 left = bytes > base ? bytes - base : 0;
	const gs_u64 rb = left < round ? left : round;
	const gs_u64 per = gs_share16(rb, nb);
	gs_u64 lo = (gs_u64)b * per, hi = lo + per;
	lo = lo < rb ? lo : rb;
	hi = hi < rb ? hi : rb;
	*off = base + lo;
	*len = hi - lo;
}

// ---- one lane of the protocol ----------------------------------------------------
//
// The two loops every kernel of this file runs, each for one lane: one
// block of one direction of a channel (gs_p2p_*) or of one ordered pair of
// a group (gs_a2av). A lane type says where the lane's counters, slots and
// size header live, and how its errors are recorded:
//   sent(), recvd()           this side's own counts;
//   ack(), ready()            the flags this side waits on, in its memory;
//   peer_ready(), peer_ack()  the flags it releases, in the peer's;
//   slot(s)                   slot s of the lane, in the sender's memory
//                             (a pushing lane's: in the receiver's);
//   slots                     how many chunks a sender may run ahead
//                             (its slots: the p2p outbox's and gs_a2av's
//                             differ, each measured for its own use);
//   pushes()                  the sender stores each chunk into the
//                             receiver's memory, and the receiver grants
//                             slots (below) rather than freeing them;
//   wait(flag, want, what)    a wait with the lane's deadline (false, for
//                             every thread, once it timed out, recorded);
//   put_header(j, s)          thread 0, once chunk j is in slot s;
//   check_header(s, &bytes)   every thread, at the first chunk: false when
//                             the sender's size (or tag) is not the one
//                             expected, *bytes then the sender's (recorded).

static_assert(GS_P2P_WAIT_SLOT == GS_A2AV_WAIT_SLOT && GS_P2P_WAIT_DATA == GS_A2AV_WAIT_DATA,
              "lanes: one set of wait codes");
// ACK, the counter a sender waits on before it fills chunk k, means one of
// two things. Pulling: chunks consumed; slot k % SLOTS is free once chunk
// k - SLOTS was consumed, so a sender may fill its own memory up to SLOTS
// chunks ahead, even before its receiver started the op. Pushing: chunks
// granted; the receiver grants at most SLOTS chunks past the ones it
// consumed and never past the end of the piece it is receiving now, so no
// sender stores into the receiver's memory before the receiver's launch
// began (its slots lie in memory other ops of the group use between the
// all_to_alls).

// The count a sender's ACK must reach before it fills chunk k.
template <class Lane>
__device__ __forceinline__ gs_u32 gs_lane_free(const Lane &l, gs_u32 k) {
	return l.pushes() ? k + 1u : k + 1u - Lane::slots;
}

// The ACK a receiver releases once it consumed up to count k of a piece
// that ends at count end.
template <class Lane>
__device__ __forceinline__ gs_u32 gs_lane_ack(const Lane &l, gs_u32 k, gs_u32 end) {
	return l.pushes() && (int)(end - k) > 0 ? k + ((int)(end - k) < (int)Lane::slots ? end - k : Lane::slots) : k;
}

// Sends bytes from src over lane l, block b of nb, one chunk of slot_bytes
// at most per round. False if a wait timed out; else *next is the lane's
// count after the last chunk.
template <class Lane>
__device__ __forceinline__ bool gs_lane_send(const Lane &l, const char *src, gs_u64 bytes, gs_u64 slot_bytes,
                                             gs_u32 nb, gs_u32 b, gs_u32 *next) {
	// Read by every thread before thread 0 first advances it (after the
	// barrier in the first wait).
	gs_u32 k = *l.sent();
	const gs_u64 rounds = gs_p2p_rounds(bytes, slot_bytes, nb);
	for (gs_u64 j = 0; j < rounds; ++j, ++k) {
		if (!l.wait(l.ack(), gs_lane_free(l, k), GS_P2P_WAIT_SLOT))
			return false;
		const gs_u32 s = k % Lane::slots;
		gs_u64 off, len;
		gs_p2p_share(bytes, slot_bytes, nb, b, j, &off, &len);
		gs_copy_seg(l.slot(s), src + off, len, threadIdx.x, blockDim.x);
		__threadfence_system();
		__syncthreads();
		if (threadIdx.x == 0) {
			l.put_header(j, s);
			gs_st_release(l.peer_ready(), k + 1u);
			*l.sent() = k + 1u;
		}
	}
	*next = k;
	return true;
}

// Receives over lane l into dst a message of bytes expected (block b of
// nb); one of another size is drained in step and nothing of it written.
template <class Lane>
__device__ __forceinline__ void gs_lane_recv(const Lane &l, char *dst, gs_u64 bytes, gs_u64 slot_bytes, gs_u32 nb,
                                             gs_u32 b) {
	gs_u32 k = *l.recvd();
	const gs_u32 k0 = k;
	gs_u64 rounds = gs_p2p_rounds(bytes, slot_bytes, nb);
	bool drain = false; // the message is not the one expected: consume it, write nothing
	// A pushing sender waits for the first grant; the read of recvd above
	// happens before thread 0 writes it (the barrier in the first wait).
	if (l.pushes() && threadIdx.x == 0)
		gs_st_release(l.peer_ack(), gs_lane_ack(l, k, k0 + (gs_u32)rounds));
	for (gs_u64 j = 0; j < rounds; ++j, ++k) {
		if (!l.wait(l.ready(), k + 1u, GS_P2P_WAIT_DATA))
			return;
		const gs_u32 s = k % Lane::slots;
		// The sender's header, read by every thread after the wait.
		if (j == 0 && !l.check_header(s, &bytes)) {
			drain = true;
			rounds = gs_p2p_rounds(bytes, slot_bytes, nb);
		}
		if (!drain) {
			gs_u64 off, len;
			gs_p2p_share(bytes, slot_bytes, nb, b, j, &off, &len);
			gs_copy_seg(dst + off, l.slot(s), len, threadIdx.x, blockDim.x);
		}
		// Every thread's reads of the slot are done before the sender may
		// refill it.
		__syncthreads();
		if (threadIdx.x == 0) {
			gs_st_release(l.peer_ack(), gs_lane_ack(l, k + 1u, k0 + (gs_u32)rounds));
			*l.recvd() = k + 1u;
		}
	}
}

// Slot s of block b in an outbox.
__device__ __forceinline__ char *gs_p2p_slot(const gs_p2p_params &p, gs_u32 s) {
	return (char *)p.box + ((gs_u64)blockIdx.x * GS_P2P_SLOTS + s) * p.slot_bytes;
}

// This side's host left an abort in the channel's control (a lost peer:
// gobackend/watchdog.go): recorded as the channel's error (the detail is
// there before the code), and the wait gives up.
__device__ __forceinline__ bool gs_p2p_aborted(const gs_p2p_params &p) {
	const gs_u32 code = gs_ld_acquire(p.ctrl + GS_P2P_ABORT);
	if (code == 0)
		return false;
	gs_p2p_error(p, code, gs_ld_acquire(p.ctrl + GS_P2P_ABORT_DETAIL), 0, 0, 0, 0);
	return true;
}

// Thread 0 waits until *flag reaches want; false (error recorded) on timeout
// or an abort, for every thread of the block.
__device__ __forceinline__ bool gs_p2p_wait(const gs_p2p_params &p, const gs_u32 *flag, gs_u32 want,
                                            gs_u32 what) {
	int failed = 0;
	if (threadIdx.x == 0 && !gs_wait_or([&] { return GsReached{want}(gs_ld_acquire(flag)); }, p.timeout_ns,
	                                    [&] { return gs_p2p_aborted(p); })) {
		gs_p2p_error(p, GS_ERR_TIMEOUT, (blockIdx.x << 8) | what, 0, 0, 0, 0);
		failed = 1;
	}
	return !__syncthreads_or(failed);
}

// The lane of block blockIdx.x of a channel: its counters on one 128-byte
// line each, its slots in the sender's outbox, a header per slot that
// carries the message's size and tag with every chunk.
struct GsP2PLane {
	const gs_p2p_params &p;
	gs_u32 line;
	__device__ volatile gs_u32 *sent() const { return p.ctrl + GS_P2P_SENT + line; }
	__device__ volatile gs_u32 *recvd() const { return p.ctrl + GS_P2P_RECVD + line; }
	__device__ const gs_u32 *ack() const { return p.ctrl + GS_P2P_ACK + line; }
	__device__ const gs_u32 *ready() const { return p.ctrl + GS_P2P_READY + line; }
	__device__ gs_u32 *peer_ready() const { return p.peer_ctrl + GS_P2P_READY + line; }
	__device__ gs_u32 *peer_ack() const { return p.peer_ctrl + GS_P2P_ACK + line; }
	__device__ char *slot(gs_u32 s) const { return gs_p2p_slot(p, s); }
	static constexpr gs_u32 slots = GS_P2P_SLOTS;
	__device__ bool pushes() const { return false; }
	__device__ bool wait(const gs_u32 *flag, gs_u32 want, gs_u32 what) const {
		return gs_p2p_wait(p, flag, want, what);
	}
	__device__ volatile gs_u32 *header(gs_u32 *ctrl, gs_u32 s) const {
		return ctrl + GS_P2P_HDR + (blockIdx.x * GS_P2P_SLOTS + s) * GS_P2P_HDR_WORDS;
	}
	__device__ void put_header(gs_u64, gs_u32 s) const {
		volatile gs_u32 *h = header(p.peer_ctrl, s);
		h[0] = (gs_u32)p.bytes;
		h[1] = (gs_u32)(p.bytes >> 32);
		h[2] = (gs_u32)(gs_u64)p.tag;
		h[3] = (gs_u32)((gs_u64)p.tag >> 32);
	}
	__device__ bool check_header(gs_u32 s, gs_u64 *bytes) const {
		const volatile gs_u32 *h = header(p.ctrl, s);
		const gs_u32 h0 = h[0], h1 = h[1], h2 = h[2], h3 = h[3];
		const gs_u64 got = (gs_u64)h0 | ((gs_u64)h1 << 32);
		const long long tag = (long long)((gs_u64)h2 | ((gs_u64)h3 << 32));
		if (got == *bytes && tag == p.tag)
			return true;
		*bytes = got;
		if (threadIdx.x == 0)
			gs_p2p_error(p, GS_ERR_MISMATCH, blockIdx.x << 8, h0, h1, h2, h3);
		return false;
	}
};

extern "C" __global__ void __launch_bounds__(GS_BLOCK_THREADS) gs_p2p_send(gs_p2p_params p) {
	gs_kernel_begin();
	if (!gs_p2p_config_ok(p))
		return;
	gs_u32 next;
	gs_lane_send(GsP2PLane{p, blockIdx.x * GS_P2P_LINE}, (const char *)p.buf, p.bytes, p.slot_bytes, gridDim.x,
	             blockIdx.x, &next);
}

extern "C" __global__ void __launch_bounds__(GS_BLOCK_THREADS) gs_p2p_recv(gs_p2p_params p) {
	gs_kernel_begin();
	if (!gs_p2p_config_ok(p))
		return;
	gs_lane_recv(GsP2PLane{p, blockIdx.x * GS_P2P_LINE}, (char *)p.buf, p.bytes, p.slot_bytes, gridDim.x,
	             blockIdx.x);
}

// ---- gs_a2av: all_to_all(v) paced pair by pair --------------------------------
//
// The channel protocol above, run for every ordered pair of a group at
// once in one launch, over the group's own buffers instead of a channel's:
// the piece rank i sends rank q passes through i's region for q in i's
// staging (q pulls it from there) or, with p.push, through q's region for i
// (i stores it there over the link, q copies it out locally; stores cross
// the switch without a load's round trip), and the pair's counters live
// in the signal pads (params.go, PadA2AV*). A pair's chunk count depends only on its own
// piece size, which both ranks of the pair know (the sender its input
// split, the receiver its output split), so no rank needs the others'
// splits: there is no barrier of all ranks and no agreement on the host,
// and a launch has the same shape on every rank (2*(world-1)*nb pair
// blocks, then the local copy's blocks, whose number may differ).
//
// Pair block i < (world-1)*nb sends to rank + 1 + i/nb (block b = i%nb of
// that pair); the next (world-1)*nb receive from rank - 1 - i/nb. As on a
// channel, a receiver reads its sender's size from the header of the
// first chunk; one that expected another size drains the piece in step,
// writes nothing of it and records GS_ERR_MISMATCH naming the sender, so
// the counters stay in step. A pulling sender block ends only once its
// receiver consumed every chunk: the launch that follows on the stream may
// stage into the same region. A pushing one ends after its last store: its
// receiver's launch ends only once it consumed every chunk in its staging.

__device__ __forceinline__ bool gs_a2av_config_ok(const gs_a2av_params &p) {
	if (p.world < 1 || p.world > GS_MAX_RANKS || p.rank < 0 || p.rank >= p.world || !p.pads[p.rank])
		return false;
	bool ok = p.nb >= 1 && p.nb <= GS_A2AV_BLOCKS && gridDim.y == 1 && gridDim.z == 1 &&
	          blockDim.x >= 32 && blockDim.y == 1 && blockDim.z == 1 && p.slot_bytes >= 16 &&
	          p.slot_bytes % 16 == 0 && p.region % 16 == 0;
	if (ok) {
		const gs_u32 pairs = 2u * (gs_u32)(p.world - 1) * (gs_u32)p.nb;
		ok = pairs <= GS_MAX_BLOCKS && gridDim.x > pairs && gridDim.x <= pairs + GS_A2AV_SELF_MAX &&
		     p.slot_bytes * (gs_u64)p.nb * GS_A2AV_SLOTS <= p.region;
	}
	if (!ok && threadIdx.x == 0)
		gs_record_error(p.pads[p.rank], GS_ERR_CONFIG, (gridDim.x << 16) | (blockDim.x & 0xffffu), 0);
	return ok;
}

// Thread 0 waits until *flag reaches want; false (error recorded, naming
// peer q) on timeout, for every thread of the block.
__device__ __forceinline__ bool gs_a2av_wait(const gs_a2av_params &p, const gs_u32 *flag, gs_u32 want,
                                             gs_u32 what, int q, gs_u32 b) {
	int failed = 0;
	if (threadIdx.x == 0 && !gs_poll(flag, GsReached{want}, p.timeout_ns, p.pads[p.rank])) {
		gs_record_error(p.pads[p.rank], GS_ERR_TIMEOUT, GS_A2AV_DETAIL | (what << 16) | (b << 8) | (gs_u32)q,
		                1u << q);
		failed = 1;
	}
	return !__syncthreads_or(failed);
}

// Slot s of block b in the region for rank `to` of rank owner's staging:
// world-1 regions, one per other rank in rank order (the owner has none
// for itself: its own piece is copied directly), so that a region is
// stage/(world-1) bytes and at two ranks the whole staging.
__device__ __forceinline__ char *gs_a2av_slot(const gs_a2av_params &p, int owner, int to, gs_u32 b, gs_u32 s) {
	const gs_u64 at = (gs_u64)(to - (to > owner ? 1 : 0));
	return (char *)p.stages[owner] + at * p.region + ((gs_u64)b * GS_A2AV_SLOTS + s) * p.slot_bytes;
}

// Block b of the pair between this rank and q, in one direction: the
// pair's counters in the two pads (by peer and block), its slots in region
// `to` of rank owner's staging (the sender's, or with p.push the
// receiver's), and a size header written once, with the first chunk.
struct GsA2AVLane {
	const gs_a2av_params &p;
	int q, owner, to;
	gs_u32 b;
	gs_u32 *own, *peer;
	gs_u32 mine, theirs; // this rank's and q's counter index for block b
	gs_u64 bytes;        // the sender's piece (a sending lane's)
	__device__ GsA2AVLane(const gs_a2av_params &p, int q, gs_u32 b, bool sending)
	    : p(p), q(q), owner(sending == !p.push ? p.rank : q), to(sending == !p.push ? q : p.rank), b(b),
	      own(p.pads[p.rank]),
	      peer(p.pads[q]), mine((gs_u32)p.rank * GS_A2AV_BLOCKS + b), theirs((gs_u32)q * GS_A2AV_BLOCKS + b),
	      bytes(p.send[q]) {}
	__device__ volatile gs_u32 *sent() const { return own + GS_PAD_A2AV_SENT + theirs; }
	__device__ volatile gs_u32 *recvd() const { return own + GS_PAD_A2AV_RECVD + theirs; }
	__device__ const gs_u32 *ack() const { return own + GS_PAD_A2AV_ACK + theirs; }
	__device__ const gs_u32 *ready() const { return own + GS_PAD_A2AV_READY + theirs; }
	__device__ gs_u32 *peer_ready() const { return peer + GS_PAD_A2AV_READY + mine; }
	__device__ gs_u32 *peer_ack() const { return peer + GS_PAD_A2AV_ACK + mine; }
	__device__ char *slot(gs_u32 s) const { return gs_a2av_slot(p, owner, to, b, s); }
	static constexpr gs_u32 slots = GS_A2AV_SLOTS;
	__device__ bool pushes() const { return p.push != 0; }
	__device__ bool wait(const gs_u32 *flag, gs_u32 want, gs_u32 what) const {
		return gs_a2av_wait(p, flag, want, what, q, b);
	}
	__device__ void put_header(gs_u64 j, gs_u32) const {
		if (j == 0) {
			volatile gs_u32 *h = peer + GS_PAD_A2AV_HDR + 2u * mine;
			h[0] = (gs_u32)bytes;
			h[1] = (gs_u32)(bytes >> 32);
		}
	}
	__device__ bool check_header(gs_u32, gs_u64 *expect) const {
		const volatile gs_u32 *h = own + GS_PAD_A2AV_HDR + 2u * theirs;
		const gs_u64 got = (gs_u64)h[0] | ((gs_u64)h[1] << 32);
		if (got == *expect)
			return true;
		*expect = got;
		if (threadIdx.x == 0)
			gs_record_error(own, GS_ERR_MISMATCH, GS_A2AV_DETAIL | (GS_A2AV_MISMATCH << 16) | (b << 8) | (gs_u32)q,
			                1u << q);
		return false;
	}
};

// Block b of the pair (this rank -> q). Pulling, it ends only once q
// consumed every chunk: the region is then free for what follows on the
// stream.
__device__ __forceinline__ void gs_a2av_send(const gs_a2av_params &p, int q, gs_u32 b) {
	const GsA2AVLane l(p, q, b, true);
	gs_u32 next;
	if (gs_lane_send(l, (const char *)p.src[q], p.send[q], p.slot_bytes, p.nb, b, &next) && !p.push)
		l.wait(l.ack(), next, GS_A2AV_WAIT_SLOT);
}

// Block b of the pair (q -> this rank).
__device__ __forceinline__ void gs_a2av_recv(const gs_a2av_params &p, int q, gs_u32 b) {
	gs_lane_recv(GsA2AVLane(p, q, b, false), (char *)p.dst[q], p.recv[q], p.slot_bytes, p.nb, b);
}

// Block i of the n that copy this rank's own piece (when its two splits
// agree; else block 0 records the mismatch).
__device__ __forceinline__ void gs_a2av_self(const gs_a2av_params &p, gs_u32 i, gs_u32 n) {
	const int me = p.rank;
	if (p.send[me] != p.recv[me]) {
		if (i == 0 && threadIdx.x == 0)
			gs_record_error(p.pads[me], GS_ERR_MISMATCH, GS_A2AV_DETAIL | (GS_A2AV_MISMATCH << 16) | (gs_u32)me,
			                1u << me);
		return;
	}
	gs_copy_seg((char *)p.dst[me], (const char *)p.src[me], p.send[me], (gs_u64)i * blockDim.x + threadIdx.x,
	            (gs_u64)n * blockDim.x);
}

extern "C" __global__ void __launch_bounds__(GS_BLOCK_THREADS) gs_a2av(gs_a2av_params p) {
	gs_kernel_begin();
	if (!gs_a2av_config_ok(p))
		return;
	const gs_u32 nb = p.nb, per = (gs_u32)(p.world - 1) * nb;
	gs_u32 i = blockIdx.x;
	if (i < per) {
		gs_a2av_send(p, (p.rank + 1 + (int)(i / nb)) % p.world, i % nb);
		return;
	}
	i -= per;
	if (i < per) {
		gs_a2av_recv(p, (p.rank + p.world - 1 - (int)(i / nb)) % p.world, i % nb);
		return;
	}
	gs_a2av_self(p, i - per, gridDim.x - 2u * per);
}
