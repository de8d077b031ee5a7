// Host emulation of the CUDA builtins the kernels use, force-included
// (g++ -include) by TestHostEmulation. Ranks run as OS threads, the
// blocks and threads of a rank one after another; the barrier's flags use
// real atomics, so the protocol (counters, cyclic compare, timeouts) is
// exercised for real, while __syncthreads degenerates to nothing. A program
// may instead run a block's threads as OS threads of their own (gs_emu_blk
// set for each): __syncthreads is then a real barrier of the block.
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <thread>

#define GS_EMULATION 1
#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __grid_constant__
// A block's threads of one rank run on one OS thread, one after another.
#define __shared__ static thread_local

struct gs_emu_dim3 {
	unsigned x, y, z;
};
extern thread_local gs_emu_dim3 threadIdx, blockIdx, blockDim, gridDim;

// The block a thread runs in when a block's threads are OS threads.
struct gs_emu_block {
	std::mutex mu;
	std::condition_variable cv;
	unsigned n = 0, arrived = 0, gen = 0;
	int any = 0, result = 0;
};
inline thread_local gs_emu_block *gs_emu_blk = nullptr;

// A barrier of the block that ORs p over its threads (no-op without one).
inline int gs_emu_sync(int p) {
	gs_emu_block *k = gs_emu_blk;
	if (!k)
		return p;
	std::unique_lock<std::mutex> l(k->mu);
	const unsigned gen = k->gen;
	k->any |= p;
	if (++k->arrived == k->n) {
		k->result = k->any;
		k->any = 0;
		k->arrived = 0;
		k->gen++;
		k->cv.notify_all();
		return k->result;
	}
	k->cv.wait(l, [&] { return k->gen != gen; });
	return k->result;
}
inline void __syncthreads() { gs_emu_sync(0); }
inline int __syncthreads_or(int p) { return gs_emu_sync(p); }
inline void __threadfence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline unsigned atomicCAS(unsigned *p, unsigned cmp, unsigned v) {
	__atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
	return cmp;
}
inline unsigned atomicExch(unsigned *p, unsigned v) {
	return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST);
}
inline unsigned atomicOr(unsigned *p, unsigned v) {
	return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST);
}
inline float __uint_as_float(unsigned u) {
	float f;
	memcpy(&f, &u, 4);
	return f;
}
inline unsigned __float_as_uint(float f) {
	unsigned u;
	memcpy(&u, &f, 4);
	return u;
}
inline unsigned long long gs_emu_globaltimer() {
	timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}
inline void gs_emu_spin() { std::this_thread::yield(); }
// Multicast (nvls.cu): rank r's copy of the byte at multicast address mc,
// and how many ranks are bound; defined by the program that includes emu.h.
char *gs_emu_mc_peer(const void *mc, int r);
int gs_emu_mc_world(const void *mc);
