package cuda

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
)

// Limits, pad layout and codes shared with the kernels. These are the
// single source: kernels/params.cuh is generated from them (ParamsHeader)
// and a test fails when the committed copy is stale.
const (
	MaxRanks     = 8   // peers a kernel can address (GS_MAX_RANKS)
	MaxBlocks    = 128 // blocks a barrier-using kernel may launch (GS_MAX_BLOCKS)
	MaxSegs      = 16  // segments of one gs_copy launch (GS_MAX_SEGS): a stage and a pull per rank
	BlockThreads = 512 // threads per block of the data kernels (GS_BLOCK_THREADS)

	// Signal pad layout, in 32-bit words (see kernels/common.cuh).
	PadFlagsWord        = 0
	PadCountersWord     = MaxBlocks * MaxRanks
	PadErrorWord        = 2 * MaxBlocks * MaxRanks
	PadErrorDetailWord  = PadErrorWord + 1
	PadErrorMissingWord = PadErrorWord + 2 // bit r: rank r missed a barrier
	// Two words (a 64-bit device address, 8-byte aligned): where the
	// kernels also copy their error words, a pinned host block the host
	// reads without a driver call (ErrorWords); 0 while there is none.
	PadHostErrorWord = PadErrorWord + 4
	// Set by a peer's host (a rank that refused the op: its arguments
	// differ, symm/sig.go) through its mapping of this pad, or by this
	// rank's own host when a peer was lost (ErrPeerLost), detail first:
	// every wait of a kernel on this pad sees the code, records it as its
	// own error and returns (gs_wait), so no kernel waits for that rank.
	PadAbortWord       = PadErrorWord + 6
	PadAbortDetailWord = PadErrorWord + 7
	// Semaphores of the stream-ordered protocol (sema.go), after the barrier
	// and error words, on a 64-byte boundary: word PadSemaReadyWord+r is
	// set by rank r when its input is staged for us, PadSemaDoneWord+r
	// when it finished reading ours (or, for reduce, when the root released
	// us). Only rank r sets its word (to SemaSet), only the pad's owner
	// waits on it and consumes it (back to 0).
	PadSemaReadyWord = PadErrorWord + 16
	PadSemaDoneWord  = PadSemaReadyWord + MaxRanks
	// Word PadLLSeqWord+b counts the low-latency launches block b of this
	// rank ran (allreduce.cu, gs_ll): local, written only by that block.
	PadLLSeqWord = PadSemaDoneWord + MaxRanks
	PadBytes     = 32768 // one pad: one rank, one channel

	// The pairwise-paced all_to_all(v) (p2p.cu, gs_a2av): the chunks that
	// block b of the pair (sender q, receiver r) moves through region r of
	// q's staging are counted on both pads, one word per (peer, block):
	// READY[q][b] on r's pad (written by q, release: chunks ready),
	// ACK[r][b] on q's pad (written by r, release: chunks consumed),
	// SENT[r][b] and RECVD[q][b] each side's own count, never read by the
	// peer, and HDR[q][b] on r's pad (bytes lo, hi: what q sends r), written
	// by q before it releases the first READY of a message.
	A2AVBlocks       = 64 // GS_A2AV_BLOCKS: blocks per pair and direction, at most
	PadA2AVReadyWord = PadLLSeqWord + LLBlocks
	PadA2AVAckWord   = PadA2AVReadyWord + MaxRanks*A2AVBlocks
	PadA2AVSentWord  = PadA2AVAckWord + MaxRanks*A2AVBlocks
	PadA2AVRecvdWord = PadA2AVSentWord + MaxRanks*A2AVBlocks
	PadA2AVHdrWord   = PadA2AVRecvdWord + MaxRanks*A2AVBlocks
	// GS_A2AV_SLOTS: chunks a sender block may run ahead of its receiver.
	// Two, not the p2p channel's four: a region holds nb × slots slots, and
	// longer slots beat more of them (2×H200, 64 blocks, 32 MiB staging,
	// pushing: 1 GiB 2784 µs in 2 × 256 KiB against 2892 in 4 × 128 KiB).
	A2AVSlots         = 2
	A2AVSelfBlocksMax = 64
	// GS_A2AV_DETAIL: set in the detail of an error gs_a2av recorded, with
	// what << 16 | block << 8 | peer (what: A2AVWaitSlot, A2AVWaitData,
	// A2AVMismatch).
	A2AVDetail   = 1 << 25
	A2AVWaitSlot = 0 // a sender block waited for its receiver to free a slot
	A2AVWaitData = 1 // a receiver block waited for its sender's chunk
	A2AVMismatch = 2 // the sender's piece has another size than the receiver expects

	// Broadcast by scatter and relay (copy.cu, gs_bcast_relay): word
	// PadRelayProgWord+b counts the slices block b of this rank pulled from
	// the root into its own chunk (written by that block, release; read by
	// the peers that relay the chunk), and PadRelaySeenWord+q*MaxBlocks+b
	// how many of rank q's block b this rank has accounted for (local).
	// Both only grow, by the same number of slices on every rank per op.
	PadRelayProgWord = PadA2AVHdrWord + 2*MaxRanks*A2AVBlocks
	PadRelaySeenWord = PadRelayProgWord + MaxBlocks
	// GS_RELAY_DETAIL: set in the detail of a timeout gs_bcast_relay
	// recorded, with block << 8 | the peer whose chunk it waited for.
	RelayDetail = 1 << 27

	// Low-latency all-reduce (gs_ll): block b of a launch sends LLLines
	// lines of 16 bytes to every peer, each 8 data bytes with the launch's
	// flag twice, into the peer's LL area: blocks × 2 (parity) × world ×
	// LLLines lines after the staging of the data allocation
	// (LLAreaBytes). Small blocks, one line a thread: an SM stores only so
	// fast across NVLink, so 16 KiB over 2 blocks of 1024 lines took 1.2 µs
	// more than 1 KiB (captured, 2×H200, session 32); 128 lines a block
	// spread it over 16 SMs.
	LLBlocks    = 512 // GS_LL_BLOCKS: blocks a gs_ll launch may have
	LLLines     = 128 // GS_LL_LINES: lines per block
	LLThreads   = 128 // GS_LL_THREADS: threads per block of gs_ll and gs_llmove
	LLLineBytes = 16
	// GS_LL_WAIT: set in the detail of a timeout gs_ll recorded (a block
	// that waited for a peer's lines), with block << 8 | rank.
	LLWaitDetail = 1 << 24
	LLMaxBytes   = LLBlocks * LLLines * 8 // the largest input gs_ll takes
	// SigDetail: set in the detail of the abort a rank that refused a
	// collective leaves on its peers' pads, with rank << 16 | seq & 0xffff
	// (the op's sequence number: its signatures say what differed).
	SigDetail = 1 << 26

	// The host error block (ErrorWords), in 32-bit words: the same three
	// as the pad's, code last (the kernel publishes it after the others).
	HostErrorCode    = 0
	HostErrorDetail  = 1
	HostErrorMissing = 2
	HostErrorWords   = 8 // the block's size in words (a p2p channel's error words fit)

	ErrTimeout = 1 // GS_ERR_TIMEOUT: a peer missed a barrier
	ErrConfig  = 2 // GS_ERR_CONFIG: launch shape or parameters out of range

	SyncStart  = 1 // GS_SYNC_START: gs_copy waits for all ranks first
	SyncEnd    = 2 // GS_SYNC_END: gs_copy waits for all ranks at the end
	SyncShares = 4 // GS_SYNC_SHARES: every segment by block shares (a staged move: see gs_copy_run)

	PostNone = 0 // GS_POST_NONE
	PostMul  = 1 // GS_POST_MUL: SUM result * scale (PREMUL_SUM)
	PostDiv  = 2 // GS_POST_DIV: SUM result / scale (AVG)

	SemaSet = 1 // GS_SEMA_SET: the value of a set semaphore (0: clear)

	NVLSOneShot = 1 // GS_NVLS_ONESHOT: reduce all elements into out
	NVLSInPlace = 2 // GS_NVLS_INPLACE: reduce this rank's slice, store it to every rank

	ErrMismatch = 3 // GS_ERR_MISMATCH: a p2p message's size or tag is not the receiver's
	// GS_ERR_PEER_LOST: the abort this rank's host leaves on its own pad
	// and channels when a peer's process exited without destroying the
	// group (gobackend/watchdog.go); the detail is the lost rank.
	ErrPeerLost = 4

	// Point-to-point channels (p2p.cu, p2p.go). Every launch has P2PBlocks
	// blocks whatever the message size, so that a receiver can drain a
	// message of another size in step with its sender. Block b owns
	// P2PSlots slots of the outbox: how far a sender may run ahead.
	P2PBlocks = 16 // GS_P2P_BLOCKS
	P2PSlots  = 4  // GS_P2P_SLOTS
	// Control allocation, in 32-bit words; each per-block word has its own
	// 128-byte line. READY[b] and ACK[b] are written by the peer (release),
	// SENT[b] and RECVD[b] only by this rank; HDR[b][slot] (bytes lo, hi,
	// tag lo, hi) is written by the peer before it releases READY[b]. The
	// error words: code, detail (block << 8 | what), then the first
	// mismatched message's bytes (lo, hi) and tag (lo, hi). GONE is set to
	// 1 by the peer when it leaves the channel (teardown: it will not touch
	// this side's memory again). ABORT is set by this side's own host
	// (detail first: a lost peer, ErrPeerLost): every wait of a kernel of
	// the channel records it as its error and returns, as a pad's abort
	// word does for the collectives.
	P2PLineWords       = 32
	P2PReadyWord       = 0
	P2PAckWord         = P2PReadyWord + P2PBlocks*P2PLineWords
	P2PSentWord        = P2PAckWord + P2PBlocks*P2PLineWords
	P2PRecvdWord       = P2PSentWord + P2PBlocks*P2PLineWords
	P2PHdrWord         = P2PRecvdWord + P2PBlocks*P2PLineWords
	P2PHdrWords        = 4
	P2PErrorWord       = P2PHdrWord + P2PBlocks*P2PSlots*P2PHdrWords
	P2PErrorWords      = 6
	P2PGoneWord        = P2PErrorWord + 8
	P2PAbortWord       = P2PGoneWord + 1
	P2PAbortDetailWord = P2PGoneWord + 2
	P2PCtrlBytes       = 16384 // one side's control allocation
)

