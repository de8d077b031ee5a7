// Runs gs_arpush of allreduce.cu on the host (see emu.h) and checks it bit
// for bit against gs_twoshot on the same inputs (emu_main.cpp checks
// two-shot against a reference; both fold in rank order, so they must
// agree exactly), plus an independent check of float and integer sums.
// Its blocks wait on the same blocks of the other ranks after each push,
// and a block's threads must all have pushed before the barrier lets a
// peer fold, so every block of every rank runs at once, the threads of
// each as OS threads with a real __syncthreads. Stagings and pads are host
// memory shared by the emulated ranks, standing in for the peer mappings.
// Prints one line per failure and a final "N passed, M failed" line.
#include "allreduce.cu"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "emu_check.h"

static std::mt19937_64 rng(4242);
static const unsigned kBlock = 32;

typedef void (*ArKernel)(gs_ar_params);

// One launch on every rank at once (emu_launch_threads).
static void launch(ArKernel k, const std::vector<gs_ar_params> &ps, unsigned grid) {
	emu_launch_threads(k, ps.data(), ps.size(), grid, kBlock);
}

struct Group {
	int world;
	std::vector<std::vector<unsigned>> pads;
	std::vector<std::unique_ptr<Buf>> stages;
	size_t stage_bytes;
	Group(int w, size_t stage) : world(w), pads(w, std::vector<unsigned>(GS_PAD_BYTES / 4, 0)), stage_bytes(stage) {
		for (int r = 0; r < w; ++r)
			stages.emplace_back(new Buf(stage, 0));
	}
	std::string errors() {
		std::string s;
		for (int r = 0; r < world; ++r)
			if (pads[r][GS_PAD_ERROR])
				s += " rank" + std::to_string(r) + ":err=" + std::to_string(pads[r][GS_PAD_ERROR]);
		return s;
	}
};

struct Kind {
	const char *name;
	size_t es;
	ArKernel push, two;
	int check; // 0: none beyond two-shot; 1: float sum; 2: int32 sum
};

static const Kind kinds[] = {
    {"f32 sum", 4, gs_arpush_f32_sum, gs_twoshot_f32_sum, 1},
    {"i32 sum", 4, gs_arpush_i32_sum, gs_twoshot_i32_sum, 2},
    {"bf16 sum", 2, gs_arpush_bf16_sum, gs_twoshot_bf16_sum, 0},
    {"f16 max", 2, gs_arpush_f16_max, gs_twoshot_f16_max, 0},
    {"i32 prod", 4, gs_arpush_i32_prod, gs_twoshot_i32_prod, 0},
    {"i8 sum", 1, gs_arpush_i8_sum, gs_twoshot_i8_sum, 0},
    {"f64 min", 8, gs_arpush_f64_min, gs_twoshot_f64_min, 0},
    {"u8 max", 1, gs_arpush_u8_max, gs_twoshot_u8_max, 0},
};

// Random bytes that make finite values of every type: small floats (their
// bit patterns for the narrow types come from the kernels' own types).
static void fill(const Kind &k, unsigned char *p, size_t n) {
	for (size_t i = 0; i < n; ++i) {
		unsigned char *e = p + i * k.es;
		if (k.check == 1 || !strcmp(k.name, "f64 min")) {
			const double v = (double)(int)(rng() % 64) / 8.0 - 4.0;
			if (k.es == 4) {
				const float f = (float)v;
				memcpy(e, &f, 4);
			} else
				memcpy(e, &v, 8);
		} else if (k.es == 2) { // bf16 / f16: a small float's top or half bits, sign and small exponent
			const unsigned short h = (unsigned short)(0x3c00u | (rng() % 0x300u) | (rng() % 2 ? 0x8000u : 0u));
			memcpy(e, &h, 2);
		} else {
			const uint64_t x = rng();
			memcpy(e, &x, k.es);
		}
	}
}

