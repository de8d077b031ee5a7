// Bookkeeping shared by the emulation programs (emu_main.cpp, emu_p2p.cpp):
// the CUDA built-in variables emu.h declares, the pass/fail counts, and
// guarded buffers.
#ifndef GOSYM_EMU_CHECK_H
#define GOSYM_EMU_CHECK_H

#include <cstdio>
#include <memory>
#include <string>
#include <chrono>
#include <thread>
#include <vector>

thread_local gs_emu_dim3 threadIdx, blockIdx, blockDim, gridDim;

static int passed, failed;

static void fail(const std::string &what) {
	if (failed < 50)
		fprintf(stderr, "FAIL %s\n", what.c_str());
	failed++;
}

static const size_t kGuard = 64;
static const unsigned char kPoison = 0xab;

// A buffer whose data starts `mis` bytes past a 16-byte boundary, with
// guard bytes on both sides (kPoison, like every byte not yet written) to
// catch stray writes.
struct Buf {
	std::vector<unsigned char> mem;
	size_t off, len;
	Buf(size_t len_, size_t mis) : mem(len_ + 2 * kGuard + 32, kPoison), len(len_) {
		uintptr_t base = (uintptr_t)mem.data() + kGuard;
		off = ((base + 15) & ~(uintptr_t)15) - (uintptr_t)mem.data() + mis;
	}
	unsigned char *data() { return mem.data() + off; }
	bool guards_intact() const {
		for (size_t i = 0; i < mem.size(); ++i)
			if ((i < off || i >= off + len) && mem[i] != kPoison)
				return false;
		return true;
	}
	bool untouched() const {
		for (unsigned char c : mem)
			if (c != kPoison)
				return false;
		return true;
	}
};

// One launch of k on each of n ranks at once (ps[0..n)): every block of
// every rank at once, the threads of each block as OS threads of one
// emulated block (a real __syncthreads), for kernels whose blocks wait on
// other ranks' blocks mid-launch. late(r, b): rank r's block b starts 50 ms
// after the others (a GPU that runs it later: another process's turn).
template <class P>
static void emu_launch_threads(void (*k)(P), const P *ps, size_t n, unsigned grid, unsigned block,
                               bool (*late)(size_t, unsigned) = nullptr) {
	std::vector<std::unique_ptr<gs_emu_block>> blks;
	std::vector<std::thread> th;
	th.reserve(n * grid * block);
	for (size_t r = 0; r < n; ++r)
		for (unsigned b = 0; b < grid; ++b) {
			blks.emplace_back(new gs_emu_block);
			gs_emu_block *blk = blks.back().get();
			blk->n = block;
			const P *p = ps + r;
			for (unsigned t = 0; t < block; ++t)
				th.emplace_back([k, p, blk, grid, block, b, t, slow = late && late(r, b)] {
					if (slow)
						std::this_thread::sleep_for(std::chrono::milliseconds(50));
					gridDim = {grid, 1, 1};
					blockDim = {block, 1, 1};
					blockIdx = {b, 0, 0};
					threadIdx = {t, 0, 0};
					gs_emu_blk = blk;
					k(*p);
				});
		}
	for (auto &x : th)
		x.join();
}

#endif // GOSYM_EMU_CHECK_H