const (
	padErrorEnd         = PadAbortDetailWord + 1 // one past the error words, the host pointer and the abort words
	padUsedWords        = PadRelaySeenWord + MaxRanks*MaxBlocks
	defaultReduceBlocks = 24 // PyTorch's one-shot limit (register-heavy kernels)
	defaultCopyBlocks   = 32
	vectorBytes         = 16

	paramsHeaderComment  = "// Code generated by gobackend/internal/cuda (params.go); DO NOT EDIT.\n"
	paramsHeaderRefresh  = "// Refresh with: go test ./gobackend/internal/cuda -run TestParamsHeader -update\n"
	paramsHeaderFileName = "params.cuh"
)

// Compile-time checks: each conversion fails to compile if it goes negative.
const (
	_ = uint(PadBytes - 4*padUsedWords) // a pad holds its layout
	_ = uint(1024 - BlockThreads)       // a block has at most 1024 threads
	_ = uint(BlockThreads - 32)         // and a warp at least, for the barrier
	_ = uint(32 - MaxRanks)             // a barrier uses one thread per peer
	// The host pointer comes after the error words, 8-byte aligned.
	_ = uint(PadHostErrorWord - PadErrorMissingWord - 1)
	_ = uint(0 - PadHostErrorWord%2)
	_ = uint(PadAbortWord - PadHostErrorWord - 2)
	// The semaphores come after the error words, whole, 64-byte aligned.
	_ = uint(PadSemaReadyWord - padErrorEnd)
	_ = uint(PadSemaDoneWord - PadSemaReadyWord - MaxRanks)
	_ = uint(0 - PadSemaReadyWord%16)
	// A thread of gs_ll owns LLLines/LLThreads lines; the sequence
	// words follow the semaphores.
	_ = uint(0 - LLLines%LLThreads)
	_ = uint(BlockThreads - LLThreads)
	_ = uint(PadLLSeqWord - PadSemaDoneWord - MaxRanks)
	// A gs_a2av detail has room for its block and peer.
	_ = uint(256 - A2AVBlocks)
	_ = uint(A2AVDetail - LLWaitDetail*2)
	_ = uint(RelayDetail - SigDetail*2)
	// The p2p control words fit their allocation.
	_ = uint(P2PGoneWord - P2PErrorWord - P2PErrorWords)
	_ = uint(HostErrorWords - P2PErrorWords)
	_ = uint(P2PCtrlBytes - 4*(P2PAbortDetailWord+1))
)