// slot: gs_arpush's most elements of a slice per round; mis[r]: rank r's
// buffer phase (bytes, a multiple of es); calls: ops back to back on the
// group (the barrier counters carry over).
static void arpush_case(const Kind &k, Group &g, size_t n, size_t slot, const std::vector<size_t> &mis,
                        unsigned grid, int post) {
	const int W = g.world;
	char name[256];
	snprintf(name, sizeof name, "arpush %s world=%d n=%zu slot=%zu mis0=%zu mis1=%zu grid=%u post=%d", k.name, W, n,
	         slot, mis[0], mis[W > 1 ? 1 : 0], grid, post);
	std::vector<Buf> a, b;
	for (int r = 0; r < W; ++r) {
		a.emplace_back(n * k.es, mis[r]);
		fill(k, a.back().data(), n);
		b.emplace_back(n * k.es, mis[r]);
		memcpy(b.back().data(), a.back().data(), n * k.es);
	}
	std::vector<std::vector<unsigned char>> orig;
	for (auto &x : a)
		orig.emplace_back(x.data(), x.data() + n * k.es);
	const double scale = post == GS_POST_DIV ? (double)W : 0.375;
	std::vector<gs_ar_params> pa(W), pb(W);
	for (int r = 0; r < W; ++r) {
		for (auto *ps : {&pa, &pb}) {
			gs_ar_params &p = (*ps)[r];
			memset(&p, 0, sizeof p);
			for (int q = 0; q < W; ++q) {
				p.peers[q] = (ps == &pa ? a : b)[q].data();
				p.pads[q] = g.pads[q].data();
				p.stages[q] = g.stages[q]->data();
			}
			p.slot = slot;
			p.numel = n;
			p.timeout_ns = 5000000000ull;
			p.scale = scale;
			p.post = post;
			p.world = W;
			p.rank = r;
		}
	}
	launch(k.push, pa, grid);
	launch(k.two, pb, grid);
	std::string err = g.errors();
	if (!err.empty())
		return fail(std::string(name) + ": pad errors" + err);
	for (int r = 0; r < W; ++r) {
		if (!a[r].guards_intact() || !g.stages[r]->guards_intact())
			return fail(std::string(name) + ": write outside rank " + std::to_string(r) + "'s buffer or staging");
		for (size_t i = 0; i < n; ++i)
			if (memcmp(a[r].data() + i * k.es, b[r].data() + i * k.es, k.es) != 0)
				return fail(std::string(name) + ": rank " + std::to_string(r) + " element " + std::to_string(i) +
				            " differs from two-shot's");
		for (size_t i = 0; i < n && post == GS_POST_NONE && k.check; ++i) {
			if (k.check == 1) { // float: rank order, in float
				float acc = 0, got;
				for (int q = 0; q < W; ++q) {
					float v;
					memcpy(&v, orig[q].data() + i * 4, 4);
					acc = q == 0 ? v : acc + v;
				}
				memcpy(&got, a[r].data() + i * 4, 4);
				if (got != acc)
					return fail(std::string(name) + ": rank " + std::to_string(r) + " element " +
					            std::to_string(i) + " is not the sum");
			} else { // int32: wrap-around
				uint32_t acc = 0, got;
				for (int q = 0; q < W; ++q) {
					uint32_t v;
					memcpy(&v, orig[q].data() + i * 4, 4);
					acc += v;
				}
				memcpy(&got, a[r].data() + i * 4, 4);
				if (got != acc)
					return fail(std::string(name) + ": rank " + std::to_string(r) + " element " +
					            std::to_string(i) + " is not the sum");
			}
		}
	}
	passed++;
}

// A slot that is not a whole number of 16-byte vectors, or that gives a
// block less than one, is refused with a config error and nothing written.
static void config_case(size_t slot, unsigned grid) {
	Group g(2, 4096);
	std::vector<Buf> a;
	for (int r = 0; r < 2; ++r)
		a.emplace_back(64, 0);
	std::vector<gs_ar_params> ps(2);
	for (int r = 0; r < 2; ++r) {
		gs_ar_params &p = ps[r];
		memset(&p, 0, sizeof p);
		for (int q = 0; q < 2; ++q) {
			p.peers[q] = a[q].data();
			p.pads[q] = g.pads[q].data();
			p.stages[q] = g.stages[q]->data();
		}
		p.slot = slot; // f32: 4 elements a vector
		p.numel = 16;
		p.timeout_ns = 1000000000ull;
		p.world = 2;
		p.rank = r;
	}
	launch(gs_arpush_f32_sum, ps, grid);
	if (g.pads[0][GS_PAD_ERROR] != GS_ERR_CONFIG || !a[0].untouched() || !a[1].untouched())
		return fail("arpush config slot=" + std::to_string(slot) + " grid=" + std::to_string(grid) +
		            ": error " + std::to_string(g.pads[0][GS_PAD_ERROR]));
	passed++;
}

int main() {
	const int worlds[] = {1, 2, 3, 4, 5, 8};
	const size_t sizes[] = {0, 1, 7, 16, 33, 1000, 4097};
	for (int world : worlds) {
		Group g(world, 1 << 16);
		for (const Kind &k : kinds)
			for (int c = 0; c < 4; ++c) {
				const size_t N = 16 / k.es;
				const size_t n = sizes[rng() % (sizeof sizes / sizeof sizes[0])];
				// slots from one vector (many rounds) to what the staging holds
				const unsigned grid = 1 + (unsigned)(rng() % 3);
				const size_t most = (g.stage_bytes / world - 16) / 16 * 16 / k.es;
				// one vector a block (many rounds), a slot the grid does not divide, the staging
				const size_t slots[] = {grid * N, 3 * grid * N + N, 64 * N, most};
				const size_t slot = slots[c];
				std::vector<size_t> mis(world, 0);
				switch (c) {
				case 1: { // the same phase everywhere: a scalar head, vectors, a tail
					const size_t m = (rng() % N) * k.es;
					for (auto &x : mis)
						x = m;
					break;
				}
				case 2: // phases that differ: the fold goes element by element
					for (int r = 0; r < world; ++r)
						mis[r] = (r % 2) * k.es;
					break;
				}
				int post = GS_POST_NONE;
				if (k.check == 1 && c == 3)
					post = rng() % 2 ? GS_POST_DIV : GS_POST_MUL;
				arpush_case(k, g, n, slot, mis, grid, post);
			}
		// one larger op on the vector path, many rounds
		arpush_case(kinds[2], g, 20011, 128, std::vector<size_t>(world, 0), 3, GS_POST_NONE);
	}
	config_case(6, 1);
	config_case(4, 2);
	printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
