// Runs gs_copy_steps of copy.cu on the host (see emu.h): every rank's launch
// starts before its steps exist, and a host thread publishes them later with
// plain stores (the count and the steps, then the word), as the collective
// queue's worker will for a deferred op. Checked bit for bit: all_gathers at
// worlds 1 to 4, in one direct step (each rank pulls its peers' inputs) and
// staged in several steps (each rank stages a chunk of its input, then pulls
// its peers' stagings), several launches back to back on one group's pads
// with the word about to wrap; a word never written (the timeout recorded,
// nothing written), a count above the launch's maximum (refused, nothing
// written) and an abort left on the pad (the wait gives up). Every block of
// every rank runs at once, the threads of each as OS threads (a real
// __syncthreads), since the steps' barriers wait across ranks.
// Prints one line per failure and a final "N passed, M failed" line.
#include "copy.cu"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "emu_check.h"

static std::mt19937_64 rng(777);
static const unsigned kBlock = 32, kGrid = 3;

// What one rank's launch reads: the word and count (head), and its steps.
struct Slot {
	unsigned head[2] = {0, 0};
	std::vector<gs_copy_params> steps;
	explicit Slot(int max) : steps(max) {}
};

struct Group {
	int world;
	std::vector<std::vector<unsigned>> pads;
	explicit Group(int w) : world(w), pads(w, std::vector<unsigned>(GS_PAD_BYTES / 4, 0)) {}
	std::string errors() {
		std::string s;
		for (int r = 0; r < world; ++r)
			if (pads[r][GS_PAD_ERROR])
				s += " rank" + std::to_string(r) + ":err=" + std::to_string(pads[r][GS_PAD_ERROR]) +
				     "/" + std::to_string(pads[r][GS_PAD_ERROR_DETAIL]);
		return s;
	}
	gs_copy_params base(int r) {
		gs_copy_params p;
		memset(&p, 0, sizeof p);
		for (int q = 0; q < world; ++q)
			p.pads[q] = pads[q].data();
		p.world = world;
		p.rank = r;
		p.sync = GS_SYNC_START | GS_SYNC_END;
		return p;
	}
};

// Launches gs_copy_steps on every rank at once (a thread that returns when
// every block ended), then, after delay, runs publish() on this thread.
template <class Publish>
static void launch_then_publish(Group &g, std::vector<std::unique_ptr<Slot>> &slots, unsigned want,
                                unsigned long long timeout_ns, int max, Publish publish,
                                int delay_ms = 20) {
	std::vector<gs_steps_params> ps(g.world);
	for (int r = 0; r < g.world; ++r)
		ps[r] = {slots[r]->head, slots[r]->steps.data(), g.pads[r].data(), timeout_ns, want, max};
	std::thread run([&] { emu_launch_threads(gs_copy_steps, ps.data(), ps.size(), kGrid, kBlock); });
	std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
	publish();
	run.join();
}

// Publishes n steps on slot s for value want: steps and count first, then
// the word (release: what the kernel reads after seeing the word is there).
static void publish(Slot &s, const std::vector<gs_copy_params> &steps, unsigned want) {
	for (size_t i = 0; i < steps.size(); ++i)
		s.steps[i] = steps[i];
	__atomic_store_n(&s.head[1], (unsigned)steps.size(), __ATOMIC_RELEASE);
	__atomic_store_n(&s.head[0], want, __ATOMIC_RELEASE);
}