// headerConsts are the #defines of params.cuh, in order.
var headerConsts = []struct {
	name  string
	value int
}{
	{"GS_MAX_RANKS", MaxRanks},
	{"GS_MAX_BLOCKS", MaxBlocks},
	{"GS_MAX_SEGS", MaxSegs},
	{"GS_PAD_BYTES", PadBytes},
	{"GS_PAD_FLAGS", PadFlagsWord},
	{"GS_PAD_COUNTERS", PadCountersWord},
	{"GS_PAD_ERROR", PadErrorWord},
	{"GS_PAD_ERROR_DETAIL", PadErrorDetailWord},
	{"GS_PAD_ERROR_MISSING", PadErrorMissingWord},
	{"GS_PAD_HOST_ERROR", PadHostErrorWord},
	{"GS_PAD_ABORT", PadAbortWord},
	{"GS_PAD_ABORT_DETAIL", PadAbortDetailWord},
	{"GS_HOST_ERROR_CODE", HostErrorCode},
	{"GS_HOST_ERROR_DETAIL", HostErrorDetail},
	{"GS_HOST_ERROR_MISSING", HostErrorMissing},
	{"GS_PAD_SEMA_READY", PadSemaReadyWord},
	{"GS_PAD_SEMA_DONE", PadSemaDoneWord},
	{"GS_PAD_LL_SEQ", PadLLSeqWord},
	{"GS_LL_BLOCKS", LLBlocks},
	{"GS_LL_LINES", LLLines},
	{"GS_LL_THREADS", LLThreads},
	{"GS_LL_WAIT", LLWaitDetail},
	{"GS_PAD_USED", padUsedWords},
	{"GS_ERR_TIMEOUT", ErrTimeout},
	{"GS_ERR_CONFIG", ErrConfig},
	{"GS_SYNC_START", SyncStart},
	{"GS_SYNC_END", SyncEnd},
	{"GS_SYNC_SHARES", SyncShares},
	{"GS_POST_NONE", PostNone},
	{"GS_POST_MUL", PostMul},
	{"GS_POST_DIV", PostDiv},
	{"GS_SEMA_SET", SemaSet},
	{"GS_NVLS_ONESHOT", NVLSOneShot},
	{"GS_NVLS_INPLACE", NVLSInPlace},
	{"GS_BLOCK_THREADS", BlockThreads},
	{"GS_ERR_MISMATCH", ErrMismatch},
	{"GS_ERR_PEER_LOST", ErrPeerLost},
	{"GS_P2P_BLOCKS", P2PBlocks},
	{"GS_P2P_SLOTS", P2PSlots},
	{"GS_P2P_LINE", P2PLineWords},
	{"GS_P2P_READY", P2PReadyWord},
	{"GS_P2P_ACK", P2PAckWord},
	{"GS_P2P_SENT", P2PSentWord},
	{"GS_P2P_RECVD", P2PRecvdWord},
	{"GS_P2P_HDR", P2PHdrWord},
	{"GS_P2P_HDR_WORDS", P2PHdrWords},
	{"GS_P2P_ERROR", P2PErrorWord},
	{"GS_P2P_ERROR_WORDS", P2PErrorWords},
	{"GS_P2P_GONE", P2PGoneWord},
	{"GS_P2P_ABORT", P2PAbortWord},
	{"GS_P2P_ABORT_DETAIL", P2PAbortDetailWord},
	{"GS_P2P_CTRL_BYTES", P2PCtrlBytes},
	{"GS_A2AV_BLOCKS", A2AVBlocks},
	{"GS_A2AV_SLOTS", A2AVSlots},
	{"GS_A2AV_SELF_MAX", A2AVSelfBlocksMax},
	{"GS_PAD_A2AV_READY", PadA2AVReadyWord},
	{"GS_PAD_A2AV_ACK", PadA2AVAckWord},
	{"GS_PAD_A2AV_SENT", PadA2AVSentWord},
	{"GS_PAD_A2AV_RECVD", PadA2AVRecvdWord},
	{"GS_PAD_A2AV_HDR", PadA2AVHdrWord},
	{"GS_A2AV_DETAIL", A2AVDetail},
	{"GS_A2AV_WAIT_SLOT", A2AVWaitSlot},
	{"GS_A2AV_WAIT_DATA", A2AVWaitData},
	{"GS_A2AV_MISMATCH", A2AVMismatch},
	{"GS_PAD_RELAY_PROG", PadRelayProgWord},
	{"GS_PAD_RELAY_SEEN", PadRelaySeenWord},
	{"GS_RELAY_DETAIL", RelayDetail},
}

