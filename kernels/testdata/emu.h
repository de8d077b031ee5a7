// Host emulation of the CUDA builtins the kernels use, force-included
// (g++ -include) by TestHostEmulation. Ranks run as OS threads, the
// blocks and threads of a rank one after another; the barrier's flags use
// real atomics, so the protocol (counters, cyclic compare, timeouts) is
// exercised for real, while __syncthreads degenerates to nothing.
#include <atomic>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <thread>

#define GS_EMULATION 1
#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(n)

struct gs_emu_dim3 {
	unsigned x, y, z;
};
extern thread_local gs_emu_dim3 threadIdx, blockIdx, blockDim, gridDim;

inline void __syncthreads() {}
inline int __syncthreads_or(int p) { return p; }
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
