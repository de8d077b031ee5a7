// Package gpu is the CUDA data plane of an endpoint: its state (state.go)
// and settings (config.go), this process's devices and their kernels
// (device.go), the group's symmetric GPU buffers (team.go) and their setup
// (plane.go), the collectives (ops.go, direct.go, sema.go), registered
// memory (reg.go, pages.go, mem.go), the order of ops across streams
// (order.go) and send/recv over a channel per pair of ranks (p2p.go,
// p2p_setup.go, p2p_close.go). It reaches its endpoint only through Group
// and Peers (plane.go) and, for send/recv, P2PLink (p2p.go); all ops are
// stream-ordered on the caller's stream.
//
// The first CUDA op of a group sets it up on every rank (collectives run in
// the same order everywhere, so every rank reaches that op): each rank
// allocates two VMM buffers, control (its signal pad) and data (staging),
// sends their POSIX fds to every peer over the authenticated links and maps
// theirs; a host barrier then confirms that every rank succeeded. If one did not, every rank fails
// CUDA ops on that group with the same NotSupported error from then on, and
// the host data plane keeps working.
//
// An op only enqueues work on the caller's stream (ops.go). The
// host never waits for the GPU, so the Work completes as soon as the work is
// enqueued and the stream carries the ordering, as with NCCL; the same
// enqueue sequence is what a CUDA graph captures.
package gpu