// ARParams is the one parameter of the all-reduce kernels (gs_ar_params).
// gs_oneshot_*: out[i] = op over r of peers[r][src_offset+i], i < numel,
// folded in rank order, so every rank computes identical bits; with
// src_offset = rank*numel it is the pull half of a reduce-scatter.
// gs_ll_*: out = op over every rank's in, by lines sent into Peers, the
// ranks' LL areas (LLAreaBytes each), with no barrier (LLGrid's shape).
// gs_twoshot_*: in place on the peers' buffers at src_offset; each rank
// reduces its 1/world slice and writes the result into every peer's buffer.
// gs_arpush_*: two-shot's op whose reduce-scatter half pushes: each rank
// stores slice q of its buffer into rank q's staging (Stages[q]), which
// folds it locally, in rounds of at most Slot elements a slice (a multiple
// of 16 bytes; a staging holds World slots of Slot elements and 16 bytes).
// Peers and Pads are the local addresses of every rank's buffer and signal
// pad (index = rank); entries at and past World are ignored.
type ARParams struct {
	Peers     [MaxRanks]uintptr `cuda:"peers,const void *,GS_MAX_RANKS"`
	Pads      [MaxRanks]uintptr `cuda:"pads,unsigned int *,GS_MAX_RANKS"`
	Stages    [MaxRanks]uintptr `cuda:"stages,void *,GS_MAX_RANKS"` // gs_arpush: every rank's staging
	Slot      uint64            `cuda:"slot,unsigned long long"`    // gs_arpush: elements of a slice per round, at most
	Out       uintptr           `cuda:"out,void *"`
	In        uintptr           `cuda:"in,const void *"` // one-shot: stage this first (0: staged already)
	Numel     uint64            `cuda:"numel,unsigned long long"`
	SrcOffset uint64            `cuda:"src_offset,unsigned long long"` // in elements
	// With In: 0 stages In at SrcOffset; else In holds World pieces
	// InStride elements apart (reduce_scatter), piece q staged at q*StageStride.
	InStride    uint64  `cuda:"in_stride,unsigned long long"`
	StageStride uint64  `cuda:"stage_stride,unsigned long long"`
	TimeoutNs   uint64  `cuda:"timeout_ns,unsigned long long"` // 0: wait forever
	Scale       float64 `cuda:"scale,double"`                  // float64's factor; float accumulators round it to float
	Post        int32   `cuda:"post,int"`                      // PostNone, PostMul or PostDiv
	World       int32   `cuda:"world,int"`
	Rank        int32   `cuda:"rank,int"`
}

