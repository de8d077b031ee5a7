package gpu

// The CUDA data plane's settings, read when a group sets it up.

import (
	"encoding/binary"
	"fmt"

	"github.com/gosym/gosym/gobackend/internal/config"
	"github.com/gosym/gosym/gobackend/internal/cuda"
)

// Config holds the CUDA data plane's tunables, read when a group sets
// it up. Every rank must read the same values: they decide launch shapes.
type Config struct {
	stageBytes int // GOSYM_GPU_STAGE_BYTES: one rank's staging; larger ops run in chunks
	twoShotMin int // GOSYM_GPU_TWOSHOT_MIN: chunks of at least this many bytes run two-shot
	bigBlocks  int // GOSYM_GPU_BLOCKS: block limit of chunks of at least twoShotMin bytes (bandwidth-bound)
	ceMin      int // GOSYM_GPU_CE_MIN: data-movement chunks of at least this many bytes use the copy engines
	copyBlocks int // GOSYM_GPU_COPY_BLOCKS: block limit of gs_copy (chunks below ceMin)
	// GOSYM_GPU_DIRECT_CE_MIN: data movement on the direct path uses the
	// copy engines from this many bytes, gs_copy with bigBlocks below
	directCEMin int
	// GOSYM_GPU_CE_OVERLAP_MIN: copy-engine moves from this many bytes (the
	// longest piece) run the local piece on a second stream (overlap.go);
	// by measurement (choice.go), off where none was made
	ceOverlapMin knob
	directMin    int // GOSYM_GPU_DIRECT_MIN: ops of at least this many bytes per rank use the peers' buffers
	// GOSYM_GPU_MOVE_DIRECT_MIN: the same for broadcast and all_gather,
	// which read one buffer per peer and save a whole staging copy
	moveDirectMin int
	// GOSYM_GPU_A2AV_DIRECT_MIN: the same for all_to_all whose splits
	// differ, which agrees on them on the host anyway, so reading in
	// place costs it one round less than it costs the others
	a2avDirectMin int
	// GOSYM_GPU_RELAY_MIN, GOSYM_GPU_RELAY_BLOCKS, GOSYM_GPU_RELAY_SLICE:
	// broadcast by scatter and relay (gs_bcast_relay) at three ranks or
	// more, on the direct path
	relayMin, relaySlice int
	relayBlocks          knob // by measurement (choice.go)
	// GOSYM_GPU_RS_DIRECT_MIN: directMin for reduce_scatter, by
	// measurement (choice.go; rsDirectMin)
	rsDirectMin knob
	arPush      bool // GOSYM_GPU_AR_PUSH: all_reduce on the direct path runs gs_arpush
	relayPush   bool // GOSYM_GPU_RELAY_PUSH: the relay's push mode
	deferOps    bool // GOSYM_GPU_DEFER: ops with host rounds run off the caller's thread (defer.go)
	// GOSYM_GPU_CAPTURE_DIRECT_MIN: the same for all_reduce and
	// reduce_scatter while the stream is captured into a CUDA graph
	captureDirectMin int
	regMin           int // GOSYM_GPU_REG_DIRECT_MIN: directMin for ops on registered (mem_map'ed) buffers
	semaMin          int // GOSYM_GPU_SEMA_MIN: reductions of at least this many bytes use the semaphore protocol
	fuseMax          int // GOSYM_GPU_FUSE_MAX: one-shot chunks of at most this many bytes stage inside the kernel, outside graph capture
	llMax            int // GOSYM_GPU_LL_MAX: all_reduce of at most this many bytes runs the LL kernel (0: never)
	// GOSYM_GPU_A2AV_BLOCKS: blocks per pair and direction of gs_a2av, the
	// all_to_all of splits that differ between ranks with no host round
	// (0, the default where unmeasured: agree on the splits on the host, which
	// reads large pieces in place), by measurement per world
	// and GPU (a2avKnob; a team's a2avBlocks is its value there, capped by
	// residency: newTeam); GOSYM_GPU_A2AV_SLOT_BYTES: its slot. Checked
	// equal on every rank at setup (a pair's chunks depend on both).
	a2avBlocks, a2avSlot int
	a2avKnob             knob
	// GOSYM_GPU_A2A_PACED_MIN: equal-split all_to_all from this many bytes
	// of input per rank runs gs_a2av too (pacedAllToAll), by measurement
	// (choice.go); a team's a2aPacedMin is its value there, shared like
	// a2avBlocks (ranks that disagreed would part ways)
	a2aPacedKnob knob
	a2aPacedMin  int
	a2avPush     bool // GOSYM_GPU_A2AV_PUSH: gs_a2av's senders store over the link (agreed as a setting)
}