// An all_gather of n bytes per rank, direct (chunk == 0: one step pulling
// the peers' inputs) or staged in chunks of `chunk` bytes (a step each:
// stage the chunk, pull the peers' stagings).
static void all_gather(int world, size_t n, size_t chunk, unsigned want, size_t mis) {
	Group g(world);
	std::vector<std::unique_ptr<Buf>> in, out, stage;
	std::vector<std::unique_ptr<Slot>> slots;
	const size_t steps = chunk ? (n + chunk - 1) / chunk : 1;
	for (int r = 0; r < world; ++r) {
		in.emplace_back(new Buf(n, mis));
		for (size_t i = 0; i < n; ++i)
			in[r]->data()[i] = (unsigned char)rng();
		out.emplace_back(new Buf(n * world, (mis + 3) % 16));
		stage.emplace_back(new Buf(chunk ? chunk : 1, 0));
		slots.emplace_back(new Slot((int)steps + 1));
		slots[r]->head[0] = want - 1; // the previous op's value
	}
	for (int round = 0; round < 2; ++round, ++want) {
		launch_then_publish(g, slots, want, 0, (int)steps + 1, [&] {
			for (int r = 0; r < world; ++r) {
				std::vector<gs_copy_params> ps;
				for (size_t c = 0; c < steps; ++c) {
					gs_copy_params p = g.base(r);
					// every staged step the same length (the last one starts earlier and
					// copies some bytes again): a block's share of a segment depends on
					// its length alone, so block b of every rank stages into and pulls
					// from the same range of a staging at every step, and block b's
					// barriers alone order its reuse (gs_copy_steps)
					const size_t len = chunk ? std::min(chunk, n) : n;
					const size_t at = chunk ? std::min(c * chunk, n - len) : 0;
					int k = 0;
					if (chunk) {
						p.dst[k] = stage[r]->data();
						p.src[k] = in[r]->data() + at;
						p.bytes[k++] = len;
						p.npre = 1;
					}
					for (int q = 0; q < world; ++q) {
						p.dst[k] = out[r]->data() + q * n + at;
						p.src[k] = chunk && q != r ? stage[q]->data() : in[q]->data() + at;
						p.bytes[k++] = len;
					}
					p.nseg = k;
					ps.push_back(p);
				}
				publish(*slots[r], ps, want);
			}
		});
		std::string what = "all_gather world " + std::to_string(world) + " n " + std::to_string(n) +
		                   " chunk " + std::to_string(chunk) + " want " + std::to_string(want) +
		                   " round " + std::to_string(round);
		bool ok = g.errors().empty();
		for (int r = 0; r < world && ok; ++r) {
			ok = out[r]->guards_intact();
			for (int q = 0; q < world && ok; ++q)
				ok = !memcmp(out[r]->data() + q * n, in[q]->data(), n);
		}
		if (!ok)
			fail(what + g.errors());
		else
			passed++;
		for (int r = 0; r < world; ++r) { // fresh data and poison for the next round
			for (size_t i = 0; i < n; ++i)
				in[r]->data()[i] = (unsigned char)rng();
			memset(out[r]->data(), kPoison, n * world);
		}
	}
}

// A launch whose steps never come (timeout), or come with too many steps
// (refused), or whose pad carries an abort: it ends, records the error,
// and writes nothing.
static void refusals(int world) {
	for (int c = 0; c < 3; ++c) {
		Group g(world);
		std::vector<std::unique_ptr<Slot>> slots;
		std::vector<std::unique_ptr<Buf>> in, out;
		for (int r = 0; r < world; ++r) {
			slots.emplace_back(new Slot(1));
			in.emplace_back(new Buf(64, 0));
			out.emplace_back(new Buf(64, 0));
		}
		const unsigned want = 5;
		const unsigned long long timeout = c == 0 ? 30000000ull : 0ull; // 30 ms
		launch_then_publish(g, slots, want, timeout, 1, [&] {
			for (int r = 0; r < world; ++r) {
				if (c == 1) { // two steps where the launch holds one
					gs_copy_params p = g.base(r);
					p.dst[0] = out[r]->data();
					p.src[0] = in[r]->data();
					p.bytes[0] = 64;
					p.nseg = 1;
					slots[r]->steps[0] = p;
					__atomic_store_n(&slots[r]->head[1], 2u, __ATOMIC_RELEASE);
					__atomic_store_n(&slots[r]->head[0], want, __ATOMIC_RELEASE);
				} else if (c == 2) { // a host's abort (a lost peer) ends the wait
					__atomic_store_n(&g.pads[r][GS_PAD_ABORT_DETAIL], 7u, __ATOMIC_RELEASE);
					__atomic_store_n(&g.pads[r][GS_PAD_ABORT], (unsigned)GS_ERR_PEER_LOST, __ATOMIC_RELEASE);
				}
			}
		}, c == 0 ? 0 : 20);
		const unsigned want_err[] = {GS_ERR_TIMEOUT, GS_ERR_CONFIG, GS_ERR_PEER_LOST};
		bool ok = true;
		for (int r = 0; r < world; ++r)
			ok = ok && g.pads[r][GS_PAD_ERROR] == want_err[c] && out[r]->untouched();
		const char *names[] = {"timeout", "count above max", "abort"};
		if (!ok)
			fail(std::string("refusal ") + names[c] + " world " + std::to_string(world) + g.errors());
		else
			passed++;
	}
}

int main() {
	for (int world = 1; world <= 4; ++world) {
		for (size_t n : {1, 33, 4096, 10007})
			all_gather(world, n, 0, 1, (size_t)world % 4);
		all_gather(world, 10007, 4096, 0xfffffffeu, 1); // three steps; the word wraps
		all_gather(world, 4096, 4096, 7, 0);
		all_gather(world, 5000, 777, 100, 2); // seven steps of odd length
		refusals(world);
	}
	printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