// CopyParams is the parameter of gs_copy: Bytes[i] bytes from Src[i] to
// Dst[i] for i < NSeg, optionally fenced by barriers (Sync) so that a rank
// may pull from peers' buffers (all-gather, all-to-all).
type CopyParams struct {
	Dst       [MaxSegs]uintptr  `cuda:"dst,void *,GS_MAX_SEGS"`
	Src       [MaxSegs]uintptr  `cuda:"src,const void *,GS_MAX_SEGS"`
	Bytes     [MaxSegs]uint64   `cuda:"bytes,unsigned long long,GS_MAX_SEGS"`
	Pads      [MaxRanks]uintptr `cuda:"pads,unsigned int *,GS_MAX_RANKS"`
	TimeoutNs uint64            `cuda:"timeout_ns,unsigned long long"`
	NSeg      int32             `cuda:"nseg,int"`
	NPre      int32             `cuda:"npre,int"` // the first NPre segments stage before the start barrier
	World     int32             `cuda:"world,int"`
	Rank      int32             `cuda:"rank,int"`
	Sync      int32             `cuda:"sync,int"` // SyncStart | SyncEnd | SyncShares
}

// StepsParams is the parameter of gs_copy_steps: a gs_copy launched before
// its parameters exist. Each block waits until the word Head[0] reaches
// Want (cyclic compare; Pad's abort word and TimeoutNs end the wait, the
// timeout recorded on Pad), then runs the Head[1] gs_copy steps at Steps
// (CopyParams each) one after another. Head and Steps may be pinned host
// memory written with plain stores (the count and the steps before the
// word), so that whoever releases the launch makes no driver call: a module
// load or a free elsewhere in the process waits for the launch while
// holding the lock every driver call takes (docs/ARCHITECTURE.md,
// "Deferred ops").
type StepsParams struct {
	Head      uintptr `cuda:"head,unsigned int *"`
	Steps     uintptr `cuda:"steps,const void *"`
	Pad       uintptr `cuda:"pad,unsigned int *"`
	TimeoutNs uint64  `cuda:"timeout_ns,unsigned long long"` // 0: wait forever
	Want      uint32  `cuda:"want,unsigned int"`
	Max       int32   `cuda:"max,int"` // how many steps Steps holds: a larger count is refused
}

// LLMoveParams is the parameter of gs_llmove: every rank sends Bytes bytes
// from Src[q] to each peer q as LL lines into q's LL area (Areas[q], mapped
// here) and writes what each peer q sent into Dst[q]. Src[q] == 0 sends q
// only the handshake line; Dst[q] == 0 expects only q's handshake; rank q's
// Src[r] must be set exactly when rank r's Dst[q] is. Src[Rank] is copied
// to Dst[Rank] locally.
type LLMoveParams struct {
	Areas     [MaxRanks]uintptr `cuda:"areas,void *,GS_MAX_RANKS"`
	Pads      [MaxRanks]uintptr `cuda:"pads,unsigned int *,GS_MAX_RANKS"`
	Src       [MaxRanks]uintptr `cuda:"src,const void *,GS_MAX_RANKS"`
	Dst       [MaxRanks]uintptr `cuda:"dst,void *,GS_MAX_RANKS"`
	Bytes     uint64            `cuda:"bytes,unsigned long long"` // per segment, at most LLMaxBytes
	TimeoutNs uint64            `cuda:"timeout_ns,unsigned long long"`
	World     int32             `cuda:"world,int"`
	Rank      int32             `cuda:"rank,int"`
}