func ConfigFromEnv() Config {
	return Config{
		stageBytes: config.GPUStageBytes.Get(),
		twoShotMin: config.GPUTwoShotMin.Get(),
		bigBlocks:  config.GPUBlocks.Or(cuda.MaxBlocks),
		ceMin:      config.GPUCEMin.Get(),
		copyBlocks: config.GPUCopyBlocks.Get(),
		// Measured on 2×H200 (docs/DECISIONS.md):
		// gs_copy wins at 16 MiB, the copy engines from 64 MiB.
		directCEMin:  config.GPUDirectCEMin.Get(),
		ceOverlapMin: knobOf(config.GPUCEOverlapMin),
		directMin:    config.GPUDirectMin.Get(),
		// Measured on 2×H200: direct wins at 4 MiB (docs/DECISIONS.md).
		moveDirectMin: config.GPUMoveDirectMin.Get(),
		// Measured on 2×H200: direct wins from 4 MiB, not at 1 MiB
		// (docs/DECISIONS.md).
		a2avDirectMin: config.GPUA2AVDirectMin.Get(),
		relayMin:      config.GPURelayMin.Get(),
		relayBlocks:   knobOf(config.GPURelayBlocks),
		relaySlice:    config.GPURelaySlice.Get(),
		relayPush:     config.GPURelayPush.On(),
		rsDirectMin:   knobOf(config.GPURSDirectMin),
		arPush:        config.GPUARPush.On(),
		deferOps:      config.GPUDefer.On(),
		// Measured on 2×H200: see docs/DECISIONS.md.
		captureDirectMin: config.GPUCaptureDirectMin.Get(),
		regMin:           config.GPURegDirectMin.Get(),
		semaMin:          config.GPUSemaMin.Get(),
		fuseMax:          config.GPUFuseMax.Get(),
		// Measured on 2×H200: LL wins to 256 KiB (docs/DECISIONS.md).
		llMax: min(config.GPULLMax.Get(), cuda.LLMaxBytes),
		// By measurement (docs/DECISIONS.md); a2avBlocks is newTeam's, by world and GPU.
		a2avKnob: knobOf(config.GPUA2AVBlocks),
		a2avSlot: config.GPUA2AVSlotBytes.Get(),
		// By measurement (docs/DECISIONS.md); a2aPacedMin is newTeam's.
		a2aPacedKnob: knobOf(config.GPUA2APacedMin),
		a2avPush:     config.GPUA2AVPush.On(),
	}
}

// shared is what of cfg every rank of a group must have the same, as
// setup announces it: gs_a2av's shape (its pairs pace each other).
func (c Config) shared() []byte {
	b := make([]byte, sharedBytes)
	binary.LittleEndian.PutUint64(b, uint64(c.a2avBlocks))
	binary.LittleEndian.PutUint64(b[8:], uint64(c.a2avSlot))
	binary.LittleEndian.PutUint64(b[16:], uint64(c.a2aPacedMin))
	return b
}

// sharedBytes is the length of shared().
const sharedBytes = 24

// sharedMismatch explains a peer's announcement of shared() that differs
// from this rank's.
func (c Config) sharedMismatch(r int, theirs []byte) error {
	if len(theirs) == sharedBytes && string(theirs) == string(c.shared()) {
		return nil
	}
	if len(theirs) != sharedBytes {
		return fmt.Errorf("rank %d announced %d bytes of settings, this rank %d (another gosym version?)", r, len(theirs), sharedBytes)
	}
	le := binary.LittleEndian
	return fmt.Errorf("rank %d runs GOSYM_GPU_A2AV_BLOCKS=%d, GOSYM_GPU_A2AV_SLOT_BYTES=%d and GOSYM_GPU_A2A_PACED_MIN=%d, this rank %d, %d and %d (every rank must use the same; the blocks are capped by what each GPU holds resident, and where unset both are measured per world and GPU)",
		r, le.Uint64(theirs), le.Uint64(theirs[8:]), le.Uint64(theirs[16:]), c.a2avBlocks, c.a2avSlot, c.a2aPacedMin)
}

// a2avResident is the blocks per pair of gs_a2av for a wish of want, in
// a group of world ranks, on a GPU that holds resident blocks of it at
// once: a pair block waits for its peer's, so every pair block of a
// launch must be resident, or the launch waits out the group's timeout.
// (A GPU of another model on another rank may hold fewer: setup's
// announcement of shared() then fails, naming the rank.)
func a2avResident(want, world, resident int) (int, error) {
	fit := resident / (2 * (world - 1))
	if fit < 1 {
		return 0, fmt.Errorf("gosym: the paced all_to_all (GOSYM_GPU_A2AV_BLOCKS) needs at least %d blocks of %d threads resident at once for %d ranks; this GPU holds %d: unset GOSYM_GPU_A2AV_BLOCKS",
			2*(world-1), cuda.BlockThreads, world, resident)
	}
	return min(want, fit), nil
}