// A2AVParams is the parameter of gs_a2av: an all_to_all(v) paced pair by
// pair, with no barrier of all ranks and no agreement on the host. This
// rank sends Send[q] bytes from Src[q] to each rank q and expects Recv[q]
// bytes from q into Dst[q]; its own piece is copied locally. A staging
// has a region of Region bytes for each other rank, in rank order
// (A2AVRegion). The piece for q passes through this rank's region for q
// (Stages[Rank]), cut into NB blocks × A2AVSlots slots of SlotBytes; q
// pulls it from there (Stages[Rank] mapped on q). With Push, it passes
// through q's region for this rank instead: this rank stores it there,
// q copies it out. Every rank must use the same NB,
// SlotBytes and Push (checked at setup); the grid
// has 2*(World-1)*NB pair blocks, then at least one block for the local
// copy (A2AVGrid).
type A2AVParams struct {
	Src       [MaxRanks]uintptr `cuda:"src,const void *,GS_MAX_RANKS"`
	Dst       [MaxRanks]uintptr `cuda:"dst,void *,GS_MAX_RANKS"`
	Send      [MaxRanks]uint64  `cuda:"send,unsigned long long,GS_MAX_RANKS"`
	Recv      [MaxRanks]uint64  `cuda:"recv,unsigned long long,GS_MAX_RANKS"`
	Stages    [MaxRanks]uintptr `cuda:"stages,void *,GS_MAX_RANKS"`
	Pads      [MaxRanks]uintptr `cuda:"pads,unsigned int *,GS_MAX_RANKS"`
	Region    uint64            `cuda:"region,unsigned long long"`     // a multiple of 16
	SlotBytes uint64            `cuda:"slot_bytes,unsigned long long"` // a multiple of 16, NB*A2AVSlots*SlotBytes <= Region
	TimeoutNs uint64            `cuda:"timeout_ns,unsigned long long"` // 0: wait forever
	NB        int32             `cuda:"nb,int"`                        // blocks per pair and direction, 1..A2AVBlocks
	World     int32             `cuda:"world,int"`
	Rank      int32             `cuda:"rank,int"`
	Push      int32             `cuda:"push,int"` // 1: through region Rank of the receiver's staging (see gs_a2av)
}

// RelayParams is the parameter of gs_bcast_relay, a broadcast of Bytes
// from the root's Src by scatter and relay: the world-1 other ranks each
// pull one chunk from the root into their own output (Outs[Rank]) slice by
// slice, and pull every other non-root's chunk from that rank's output as
// soon as its slices are there (PadRelayProgWord). The root sends each
// byte once and every rank receives it once, as on a pipelined ring.
// Blocks blocks per chunk (the grid is Blocks*(World-1), the same on
// every rank); Step bytes per slice (a multiple of 16). Outs[q] is rank
// q's output mapped here; Src the root's input mapped here. With Push set
// a non-root stores each piece it pulls from the root into every other
// non-root's output as well as its own (the whole grid on its own chunk,
// no per-slice flags): stores cross the switch without a round trip,
// where the relay's loads wait for their replies.
type RelayParams struct {
	Outs      [MaxRanks]uintptr `cuda:"outs,void *,GS_MAX_RANKS"`
	Pads      [MaxRanks]uintptr `cuda:"pads,unsigned int *,GS_MAX_RANKS"`
	Src       uintptr           `cuda:"src,const void *"`
	Bytes     uint64            `cuda:"bytes,unsigned long long"`
	Step      uint64            `cuda:"step,unsigned long long"`
	TimeoutNs uint64            `cuda:"timeout_ns,unsigned long long"`
	World     int32             `cuda:"world,int"`
	Rank      int32             `cuda:"rank,int"`
	Root      int32             `cuda:"root,int"`
	Blocks    int32             `cuda:"blocks,int"`
	Push      int32             `cuda:"push,int"`
}

// BarrierParams is the parameter of gs_barrier (one block of 32 threads).
type BarrierParams struct {
	Pads      [MaxRanks]uintptr `cuda:"pads,unsigned int *,GS_MAX_RANKS"`
	TimeoutNs uint64            `cuda:"timeout_ns,unsigned long long"`
	World     int32             `cuda:"world,int"`
	Rank      int32             `cuda:"rank,int"`
}

// SemaParams is the parameter of gs_sema_wait (one block of 32 threads):
// wait until every rank r in Mask has set semaphore Word+r of Pad (this
// rank's pad), then consume it; a rank that does not within TimeoutNs is
// named in the pad's error words.
type SemaParams struct {
	Pad       uintptr `cuda:"pad,unsigned int *"`
	TimeoutNs uint64  `cuda:"timeout_ns,unsigned long long"` // 0: wait forever
	Word      int32   `cuda:"word,int"`                      // PadSemaReadyWord or PadSemaDoneWord
	Mask      uint32  `cuda:"mask,unsigned int"`             // bit r: wait for rank r
}

// NVLSParams is the parameter of the multimem kernels of nvls.cu. Mc is
// the multicast address of element 0 (every rank's copy of it); Out this
// rank's output for NVLSOneShot (ignored in place); Pad, if set, receives
// configuration errors.
type NVLSParams struct {
	Mc    uintptr `cuda:"mc,void *"`
	Out   uintptr `cuda:"out,void *"`
	Pad   uintptr `cuda:"pad,unsigned int *"`
	Numel uint64  `cuda:"numel,unsigned long long"`
	Mode  int32   `cuda:"mode,int"` // NVLSOneShot or NVLSInPlace
	World int32   `cuda:"world,int"`
	Rank  int32   `cuda:"rank,int"`
}

// P2PParams is the parameter of gs_p2p_send and gs_p2p_recv (p2p.cu):
// one message of Bytes bytes over one direction of a channel. Send copies
// Buf into this rank's outbox Box and signals the peer's control PeerCtrl;
// recv copies the peer's outbox (Box, mapped here) into Buf and acknowledges
// into PeerCtrl. Ctrl is this rank's control allocation. The message is cut
// into rounds of SlotBytes per block; both sides must use the same grid
// and SlotBytes (the channel's, agreed at setup).
type P2PParams struct {
	Buf       uintptr `cuda:"buf,void *"`
	Ctrl      uintptr `cuda:"ctrl,unsigned int *"`
	PeerCtrl  uintptr `cuda:"peer_ctrl,unsigned int *"`
	Box       uintptr `cuda:"box,void *"`
	Bytes     uint64  `cuda:"bytes,unsigned long long"`
	Tag       int64   `cuda:"tag,long long"`
	SlotBytes uint64  `cuda:"slot_bytes,unsigned long long"` // a multiple of 16
	TimeoutNs uint64  `cuda:"timeout_ns,unsigned long long"` // 0: wait forever
	HostErr   uintptr `cuda:"host_err,unsigned int *"`       // pinned copy of the first error (0: none)
}

// Struct is the C layout of a kernel parameter struct, derived from the Go
// type's cuda tags with the C rules of LP64.
type Struct struct {
	Name   string // C struct name
	GoType reflect.Type
	Fields []StructField
	Size   uintptr
	Align  uintptr
}

// StructField is one member of a Struct.
type StructField struct {
	Name    string // C name
	CType   string
	Len     int    // 0 for a scalar
	LenName string // the #define that sizes the array
	Offset  uintptr
	GoName  string
}

// cTypes maps the C spellings allowed in tags to size (= alignment) and the
// Go kinds that may carry them.
var cTypes = map[string]struct {
	size  uintptr
	kinds []reflect.Kind
}{
	"void *":             {8, []reflect.Kind{reflect.Uintptr}},
	"const void *":       {8, []reflect.Kind{reflect.Uintptr}},
	"unsigned int *":     {8, []reflect.Kind{reflect.Uintptr}},
	"unsigned long long": {8, []reflect.Kind{reflect.Uint64}},
	"long long":          {8, []reflect.Kind{reflect.Int64}},
	"int":                {4, []reflect.Kind{reflect.Int32}},
	"unsigned int":       {4, []reflect.Kind{reflect.Uint32}},
	"float":              {4, []reflect.Kind{reflect.Float32}},
	"double":             {8, []reflect.Kind{reflect.Float64}},
}

// constValue resolves a length name of a tag against headerConsts.
func constValue(name string) (int, bool) {
	for _, c := range headerConsts {
		if c.name == name {
			return c.value, true
		}
	}
	return 0, false
}

// layoutOf builds the Struct of a tagged Go struct type and checks that Go
// lays it out exactly as C does, so its bytes can be handed to the driver.
func layoutOf(cname string, t reflect.Type) (*Struct, error) {
	s := &Struct{Name: cname, GoType: t, Align: 1}
	var off uintptr
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := strings.Split(f.Tag.Get("cuda"), ",")
		if len(tag) < 2 || len(tag) > 3 {
			return nil, fmt.Errorf("%s.%s: bad cuda tag %q", t.Name(), f.Name, f.Tag.Get("cuda"))
		}
		ct, ok := cTypes[tag[1]]
		if !ok {
			return nil, fmt.Errorf("%s.%s: unknown C type %q", t.Name(), f.Name, tag[1])
		}
		sf := StructField{Name: tag[0], CType: tag[1], GoName: f.Name}
		elem := f.Type
		if len(tag) == 3 {
			n, ok := constValue(tag[2])
			if !ok {
				return nil, fmt.Errorf("%s.%s: unknown length %q", t.Name(), f.Name, tag[2])
			}
			if elem.Kind() != reflect.Array || elem.Len() != n {
				return nil, fmt.Errorf("%s.%s: Go type %s is not an array of %s = %d", t.Name(),
					f.Name, elem, tag[2], n)
			}
			sf.Len, sf.LenName, elem = n, tag[2], elem.Elem()
		}
		if !kindIn(elem.Kind(), ct.kinds) || elem.Size() != ct.size {
			return nil, fmt.Errorf("%s.%s: Go type %s cannot carry C %s", t.Name(), f.Name, elem, tag[1])
		}
		off = alignUp(off, ct.size)
		sf.Offset = off
		if off != f.Offset {
			return nil, fmt.Errorf("%s.%s: C offset %d, Go offset %d", t.Name(), f.Name, off, f.Offset)
		}
		off += ct.size * uintptr(max(sf.Len, 1))
		s.Align = max(s.Align, ct.size)
		s.Fields = append(s.Fields, sf)
	}
	s.Size = alignUp(off, s.Align)
	if s.Size != t.Size() {
		return nil, fmt.Errorf("%s: C size %d, Go size %d", t.Name(), s.Size, t.Size())
	}
	return s, nil
}

func kindIn(k reflect.Kind, ks []reflect.Kind) bool {
	for _, x := range ks {
		if k == x {
			return true
		}
	}
	return false
}

func alignUp(v, a uintptr) uintptr { return (v + a - 1) / a * a }

func mustLayout(cname string, v any) *Struct {
	s, err := layoutOf(cname, reflect.TypeOf(v))
	if err != nil {
		panic(err)
	}
	return s
}

// The parameter structs of the kernels, in the order params.cuh declares them.
var (
	arLayout      = mustLayout("gs_ar_params", ARParams{})
	copyLayout    = mustLayout("gs_copy_params", CopyParams{})
	barrierLayout = mustLayout("gs_barrier_params", BarrierParams{})
	semaLayout    = mustLayout("gs_sema_params", SemaParams{})
	nvlsLayout    = mustLayout("gs_nvls_params", NVLSParams{})
	p2pLayout     = mustLayout("gs_p2p_params", P2PParams{})
	llMoveLayout  = mustLayout("gs_llmove_params", LLMoveParams{})
	a2avLayout    = mustLayout("gs_a2av_params", A2AVParams{})
	relayLayout   = mustLayout("gs_relay_params", RelayParams{})
	stepsLayout   = mustLayout("gs_steps_params", StepsParams{})
	paramStructs  = []*Struct{arLayout, copyLayout, barrierLayout, semaLayout, nvlsLayout, p2pLayout, llMoveLayout,
		a2avLayout, relayLayout, stepsLayout}
)

// C renders the struct declaration, with offsets as comments.
func (s *Struct) C() string {
	var b strings.Builder
	fmt.Fprintf(&b, "struct %s { // %d bytes, Go: %s\n", s.Name, s.Size, s.GoType)
	for _, f := range s.Fields {
		decl := f.CType
		if !strings.HasSuffix(decl, "*") {
			decl += " "
		}
		decl += f.Name
		if f.Len > 0 {
			decl += "[" + f.LenName + "]"
		}
		fmt.Fprintf(&b, "\t%-40s // offset %d\n", decl+";", f.Offset)
	}
	b.WriteString("};\n")
	return b.String()
}

// ParamsHeader is the text of kernels/params.cuh.
func ParamsHeader() string {
	var b strings.Builder
	b.WriteString(paramsHeaderComment + paramsHeaderRefresh)
	b.WriteString("// Limits, signal pad layout, codes and kernel parameter structs shared by\n")
	b.WriteString("// the kernels and the Go side; the Go declarations are the source.\n")
	b.WriteString("#ifndef GOSYM_PARAMS_CUH\n#define GOSYM_PARAMS_CUH\n\n")
	for _, c := range headerConsts {
		fmt.Fprintf(&b, "#define %s %s\n", c.name, strconv.Itoa(c.value))
	}
	for _, s := range paramStructs {
		b.WriteString("\n" + s.C())
	}
	b.WriteString("\n#endif // GOSYM_PARAMS_CUH\n")
	return b.String()
}
