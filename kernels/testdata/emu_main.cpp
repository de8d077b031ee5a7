// Runs the kernels of allreduce.cu, copy.cu and nvls.cu on the host (see
// emu.h; multicast is emulated by mapping addresses to every rank's copy) over
// randomised cases and checks every output element, bit for bit, against a
// reference written independently of the kernels. Prints one line per
// failure and a final "N passed, M failed" line; exits non-zero on failure.
#include "allreduce.cu"
#include "copy.cu"
#include "nvls.cu"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "emu_check.h"

template <class P> static void run_rank(void (*k)(P), const P &p, unsigned grid, unsigned block) {
	gridDim = {grid, 1, 1};
	blockDim = {block, 1, 1};
	for (unsigned b = 0; b < grid; ++b)
		for (unsigned t = 0; t < block; ++t) {
			blockIdx = {b, 0, 0};
			threadIdx = {t, 0, 0};
			k(p);
		}
}

// Every rank in its own thread, as every GPU runs its own copy; rank r
// with grids[r] blocks (0: the rank never runs).
template <class P>
static void run_ranks(void (*k)(P), const std::vector<P> &ps, const std::vector<unsigned> &grids,
                      unsigned block) {
	std::vector<std::thread> th;
	for (size_t r = 0; r < ps.size(); ++r)
		th.emplace_back([&, r] { run_rank(k, ps[r], grids[r], block); });
	for (auto &t : th)
		t.join();
}

template <class P>
static void run_all(void (*k)(P), const std::vector<P> &ps, unsigned grid, unsigned block) {
	run_ranks(k, ps, std::vector<unsigned>(ps.size(), grid), block);
}

// ---- reference ----------------------------------------------------------------

enum DT { F32, F16, BF16, I32, I64, F64, I8, U8, F8E4M3, F8E5M2, NDT };
enum OP { SUM, PROD, MIN, MAX, NOP };
#define DT_NAME(t, T) #t,
static const char *dt_name[] = {GS_AR_TYPES(DT_NAME)}; // the kernels' order: DT's
static const char *op_name[] = {"sum", "prod", "min", "max"};
#define DT_SIZE(t, T) sizeof(T::S),
static const size_t dt_size[] = {GS_AR_TYPES(DT_SIZE)};
static bool is_float(DT dt) { return dt == F32 || dt == F16 || dt == BF16 || dt == F64 || dt == F8E4M3 || dt == F8E5M2; }
static bool is_f8(DT dt) { return dt == F8E4M3 || dt == F8E5M2; }

typedef void (*ArKernel)(gs_ar_params);
#define ROW(a, t) {gs_##a##_##t##_sum, gs_##a##_##t##_prod, gs_##a##_##t##_min, gs_##a##_##t##_max}
#define ROW_ONESHOT(t, T) ROW(oneshot, t),
#define ROW_TWOSHOT(t, T) ROW(twoshot, t),
#define ROW_PULL(t, T) ROW(pull, t),
#define ROW_LL(t, T) ROW(ll, t),
enum ALGO { ONESHOT, TWOSHOT, PULL, NALGO };
static const char *algo_name[] = {"oneshot", "twoshot", "pull"};
static const ArKernel ll_kernels[][NOP] = {GS_AR_TYPES(ROW_LL)};
static const ArKernel kernels[NALGO][NDT][NOP] = {
    {GS_AR_TYPES(ROW_ONESHOT)}, {GS_AR_TYPES(ROW_TWOSHOT)}, {GS_AR_TYPES(ROW_PULL)}};
static_assert(sizeof ll_kernels / sizeof ll_kernels[0] == NDT, "DT lists every type of GS_AR_TYPES");

static float f16_to_f32(uint16_t h) {
	_Float16 x;
	memcpy(&x, &h, 2);
	return (float)x;
}
static uint16_t f32_to_f16(float f) {
	_Float16 x = (_Float16)f; // GCC rounds to nearest even
	uint16_t h;
	memcpy(&h, &x, 2);
	return h;
}
static float bf16_to_f32(uint16_t b) {
	uint32_t u = (uint32_t)b << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}
// Nearest of the two bf16 neighbours, ties to even, decided in double.
static uint16_t f32_to_bf16(float f) {
	uint32_t u;
	memcpy(&u, &f, 4);
	if (std::isnan(f))
		return (uint16_t)((u >> 16) | 0x40);
	uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
	float flo, fhi;
	memcpy(&flo, &lo, 4);
	memcpy(&fhi, &hi, 4);
	double dlo = std::fabs((double)f - flo), dhi = std::isinf(fhi) && !std::isinf(f) ?
	                                                     std::fabs((double)f - flo) * 2 + 1 :
	                                                     std::fabs((double)f - fhi);
	if (lo == u)
		return (uint16_t)(u >> 16);
	if (dlo < dhi || (dlo == dhi && ((lo >> 16) & 1) == 0))
		return (uint16_t)(lo >> 16);
	return (uint16_t)(hi >> 16);
}

// fp8 from its fields (OCP FP8: e4m3fn has no infinity and one NaN
// magnitude, e5m2 is IEEE-like).
static double f8_to_d(uint8_t b, DT dt) {
	const bool e5 = dt == F8E5M2;
	const int M = e5 ? 2 : 3, B = e5 ? 15 : 7;
	const int e = (b & 0x7f) >> M, m = b & ((1 << M) - 1);
	double v;
	if (!e5 && (b & 0x7f) == 0x7f)
		v = NAN;
	else if (e5 && e == 31)
		v = m ? NAN : INFINITY;
	else if (e == 0)
		v = std::ldexp(m, 1 - B - M);
	else
		v = std::ldexp((1 << M) + m, e - B - M);
	return b & 0x80 ? -v : v;
}
// The nearest finite fp8 by search, ties to the even code, saturating at
// the largest finite value (NCCL's __NV_SATFINITE); NaN stays NaN.
static uint8_t d_to_f8(double x, DT dt) {
	if (std::isnan(x))
		return 0x7f;
	const uint8_t sign = std::signbit(x) ? 0x80 : 0, maxc = dt == F8E5M2 ? 0x7b : 0x7e;
	const double a = std::fabs(x);
	if (a >= f8_to_d(maxc, dt))
		return sign | maxc;
	uint8_t best = 0;
	double bestd = a;
	for (int c = 1; c <= maxc; ++c) {
		const double d = std::fabs(f8_to_d((uint8_t)c, dt) - a);
		if (d < bestd || (d == bestd && (c & 1) == 0)) {
			best = (uint8_t)c;
			bestd = d;
		}
	}
	return sign | best;
}

struct Val { // one element, as the reference sees it
	double f;      // floats (exact float values)
	int64_t i;     // integers
};

static Val load(DT dt, const unsigned char *p) {
	Val v{0, 0};
	switch (dt) {
	case F32: {
		float f;
		memcpy(&f, p, 4);
		v.f = f;
		break;
	}
	case F64:
		memcpy(&v.f, p, 8);
		break;
	case F16: {
		uint16_t h;
		memcpy(&h, p, 2);
		v.f = f16_to_f32(h);
		break;
	}
	case BF16: {
		uint16_t h;
		memcpy(&h, p, 2);
		v.f = bf16_to_f32(h);
		break;
	}
	case F8E4M3:
	case F8E5M2:
		v.f = f8_to_d(*p, dt);
		break;
	case I32: {
		int32_t x;
		memcpy(&x, p, 4);
		v.i = x;
		break;
	}
	case I8:
		v.i = (int8_t)*p;
		break;
	case U8:
		v.i = *p;
		break;
	default:
		memcpy(&v.i, p, 8);
	}
	return v;
}

template <class F> static F fold_f(OP op, F a, F b) {
	switch (op) {
	case SUM:
		return a + b;
	case PROD:
		return a * b;
	case MIN:
		if (std::isnan(a))
			return a;
		if (std::isnan(b))
			return b;
		return b < a ? b : a;
	default:
		if (std::isnan(a))
			return a;
		if (std::isnan(b))
			return b;
		return b > a ? b : a;
	}
}

static int64_t fold_i(DT dt, OP op, int64_t a, int64_t b) {
	uint64_t ua = (uint64_t)a, ub = (uint64_t)b;
	int64_t r;
	switch (op) {
	case SUM:
		r = (int64_t)(ua + ub);
		break;
	case PROD:
		r = (int64_t)(ua * ub);
		break;
	case MIN:
		r = b < a ? b : a;
		break;
	default:
		r = b > a ? b : a;
	}
	switch (dt) {
	case I32:
		return (int32_t)(uint32_t)(uint64_t)r;
	case I8:
		return (int8_t)(uint8_t)(uint64_t)r;
	case U8:
		return (uint8_t)(uint64_t)r;
	default:
		return r;
	}
}

// Element i of the result, encoded: folded in rank order in the
// accumulator (double for f64, float for the other floats, the type for
// integers), scaled there, rounded once.
static void reference(DT dt, OP op, int post, double scale, const std::vector<const unsigned char *> &src,
                      size_t i, unsigned char *out) {
	size_t es = dt_size[dt];
	if (!is_float(dt)) {
		int64_t acc = load(dt, src[0] + i * es).i;
		for (size_t r = 1; r < src.size(); ++r)
			acc = fold_i(dt, op, acc, load(dt, src[r] + i * es).i);
		memcpy(out, &acc, es); // little-endian: the low bytes
		return;
	}
	if (dt == F64) {
		double acc = load(dt, src[0] + i * es).f;
		for (size_t r = 1; r < src.size(); ++r)
			acc = fold_f(op, acc, load(dt, src[r] + i * es).f);
		if (op == SUM && post == GS_POST_MUL)
			acc = acc * scale;
		if (op == SUM && post == GS_POST_DIV)
			acc = acc / scale;
		memcpy(out, &acc, 8);
		return;
	}
	float acc = (float)load(dt, src[0] + i * es).f;
	for (size_t r = 1; r < src.size(); ++r)
		acc = fold_f(op, acc, (float)load(dt, src[r] + i * es).f);
	if (op == SUM && post == GS_POST_MUL)
		acc = acc * (float)scale;
	if (op == SUM && post == GS_POST_DIV)
		acc = acc / (float)scale;
	if (dt == F32) {
		memcpy(out, &acc, 4);
	} else if (is_f8(dt)) {
		*out = d_to_f8(acc, dt);
	} else {
		uint16_t h = dt == F16 ? f32_to_f16(acc) : f32_to_bf16(acc);
		memcpy(out, &h, 2);
	}
}

static bool same(DT dt, const unsigned char *a, const unsigned char *b) {
	if (memcmp(a, b, dt_size[dt]) == 0)
		return true;
	if (is_float(dt)) // NaN payloads may differ
		return std::isnan(load(dt, a).f) && std::isnan(load(dt, b).f);
	return false;
}

// ---- buffers --------------------------------------------------------------------

struct Pads {
	std::vector<std::vector<unsigned>> p;
	explicit Pads(int world) : p(world, std::vector<unsigned>(GS_PAD_BYTES / 4, 0)) {}
	unsigned *at(int r) { return p[r].data(); }
	std::string errors() {
		std::string s;
		for (size_t r = 0; r < p.size(); ++r)
			if (p[r][GS_PAD_ERROR])
				s += " rank" + std::to_string(r) + ":err=" + std::to_string(p[r][GS_PAD_ERROR]);
		return s;
	}
};

static std::mt19937_64 rng(12345);

// Random elements: integers of every bit pattern; floats near 1 for PROD, else small sums, with NaNs
// when nans; fp8 also with subnormals and values that overflow in a sum.
static void fill(DT dt, OP op, unsigned char *p, size_t n, bool nans) {
	std::uniform_int_distribution<int> small(-8, 8);
	for (size_t i = 0; i < n; ++i) {
		unsigned char *e = p + i * dt_size[dt];
		if (!is_float(dt)) {
			uint64_t x = rng();
			memcpy(e, &x, dt_size[dt]);
			continue;
		}
		float f = op == PROD ? 1.0f + small(rng) / 32.0f : small(rng) / 4.0f + (float)(rng() % 1000) / 997.0f;
		if (nans && rng() % 7 == 0)
			f = NAN;
		if (is_f8(dt) && op != PROD && rng() % 13 == 0)
			f *= rng() % 2 ? 0x1p-12f : dt == F8E5M2 ? 16384.0f : 128.0f;
		if (dt == F32) {
			memcpy(e, &f, 4);
		} else if (dt == F64) {
			const double d = (double)f + (double)(rng() % 1000) * 0x1p-40; // bits past float's
			memcpy(e, &d, 8);
		} else if (is_f8(dt)) {
			*e = d_to_f8(f, dt);
		} else {
			uint16_t h = dt == F16 ? f32_to_f16(f) : f32_to_bf16(f);
			memcpy(e, &h, 2);
		}
	}
}

// ---- cases ----------------------------------------------------------------------

// Whether a run left no pad error and wrote nothing outside its buffers;
// records the failure under name if not.
static bool clean_run(const char *name, Pads &pads, std::vector<Buf> &in, std::vector<Buf> &out) {
	std::string err = pads.errors();
	if (!err.empty()) {
		fail(std::string(name) + ": pad errors" + err);
		return false;
	}
	for (size_t r = 0; r < in.size(); ++r)
		if (!in[r].guards_intact() || !out[r].guards_intact()) {
			fail(std::string(name) + ": write outside a buffer of rank " + std::to_string(r));
			return false;
		}
	return true;
}

// One all-reduce call. mis[r] is rank r's data misalignment in bytes (a
// multiple of the element size), omis that of every out buffer.
static void allreduce_case(int algo, DT dt, OP op, int world, size_t n, const std::vector<size_t> &mis,
                           size_t omis, unsigned grid, unsigned block, int post, bool scatter, Pads &pads) {
	const size_t es = dt_size[dt];
	const size_t total = scatter ? n * world : n; // elements per input buffer
	std::vector<Buf> in, out;
	for (int r = 0; r < world; ++r) {
		in.emplace_back(total * es, mis[r]);
		fill(dt, op, in.back().data(), total, op == MIN || op == MAX);
		out.emplace_back(n * es, omis);
	}
	std::vector<std::vector<unsigned char>> orig;
	for (auto &b : in)
		orig.emplace_back(b.data(), b.data() + total * es);

	// Not emulated: the one-shot kernel's fused staging (p.in). Its block
	// barrier orders every thread's staging writes before any peer reads
	// them (__syncthreads), which this emulation, running a block's threads
	// one after another, cannot do; the GPU suite covers it (tests/jobs/cuda/test_cuda.py).
	std::vector<gs_ar_params> ps(world);
	double scale = post == GS_POST_DIV ? (double)world : 0.375;
	for (int r = 0; r < world; ++r) {
		gs_ar_params &p = ps[r];
		memset(&p, 0, sizeof p);
		for (int q = 0; q < world; ++q) {
			p.peers[q] = in[q].data();
			p.pads[q] = pads.at(q);
		}
		p.out = out[r].data();
		p.numel = n;
		p.src_offset = scatter ? (unsigned long long)r * n : 0;
		p.timeout_ns = 5000000000ull;
		p.scale = scale;
		p.post = post;
		p.world = world;
		p.rank = r;
	}
	run_all(kernels[algo][dt][op], ps, grid, block);

	char name[256];
	snprintf(name, sizeof name, "%s %s %s world=%d n=%zu mis0=%zu omis=%zu grid=%u block=%u post=%d%s",
	         algo_name[algo], dt_name[dt], op_name[op], world, n, mis[0], omis, grid, block,
	         post, scatter ? " scatter" : "");
	if (!clean_run(name, pads, in, out))
		return;
	unsigned char want[8];
	for (int r = 0; r < world; ++r) {
		std::vector<const unsigned char *> src;
		for (int q = 0; q < world; ++q)
			src.push_back(orig[q].data() + (scatter ? r * n * es : 0));
		for (size_t i = 0; i < n; ++i) {
			reference(dt, op, post, scale, src, i, want);
			const unsigned char *got = algo != TWOSHOT ? out[r].data() + i * es : in[r].data() + i * es;
			if (!same(dt, got, want))
				return fail(std::string(name) + ": rank " + std::to_string(r) + " element " +
				            std::to_string(i) + " wrong");
		}
		if (algo != TWOSHOT && total > 0 && memcmp(in[r].data(), orig[r].data(), total * es) != 0)
			return fail(std::string(name) + ": a pulling kernel modified its input");
	}
	passed++;
}

// The LL areas of a group (one per rank, 16-byte aligned) and its pads,
// kept across calls: the launch counters and the two parities carry over,
// from gs_ll to gs_llmove launches too. Launches are queued per rank and
// run at sync() with no host sync between them, as on a GPU stream, so a
// rank may run launches ahead of its peers. seq is what every rank's
// launch counters must say: a launch counts on its blocks alone.
struct LLGroup {
	int world;
	Pads pads;
	std::vector<std::vector<unsigned long long>> area;
	std::vector<unsigned> seq;
	std::vector<std::vector<std::function<void()>>> queued; // per rank
	explicit LLGroup(int w)
	    : world(w), pads(w),
	      area(w, std::vector<unsigned long long>(GS_LL_BLOCKS * 2 * w * GS_LL_LINES * 2, 0)),
	      seq(GS_LL_BLOCKS, 0), queued(w) {}

	template <class P> void launch(void (*k)(P), const std::vector<P> &ps, unsigned grid) {
		for (int r = 0; r < world; ++r)
			queued[r].push_back([k, p = ps[r], grid] { run_rank(k, p, grid, GS_LL_THREADS); });
		for (unsigned b = 0; b < grid; ++b)
			seq[b]++;
	}
	void sync() {
		std::vector<std::thread> th;
		for (int r = 0; r < world; ++r)
			th.emplace_back([this, r] {
				for (auto &f : queued[r])
					f();
			});
		for (auto &t : th)
			t.join();
		for (auto &q : queued)
			q.clear();
	}
	// Whether every rank's pad has counted every block's launches.
	bool counted() {
		for (int r = 0; r < world; ++r)
			for (int b = 0; b < GS_LL_BLOCKS; ++b)
				if (pads.at(r)[GS_PAD_LL_SEQ + b] != seq[b])
					return false;
		return true;
	}
};

// The grid of an LL launch for bytes per segment (cuda.LLGrid).
static unsigned ll_grid(size_t bytes) {
	return (unsigned)std::min<size_t>(std::max<size_t>(((bytes + 7) / 8 + GS_LL_LINES - 1) / GS_LL_LINES, 1),
	                                  GS_LL_BLOCKS);
}

// A call queued on an LLGroup, with what it needs to check its result
// once the group has synced.
struct LLCall {
	std::string name;
	virtual ~LLCall() = default;
	// Records the failure and says false if the result is wrong.
	virtual bool check() = 0;
};

// Runs what is queued on g and checks the calls: one pass or one failure
// for them all.
static void ll_settle(LLGroup &g, const std::vector<std::unique_ptr<LLCall>> &calls) {
	g.sync();
	std::string name = calls[0]->name;
	if (calls.size() > 1)
		name += " and " + std::to_string(calls.size() - 1) + " calls after it";
	const std::string err = g.pads.errors();
	if (!err.empty())
		return fail(name + ": pad errors" + err);
	if (!g.counted())
		return fail(name + ": launch counters wrong");
	for (const auto &c : calls)
		if (!c->check())
			return;
	passed++;
}

// An LL all-reduce of n elements, fresh inputs (misaligned by mis bytes;
// in place when inplace), every output element checked bit for bit. With
// a stride (elements, at least n) it is the LL reduce_scatter: each rank's
// input is world pieces of n elements, stride apart, and rank r gets the
// reduction of every rank's piece r (never in place).
struct ARCall : LLCall {
	DT dt;
	OP op;
	size_t n, stride;
	bool inplace;
	int post;
	double scale;
	std::vector<Buf> in, out;
	std::vector<std::vector<unsigned char>> orig;
	LLGroup &g;

	ARCall(DT dt_, OP op_, size_t n_, size_t mis, bool inplace_, int post_, int call, LLGroup &g_,
	       size_t stride_ = 0)
	    : dt(dt_), op(op_), n(n_), stride(stride_), inplace(inplace_ && !stride_), post(post_),
	      scale(post_ == GS_POST_DIV ? (double)g_.world : 0.375), g(g_) {
		const size_t es = dt_size[dt];
		const int world = g.world;
		const size_t in_n = stride ? world * stride : n;
		for (int r = 0; r < world; ++r) {
			in.emplace_back(in_n * es, mis);
			fill(dt, op, in.back().data(), in_n, op == MIN || op == MAX);
			out.emplace_back(n * es, inplace ? mis : 0);
		}
		for (auto &b : in)
			orig.emplace_back(b.data(), b.data() + in_n * es);
		std::vector<gs_ar_params> ps(world);
		for (int r = 0; r < world; ++r) {
			gs_ar_params &p = ps[r];
			memset(&p, 0, sizeof p);
			for (int q = 0; q < world; ++q) {
				p.peers[q] = g.area[q].data();
				p.pads[q] = g.pads.at(q);
			}
			p.in = in[r].data();
			p.in_stride = stride;
			p.out = inplace ? in[r].data() : out[r].data();
			p.numel = n;
			p.timeout_ns = 5000000000ull;
			p.scale = scale;
			p.post = post;
			p.world = world;
			p.rank = r;
		}
		g.launch(ll_kernels[dt][op], ps, ll_grid(n * es));
		char s[256];
		snprintf(s, sizeof s, "ll %s %s %s world=%d n=%zu stride=%zu mis=%zu%s post=%d call=%d",
		         stride ? "reduce_scatter" : "all_reduce", dt_name[dt], op_name[op], world, n, stride, mis,
		         inplace ? " inplace" : "", post, call);
		name = s;
	}

	bool check() override {
		const size_t es = dt_size[dt];
		if (!clean_run(name.c_str(), g.pads, in, out))
			return false;
		unsigned char want[8];
		for (int r = 0; r < g.world; ++r) {
			std::vector<const unsigned char *> src; // every rank's piece for rank r
			for (auto &o : orig)
				src.push_back(o.data() + (stride ? r * stride * es : 0));
			const unsigned char *res = inplace ? in[r].data() : out[r].data();
			for (size_t i = 0; i < n; ++i) {
				reference(dt, op, post, scale, src, i, want);
				if (!same(dt, res + i * es, want)) {
					fail(name + ": rank " + std::to_string(r) + " element " + std::to_string(i) + " wrong");
					return false;
				}
			}
			if (!inplace && memcmp(in[r].data(), orig[r].data(), orig[r].size()) != 0) {
				fail(name + ": the kernel modified its input");
				return false;
			}
		}
		return true;
	}
};

// calls back-to-back LL all-reduce calls on g (ARCall; reduce_scatter with
// a stride).
static void ll_case(DT dt, OP op, size_t n, size_t mis, bool inplace, int post, int calls, LLGroup &g,
                    size_t stride = 0) {
	std::vector<std::unique_ptr<LLCall>> q;
	for (int c = 0; c < calls; ++c)
		q.emplace_back(new ARCall(dt, op, n, mis, inplace, post, c, g, stride));
	ll_settle(g, q);
}

// Rank 0's parameters for a float sum of in into out in a group of 2.
static gs_ar_params ll_rank0_params(LLGroup &g, std::vector<float> &in, std::vector<float> &out,
                                    unsigned long long timeout_ns) {
	gs_ar_params p;
	memset(&p, 0, sizeof p);
	for (int q = 0; q < 2; ++q) {
		p.peers[q] = g.area[q].data();
		p.pads[q] = g.pads.at(q);
	}
	p.in = in.data();
	p.out = out.data();
	p.numel = in.size();
	p.world = 2;
	p.timeout_ns = timeout_ns;
	return p;
}

// p's exchange as a gs_llmove: in to every rank, every rank's into out.
static gs_llmove_params ll_move_params(const gs_ar_params &p) {
	gs_llmove_params m;
	memset(&m, 0, sizeof m);
	for (int q = 0; q < p.world; ++q) {
		m.areas[q] = (void *)p.peers[q];
		m.pads[q] = p.pads[q];
		m.src[q] = p.in;
		m.dst[q] = p.out;
	}
	m.bytes = p.numel * 4;
	m.timeout_ns = p.timeout_ns;
	m.world = p.world;
	m.rank = p.rank;
	return m;
}

// Launches rank 0 of a 2-rank LL group alone: gs_llmove with p turned
// into its parameters when move, else gs_ll (f32 sum).
static void run_ll_rank0(bool move, const gs_ar_params &p, unsigned grid) {
	if (move)
		run_rank(gs_llmove, ll_move_params(p), grid, GS_LL_THREADS);
	else
		run_rank(gs_ll_f32_sum, p, grid, GS_LL_THREADS);
}

// An LL launch (gs_ll or gs_llmove) whose grid is not LLGrid's for its
// size records a configuration error and touches no line: more blocks than
// the LL area has, a block with no line, too few blocks for the lines, and
// an empty launch.
static void ll_config_case() {
	const size_t per_block = GS_LL_LINES * 2; // floats: 8 bytes a line
	const struct {
		size_t n;
		unsigned grid;
		const char *what;
	} cases[] = {{8, GS_LL_BLOCKS + 1, "a grid past GS_LL_BLOCKS"},
	             {8, 2, "a block with no line"},
	             {per_block + 1, 1, "lines past the grid"},
	             {0, 1, "an empty launch"}};
	for (const auto &c : cases)
		for (bool move : {false, true}) {
			LLGroup g(2);
			std::vector<float> in(c.n, 1.0f), out(c.n + 1, 7.0f);
			const gs_ar_params p = ll_rank0_params(g, in, out, 1000000);
			run_ll_rank0(move, p, c.grid);
			bool untouched = true;
			for (float v : out)
				untouched = untouched && v == 7.0f;
			for (auto &a : g.area)
				for (auto w : a)
					untouched = untouched && w == 0;
			if (g.pads.at(0)[GS_PAD_ERROR] != GS_ERR_CONFIG || !untouched)
				return fail(std::string(move ? "llmove" : "ll") + " config: " + c.what + " was not refused");
		}
	passed++;
}

// A rank whose peer never sends times out with the peer and block named.
static void ll_timeout_case() {
	for (bool move : {false, true}) {
		LLGroup g(2);
		std::vector<float> in(4, 1.0f), out(4, 0.0f);
		const gs_ar_params p = ll_rank0_params(g, in, out, 2000000);
		run_ll_rank0(move, p, 1);
		const unsigned *pad = g.pads.at(0);
		if (pad[GS_PAD_ERROR] != GS_ERR_TIMEOUT || pad[GS_PAD_ERROR_DETAIL] != (GS_LL_WAIT | 1u) ||
		    pad[GS_PAD_ERROR_MISSING] != 2u)
			return fail(std::string(move ? "llmove" : "ll") + " timeout: the missing peer was not recorded");
	}
	passed++;
}

// ---- LL data movement (gs_llmove) ---------------------------------------------------

enum MOVE { BCAST, ALLGATHER, ALLTOALL, GATHER, SCATTER, NMOVE };
static const char *move_name[] = {"broadcast", "all_gather", "all_to_all", "gather", "scatter"};

// Where a segment of a gs_llmove call lies: at byte off of its rank's input
// (IN) or output (OUT); NONE: no segment (a null pointer).
enum { NONE = -1, IN, OUT };
struct Seg {
	int buf;
	size_t off;
};

// A collective as one gs_llmove launch, set up as the backend does
// (gobackend/gpu_ops.go, llMove): for rank r, src[r][q] is what it sends
// rank q and dst[r][q] where what q sends lands. Every rank has an input
// of in_len and an output of out_len bytes (one it does not use must stay
// untouched). In place, the root's or every rank's input is its chunk of
// the output (scatter: the root's output is its chunk of the input).
struct Move {
	MOVE kind;
	int world, root;
	size_t bytes, in_len, out_len;
	bool inplace;
	std::vector<std::vector<Seg>> src, dst;

	Move(MOVE k, int w, int rt, size_t n, bool ip)
	    : kind(k), world(w), root(rt), bytes(n), in_len(k == ALLTOALL || k == SCATTER ? w * n : n),
	      out_len(k == BCAST || k == SCATTER ? n : w * n), inplace(ip),
	      src(w, std::vector<Seg>(w, Seg{NONE, 0})), dst(src) {
		for (int r = 0; r < w; ++r)
			for (int q = 0; q < w; ++q)
				switch (k) {
				case BCAST:
					if (r == rt)
						src[r][q] = {ip ? OUT : IN, 0};
					if (q == rt)
						dst[r][q] = {OUT, 0};
					break;
				case ALLGATHER:
					src[r][q] = ip ? Seg{OUT, r * n} : Seg{IN, 0};
					dst[r][q] = {OUT, q * n};
					break;
				case ALLTOALL:
					src[r][q] = {ip ? OUT : IN, q * n};
					dst[r][q] = {OUT, q * n};
					break;
				case GATHER:
					if (q == rt)
						src[r][q] = ip && r == rt ? Seg{OUT, r * n} : Seg{IN, 0};
					if (r == rt)
						dst[r][q] = {OUT, q * n};
					break;
				default: // SCATTER
					if (r == rt)
						src[r][q] = {IN, q * n};
					if (q == rt)
						dst[r][q] = ip && r == rt ? Seg{IN, r * n} : Seg{OUT, 0};
				}
	}

	std::string name() const {
		char s[160];
		snprintf(s, sizeof s, "llmove %s world=%d root=%d bytes=%zu%s", move_name[kind], world, root, bytes,
		         inplace ? " inplace" : "");
		return s;
	}
};

// The buffers of one gs_llmove call: rank r's input is b[2r], its output
// b[2r+1], misaligned by smis and dmis bytes. Inputs hold random bytes,
// outputs kPoison but where they hold an input (in place).
struct MoveBufs {
	std::vector<Buf> b;
	MoveBufs(const Move &m, size_t smis, size_t dmis) {
		for (int r = 0; r < m.world; ++r) {
			b.emplace_back(m.in_len, smis);
			b.emplace_back(m.out_len, dmis);
		}
		for (int r = 0; r < m.world; ++r) {
			std::generate_n(b[2 * r].data(), m.in_len, [] { return (unsigned char)rng(); });
			for (const Seg &s : m.src[r])
				if (s.buf == OUT)
					std::generate_n(at(r, s), m.bytes, [] { return (unsigned char)rng(); });
		}
	}
	unsigned char *at(int r, Seg s) { return s.buf == NONE ? nullptr : b[2 * r + s.buf].data() + s.off; }
	// The index in b[2r + s.buf].mem of s's first byte.
	size_t mem_at(int r, Seg s) const { return b[2 * r + s.buf].off + s.off; }
};

static gs_llmove_params move_params(const Move &m, MoveBufs &bufs, LLGroup &g, int r,
                                    unsigned long long timeout_ns) {
	gs_llmove_params p;
	memset(&p, 0, sizeof p);
	for (int q = 0; q < m.world; ++q) {
		p.areas[q] = g.area[q].data();
		p.pads[q] = g.pads.at(q);
		p.src[q] = bufs.at(r, m.src[r][q]);
		p.dst[q] = bufs.at(r, m.dst[r][q]);
	}
	p.bytes = m.bytes;
	p.timeout_ns = timeout_ns;
	p.world = m.world;
	p.rank = r;
	return p;
}

// A gs_llmove call of m on fresh data. Every byte of every buffer, guards
// included, must end as the reference says: the memory before the call
// with, for every rank r and peer q, dst[r][q] replaced by the bytes of
// q's src[q][r] before the call.
struct MoveCall : LLCall {
	MoveBufs bufs;
	std::vector<std::vector<unsigned char>> want; // every buffer's mem

	MoveCall(const Move &m, size_t smis, size_t dmis, int call, LLGroup &g) : bufs(m, smis, dmis) {
		name = m.name() + " smis=" + std::to_string(smis) + " dmis=" + std::to_string(dmis) + " call=" +
		       std::to_string(call);
		for (const Buf &b : bufs.b)
			want.push_back(b.mem);
		const std::vector<std::vector<unsigned char>> orig = want;
		for (int r = 0; r < m.world; ++r)
			for (int q = 0; q < m.world; ++q) {
				const Seg d = m.dst[r][q], s = m.src[q][r];
				if (d.buf != NONE && s.buf != NONE)
					memcpy(&want[2 * r + d.buf][bufs.mem_at(r, d)], &orig[2 * q + s.buf][bufs.mem_at(q, s)],
					       m.bytes);
			}
		std::vector<gs_llmove_params> ps;
		for (int r = 0; r < m.world; ++r)
			ps.push_back(move_params(m, bufs, g, r, 5000000000ull));
		g.launch(gs_llmove, ps, ll_grid(m.bytes));
	}

	bool check() override {
		for (size_t i = 0; i < want.size(); ++i) {
			const Buf &b = bufs.b[i];
			const auto bad = std::mismatch(b.mem.begin(), b.mem.end(), want[i].begin());
			if (bad.first == b.mem.end())
				continue;
			const ptrdiff_t at = (bad.first - b.mem.begin()) - (ptrdiff_t)b.off;
			fail(name + ": rank " + std::to_string(i / 2) + (i % 2 ? " output" : " input") +
			     (at < 0 || at >= (ptrdiff_t)b.len ? " guard" : "") + " byte " + std::to_string(at) + " is " +
			     std::to_string(*bad.first) + ", want " + std::to_string(*bad.second));
			return false;
		}
		return true;
	}
};

// calls back-to-back gs_llmove calls of m on g (MoveCall).
static void llmove_case(const Move &m, size_t smis, size_t dmis, int calls, LLGroup &g) {
	std::vector<std::unique_ptr<LLCall>> q;
	for (int c = 0; c < calls; ++c)
		q.emplace_back(new MoveCall(m, smis, dmis, c, g));
	ll_settle(g, q);
}

// gs_ll and gs_llmove calls in turn, back to back on one group, with
// grids of 1 to GS_LL_BLOCKS blocks: they share the areas and each block's
// counter.
static void ll_mixed_case() {
	LLGroup g(3);
	const size_t max = GS_LL_BLOCKS * GS_LL_LINES * 8;
	const struct {
		size_t ll_numel, move_bytes; // f32 elements of the all-reduce, bytes of the move
	} steps[] = {{3, 60001}, {max / 4, 9}, {20011, max}, {1, 4100}, {max / 4 - 1, 1}, {5000, 24577}};
	std::vector<std::unique_ptr<LLCall>> q;
	int i = 0;
	for (const auto &s : steps) {
		q.emplace_back(new ARCall(F32, SUM, s.ll_numel, 0, i % 2, GS_POST_NONE, i, g));
		q.emplace_back(new MoveCall(Move((MOVE)(i % NMOVE), 3, i % 3, s.move_bytes, i % 2), i % 3, 2 * i + 1, i, g));
		i++;
	}
	ll_settle(g, q);
}

// A gs_llmove launch on ranks of which some never run (grids[r] == 0) or
// run fewer blocks than the others: a rank that times out names the first
// rank and block it waited for in vain (want[r]: its detail and missing
// mask; 0, 0: no error).
static void llmove_timeout_case(const Move &m, const std::vector<unsigned> &grids,
                                const std::vector<std::pair<unsigned, unsigned>> &want) {
	LLGroup g(m.world);
	MoveBufs bufs(m, 0, 0);
	// Ranks that run together exchange lines under the same deadline: it
	// must outlast a busy machine's scheduling stalls.
	const bool together = std::count(grids.begin(), grids.end(), 0u) < m.world - 1;
	std::vector<gs_llmove_params> ps;
	for (int r = 0; r < m.world; ++r) {
		ps.push_back(move_params(m, bufs, g, r, together ? 500000000 : 2000000));
		if (grids[r] && grids[r] < ll_grid(m.bytes)) // a rank that ran a smaller op: its later blocks never come
			ps.back().bytes = (size_t)grids[r] * GS_LL_LINES * 8;
	}
	run_ranks(gs_llmove, ps, grids, GS_LL_THREADS);
	for (int r = 0; r < m.world; ++r) {
		const unsigned *pad = g.pads.at(r);
		const unsigned code = want[r].second ? GS_ERR_TIMEOUT : 0;
		if (pad[GS_PAD_ERROR] != code || pad[GS_PAD_ERROR_DETAIL] != want[r].first ||
		    pad[GS_PAD_ERROR_MISSING] != want[r].second)
			return fail(m.name() + " timeout: rank " + std::to_string(r) + " error words " +
			            std::to_string(pad[GS_PAD_ERROR]) + "," + std::to_string(pad[GS_PAD_ERROR_DETAIL]) + "," +
			            std::to_string(pad[GS_PAD_ERROR_MISSING]));
	}
	passed++;
}

static void llmove_timeout_cases() {
	const size_t two = GS_LL_LINES * 8 + 8; // block 1 has one line: thread 0's
	const unsigned w = GS_LL_WAIT, b1 = 1u << 8;
	// The root waits for rank 1's handshake; rank 1 for the root's lines.
	llmove_timeout_case(Move(BCAST, 2, 0, 8, false), {1, 0}, {{w | 1, 2}, {0, 0}});
	llmove_timeout_case(Move(BCAST, 2, 0, 8, false), {0, 1}, {{0, 0}, {w | 0, 1}});
	// The root runs a one-block op: the others' block 1 waits for its
	// handshake (after each other's), or for its lines.
	llmove_timeout_case(Move(GATHER, 3, 2, two, false), {2, 2, 1}, {{w | b1 | 2, 4}, {w | b1 | 2, 4}, {0, 0}});
	llmove_timeout_case(Move(ALLTOALL, 4, 3, two, true), {2, 2, 2, 1},
	                    {{w | b1 | 3, 8}, {w | b1 | 3, 8}, {w | b1 | 3, 8}, {0, 0}});
}

// All-to-all through gs_copy: rank r pulls chunk r of every peer.
static void copy_case(int world, size_t chunk, unsigned grid, unsigned block, Pads &pads) {
	std::vector<Buf> in, out;
	for (int r = 0; r < world; ++r) {
		in.emplace_back(chunk * world, rng() % 16);
		for (size_t i = 0; i < chunk * world; ++i)
			in.back().data()[i] = (unsigned char)rng();
		out.emplace_back(chunk * world, rng() % 16);
	}
	std::vector<gs_copy_params> ps(world);
	for (int r = 0; r < world; ++r) {
		gs_copy_params &p = ps[r];
		memset(&p, 0, sizeof p);
		for (int q = 0; q < world; ++q) {
			p.dst[q] = out[r].data() + q * chunk;
			p.src[q] = in[q].data() + r * chunk;
			p.bytes[q] = chunk;
			p.pads[q] = pads.at(q);
		}
		p.timeout_ns = 5000000000ull;
		p.nseg = world;
		p.world = world;
		p.rank = r;
		p.sync = GS_SYNC_START | GS_SYNC_END;
	}
	run_all(gs_copy, ps, grid, block);
	std::string name = "copy world=" + std::to_string(world) + " chunk=" + std::to_string(chunk);
	std::string err = pads.errors();
	if (!err.empty())
		return fail(name + ": pad errors" + err);
	for (int r = 0; r < world; ++r) {
		if (!out[r].guards_intact())
			return fail(name + ": write outside the output");
		for (int q = 0; q < world; ++q)
			if (memcmp(out[r].data() + q * chunk, in[q].data() + r * chunk, chunk) != 0)
				return fail(name + ": rank " + std::to_string(r) + " segment " + std::to_string(q));
	}
	passed++;
}

// A staged broadcast through gs_copy, as gpu.Team.broadcast launches it
// below GOSYM_GPU_CE_MIN: the root stages its input into its staging (the
// pre segment) and copies it to its output, every other rank pulls the
// root's staging after the start barrier. That barrier pairs block b of
// every rank, so a receiver's block b may read only share b: here the
// root's blocks after the first start 50 ms late, and a receiver that
// reads the whole range with a grid-wide stride (GS_SYNC_SHARES unset, as
// before session 43, when the fuzzer found it with two ranks on one GPU)
// copies bytes the root had not staged. shares false: that launch, which
// must go wrong (else the case no longer shows the race).
static int late_root_rank;
static bool late_root_blocks(size_t r, unsigned b) { return (int)r == late_root_rank && b > 0; }

static void staged_bcast_case(int world, int root, size_t bytes, unsigned grid, bool shares, Pads &pads) {
	std::vector<Buf> stage, out;
	Buf in(bytes, 0);
	for (size_t i = 0; i < bytes; ++i)
		in.data()[i] = (unsigned char)rng();
	for (int r = 0; r < world; ++r) {
		stage.emplace_back(bytes, 0);
		out.emplace_back(bytes, 0);
	}
	std::vector<gs_copy_params> ps(world);
	for (int r = 0; r < world; ++r) {
		gs_copy_params &p = ps[r];
		memset(&p, 0, sizeof p);
		for (int q = 0; q < world; ++q)
			p.pads[q] = pads.at(q);
		if (r == root) {
			p.dst[0] = stage[r].data(), p.src[0] = in.data(), p.bytes[0] = bytes;
			p.dst[1] = out[r].data(), p.src[1] = in.data(), p.bytes[1] = bytes;
			p.nseg = 2, p.npre = 1;
		} else {
			p.dst[0] = out[r].data(), p.src[0] = stage[root].data(), p.bytes[0] = bytes;
			p.nseg = 1;
		}
		p.timeout_ns = 5000000000ull;
		p.world = world;
		p.rank = r;
		p.sync = GS_SYNC_START | GS_SYNC_END | (shares ? GS_SYNC_SHARES : 0);
	}
	late_root_rank = root;
	emu_launch_threads(gs_copy, ps.data(), ps.size(), grid, 32, late_root_blocks);
	std::string name = "staged broadcast world=" + std::to_string(world) + " root=" + std::to_string(root) +
	                   " bytes=" + std::to_string(bytes) + " grid=" + std::to_string(grid) +
	                   (shares ? "" : " without shares");
	std::string err = pads.errors();
	if (!err.empty())
		return fail(name + ": pad errors" + err);
	bool right = true;
	for (int r = 0; r < world; ++r)
		right = right && out[r].guards_intact() && memcmp(out[r].data(), in.data(), bytes) == 0;
	if (right != shares)
		return fail(name + (shares ? ": a receiver read what the root had not staged"
		                           : ": the grid-wide stride did not show the race (the case lost its teeth)"));
	passed++;
}

// Broadcast by scatter and relay (gs_bcast_relay): a run of broadcasts on
// one group, each from the root roots[i] (the counts of the pads carry over
// from op to op, whoever is root), in place or not, at odd offsets; every
// rank's output against the root's input, guards intact, no pad error.
static void relay_case(int world, const std::vector<int> &roots, size_t bytes, int blocks, size_t step,
                       size_t mis, bool inplace, Pads &pads, bool push = false) {
	std::string name = std::string(push ? "relay push" : "relay") + " world=" + std::to_string(world) +
	                   " bytes=" + std::to_string(bytes) + " blocks=" + std::to_string(blocks) +
	                   " step=" + std::to_string(step);
	for (int root : roots) {
		std::vector<Buf> in, out;
		for (int r = 0; r < world; ++r) {
			in.emplace_back(bytes, mis);
			for (size_t i = 0; i < bytes; ++i)
				in.back().data()[i] = (unsigned char)rng();
			out.emplace_back(bytes, (mis * 3 + r) % 16);
		}
		std::vector<gs_relay_params> ps(world);
		for (int r = 0; r < world; ++r) {
			gs_relay_params &p = ps[r];
			memset(&p, 0, sizeof p);
			for (int q = 0; q < world; ++q) {
				p.outs[q] = inplace && q == root ? in[q].data() : out[q].data();
				p.pads[q] = pads.at(q);
			}
			p.src = in[root].data();
			p.bytes = bytes;
			p.step = step;
			p.timeout_ns = 5000000000ull;
			p.world = world;
			p.rank = r;
			p.root = root;
			p.blocks = blocks;
			p.push = push;
		}
		run_all(gs_bcast_relay, ps, (unsigned)(blocks * (world - 1)), 64);
		std::string err = pads.errors();
		if (!err.empty())
			return fail(name + " root=" + std::to_string(root) + ": pad errors" + err);
		for (int r = 0; r < world; ++r) {
			Buf &o = inplace && r == root ? in[r] : out[r];
			if (!o.guards_intact())
				return fail(name + ": write outside rank " + std::to_string(r) + "'s output");
			if (memcmp(o.data(), in[root].data(), bytes) != 0)
				return fail(name + " root=" + std::to_string(root) + ": rank " + std::to_string(r) + "'s output");
		}
	}
	passed++;
}

// gs_bcast_relay refuses a grid that is not blocks*(world-1), and a step
// that is not a multiple of 16, with a config error and no write.
static void relay_config_case() {
	Pads pads(3);
	Buf in(64, 0), out(64, 0);
	gs_relay_params p;
	memset(&p, 0, sizeof p);
	for (int q = 0; q < 3; ++q) {
		p.outs[q] = out.data();
		p.pads[q] = pads.at(q);
	}
	p.src = in.data();
	p.bytes = 64;
	p.step = 16;
	p.world = 3;
	p.rank = 1;
	p.blocks = 2;
	run_rank(gs_bcast_relay, p, 3, 32); // the grid must be 4
	p.step = 24;
	run_rank(gs_bcast_relay, p, 4, 32);
	if (pads.at(1)[GS_PAD_ERROR] != GS_ERR_CONFIG || !out.untouched())
		return fail("relay config: error " + std::to_string(pads.at(1)[GS_PAD_ERROR]));
	passed++;
}

static void barrier_case(int world, Pads &pads, int times) {
	std::vector<gs_barrier_params> ps(world);
	for (int r = 0; r < world; ++r) {
		memset(&ps[r], 0, sizeof ps[r]);
		for (int q = 0; q < world; ++q)
			ps[r].pads[q] = pads.at(q);
		ps[r].timeout_ns = 5000000000ull;
		ps[r].world = world;
		ps[r].rank = r;
	}
	for (int i = 0; i < times; ++i)
		run_all(gs_barrier, ps, 1, 32);
	std::string err = pads.errors();
	if (!err.empty())
		return fail("barrier: pad errors" + err);
	passed++;
}

// Rank 1 never shows up: rank 0 must time out, record who was missing, and
// return instead of hanging; the host error block its pad names gets the
// same code, detail and mask (what the engine checks before each op).
static void timeout_case() {
	Pads pads(2);
	unsigned host[GS_HOST_ERROR_MISSING + 1] = {0, 0, 0};
	unsigned *hp = host;
	memcpy(pads.at(0) + GS_PAD_HOST_ERROR, &hp, sizeof hp);
	gs_barrier_params p;
	memset(&p, 0, sizeof p);
	p.pads[0] = pads.at(0);
	p.pads[1] = pads.at(1);
	p.timeout_ns = 2000000; // 2 ms
	p.world = 2;
	p.rank = 0;
	run_rank(gs_barrier, p, 1, 32);
	unsigned *pad = pads.at(0);
	if (pad[GS_PAD_ERROR] != GS_ERR_TIMEOUT || pad[GS_PAD_ERROR_MISSING] != 2u ||
	    pad[GS_PAD_ERROR_DETAIL] != 1u)
		return fail("timeout: error words " + std::to_string(pad[GS_PAD_ERROR]) + "," +
		            std::to_string(pad[GS_PAD_ERROR_DETAIL]) + "," +
		            std::to_string(pad[GS_PAD_ERROR_MISSING]));
	if (host[GS_HOST_ERROR_CODE] != GS_ERR_TIMEOUT || host[GS_HOST_ERROR_MISSING] != 2u ||
	    host[GS_HOST_ERROR_DETAIL] != 1u)
		return fail("timeout: host error words " + std::to_string(host[GS_HOST_ERROR_CODE]) + "," +
		            std::to_string(host[GS_HOST_ERROR_DETAIL]) + "," +
		            std::to_string(host[GS_HOST_ERROR_MISSING]));
	passed++;
}

static void config_case() {
	Pads pads(1);
	gs_ar_params p;
	memset(&p, 0, sizeof p);
	float x = 1;
	p.peers[0] = &x;
	p.out = &x;
	p.pads[0] = pads.at(0);
	p.numel = 1;
	p.world = 1;
	run_rank(gs_oneshot_f32_sum, p, GS_MAX_BLOCKS + 1, 32);
	if (pads.at(0)[GS_PAD_ERROR] != GS_ERR_CONFIG)
		return fail("config: too many blocks not reported");
	p.world = GS_MAX_RANKS + 1; // must not touch anything
	run_rank(gs_oneshot_f32_sum, p, 1, 32);
	passed++;
}

// ---- semaphores ------------------------------------------------------------------

static void sema_set(Pads &pads, int dst, int word, int src) {
	__atomic_store_n(&pads.at(dst)[word + src], (unsigned)GS_SEMA_SET, __ATOMIC_SEQ_CST);
}

static gs_sema_params sema_params(Pads &pads, int rank, int word, unsigned mask, unsigned long long timeout) {
	gs_sema_params p;
	memset(&p, 0, sizeof p);
	p.pad = pads.at(rank);
	p.timeout_ns = timeout;
	p.word = word;
	p.mask = mask;
	return p;
}

// gs_sema_wait against peers that signal from their own threads, later:
// it waits for exactly the ranks of its mask, consumes their semaphores
// and leaves the others alone.
static void sema_wait_case(int world, int iters) {
	Pads pads(world);
	for (int it = 0; it < iters; ++it) {
		const int word = it % 2 ? GS_PAD_SEMA_DONE : GS_PAD_SEMA_READY;
		std::vector<std::thread> th;
		for (int r = 1; r < world; ++r)
			th.emplace_back([&, r] {
				for (int k = 0; k < (int)(rng() % 3); ++k)
					std::this_thread::yield();
				sema_set(pads, 0, word, r);
			});
		unsigned mask = 0;
		for (int r = 1; r < world; ++r)
			mask |= 1u << r;
		run_rank(gs_sema_wait, sema_params(pads, 0, word, mask, 5000000000ull), 1, 32);
		for (auto &t : th)
			t.join();
		for (int r = 0; r < GS_MAX_RANKS; ++r)
			if (pads.at(0)[GS_PAD_SEMA_READY + r] || pads.at(0)[GS_PAD_SEMA_DONE + r])
				return fail("sema_wait world=" + std::to_string(world) + ": semaphore of rank " +
				            std::to_string(r) + " not consumed");
	}
	// A semaphore outside the mask stays set.
	sema_set(pads, 0, GS_PAD_SEMA_READY, world - 1);
	run_rank(gs_sema_wait, sema_params(pads, 0, GS_PAD_SEMA_READY, 0, 1000000), 1, 32);
	if (pads.at(0)[GS_PAD_SEMA_READY + world - 1] != GS_SEMA_SET)
		return fail("sema_wait consumed a semaphore outside its mask");
	std::string err = pads.errors();
	if (!err.empty())
		return fail("sema_wait: pad errors" + err);
	passed++;
}

// Rank 2 never signals: the wait gives up, names rank 2, consumes rank 1's.
static void sema_timeout_case() {
	Pads pads(3);
	sema_set(pads, 0, GS_PAD_SEMA_DONE, 1);
	run_rank(gs_sema_wait, sema_params(pads, 0, GS_PAD_SEMA_DONE, 6u, 2000000), 1, 32);
	unsigned *pad = pads.at(0);
	if (pad[GS_PAD_ERROR] != GS_ERR_TIMEOUT || pad[GS_PAD_ERROR_MISSING] != 4u ||
	    pad[GS_PAD_ERROR_DETAIL] != ((unsigned)GS_PAD_SEMA_DONE << 8 | 2u) || pad[GS_PAD_SEMA_DONE + 1] != 0)
		return fail("sema timeout: error words " + std::to_string(pad[GS_PAD_ERROR]) + "," +
		            std::to_string(pad[GS_PAD_ERROR_DETAIL]) + "," + std::to_string(pad[GS_PAD_ERROR_MISSING]));
	Pads bad(1);
	run_rank(gs_sema_wait, sema_params(bad, 0, GS_PAD_ERROR, 1u, 0), 1, 32);
	run_rank(gs_sema_wait, sema_params(bad, 0, GS_PAD_SEMA_READY, 1u << GS_MAX_RANKS, 0), 1, 32);
	if (bad.at(0)[GS_PAD_ERROR] != GS_ERR_CONFIG)
		return fail("sema_wait: a bad word or mask was not reported");
	passed++;
}

// ---- multicast (nvls.cu) ------------------------------------------------------------

// The emulated multicast object: a reserved range (never touched itself)
// and every rank's buffer of the same size; an address at offset o of the
// range means offset o of every buffer. Multimem accesses must be aligned
// to their size and inside the range, or the emulation aborts, as a GPU
// would fault.
static struct {
	unsigned char *va = nullptr;
	size_t size = 0;
	std::vector<unsigned char *> bufs;
} mc;

char *gs_emu_mc_peer(const void *p, int r) {
	const size_t off = (size_t)((const unsigned char *)p - mc.va);
	if ((const unsigned char *)p < mc.va || off + 4 > mc.size || off % 4 != 0) {
		fprintf(stderr, "multicast access at offset %zd outside the mapping or misaligned\n", (ssize_t)off);
		abort();
	}
	return (char *)mc.bufs[r] + off;
}
int gs_emu_mc_world(const void *) { return (int)mc.bufs.size(); }

static const size_t kMcGuard = 64;

struct Aligned { // 64-byte aligned bytes, filled with 0xab
	unsigned char *p;
	size_t n;
	explicit Aligned(size_t n_) : p((unsigned char *)aligned_alloc(64, (n_ + 63) / 64 * 64)), n(n_) {
		memset(p, 0xab, n);
	}
	~Aligned() { free(p); }
	Aligned(const Aligned &) = delete;
	Aligned &operator=(const Aligned &) = delete;
};

// One NVLS kernel call over world ranks whose data start mis bytes into
// the mapping (after a guard); one-shot writes to outs that start omis bytes
// past a 16-byte boundary.
static void nvls_case(DT dt, OP op, int mode, int world, size_t n, size_t mis, size_t omis, unsigned grid,
                      unsigned block) {
	typedef void (*K)(gs_nvls_params);
	K k = nullptr;
	if (dt == F32 && op == SUM)
		k = gs_nvls_f32_sum;
	if (dt == F16)
		k = op == SUM ? gs_nvls_f16_sum : op == MIN ? gs_nvls_f16_min : gs_nvls_f16_max;
	if (dt == BF16)
		k = op == SUM ? gs_nvls_bf16_sum : op == MIN ? gs_nvls_bf16_min : gs_nvls_bf16_max;
	const size_t es = dt_size[dt], bytes = n * es, size = 2 * kMcGuard + bytes + 16;
	std::vector<std::unique_ptr<Aligned>> bufs, outs;
	std::vector<std::vector<unsigned char>> orig;
	Aligned va(size);
	mc.va = va.p;
	mc.size = size;
	mc.bufs.clear();
	for (int r = 0; r < world; ++r) {
		bufs.emplace_back(new Aligned(size));
		fill(dt, op, bufs[r]->p, size / es, op != SUM); // the guards hold valid numbers too
		orig.emplace_back(bufs[r]->p, bufs[r]->p + size);
		mc.bufs.push_back(bufs[r]->p);
		outs.emplace_back(new Aligned(bytes + 2 * kGuard + 16));
	}
	Pads pads(world);
	std::vector<gs_nvls_params> ps(world);
	for (int r = 0; r < world; ++r) {
		gs_nvls_params &p = ps[r];
		memset(&p, 0, sizeof p);
		p.mc = mc.va + kMcGuard + mis;
		p.out = outs[r]->p + kGuard + omis;
		p.pad = pads.at(r);
		p.numel = n;
		p.mode = mode;
		p.world = world;
		p.rank = r;
	}
	run_all(k, ps, grid, block);

	char name[256];
	snprintf(name, sizeof name, "nvls %s %s %s world=%d n=%zu mis=%zu omis=%zu grid=%u block=%u",
	         mode == GS_NVLS_INPLACE ? "inplace" : "oneshot", dt_name[dt], op_name[op], world, n, mis, omis,
	         grid, block);
	std::string err = pads.errors();
	if (!err.empty())
		return fail(std::string(name) + ": pad errors" + err);
	const size_t a0 = kMcGuard + mis, a1 = a0 + bytes, w1 = (a1 + 3) & ~(size_t)3;
	std::vector<const unsigned char *> src;
	for (int r = 0; r < world; ++r)
		src.push_back(orig[r].data() + a0);
	unsigned char want[8];
	for (int r = 0; r < world; ++r) {
		const unsigned char *got = mode == GS_NVLS_INPLACE ? bufs[r]->p + a0 : outs[r]->p + kGuard + omis;
		for (size_t i = 0; i < n; ++i) {
			reference(dt, op, GS_POST_NONE, 1, src, i, want);
			if (!same(dt, got + i * es, want))
				return fail(std::string(name) + ": rank " + std::to_string(r) + " element " +
				            std::to_string(i) + " wrong");
		}
		// Outside [a0, a1) nothing changes, but for the documented scratch
		// half word after an odd 16-bit range in place.
		for (size_t b = 0; b < size; ++b) {
			const bool data = mode == GS_NVLS_INPLACE && b >= a0 && b < (n ? w1 : a0);
			if (!data && bufs[r]->p[b] != orig[r][b])
				return fail(std::string(name) + ": rank " + std::to_string(r) + " buffer byte " +
				            std::to_string(b) + " changed");
		}
		for (size_t b = 0; b < outs[r]->n; ++b) {
			const bool data = mode == GS_NVLS_ONESHOT && b >= kGuard + omis && b < kGuard + omis + bytes;
			if (!data && outs[r]->p[b] != 0xab)
				return fail(std::string(name) + ": rank " + std::to_string(r) + " out byte " +
				            std::to_string(b) + " written");
		}
	}
	passed++;
}

// Bad launches are reported on the pad, not run: an unknown mode, in place
// from a start that is not 4-byte aligned, a misaligned out.
static void nvls_config_case() {
	Aligned va(256), buf(256), out(256);
	mc.va = va.p;
	mc.size = 256;
	mc.bufs.assign(1, buf.p);
	const struct {
		int mode;
		size_t mis, omis;
	} bad[] = {{0, 0, 0}, {3, 0, 0}, {GS_NVLS_INPLACE, 2, 0}, {GS_NVLS_ONESHOT, 0, 1}, {GS_NVLS_ONESHOT, 1, 0}};
	for (const auto &b : bad) {
		Pads pads(1);
		gs_nvls_params p;
		memset(&p, 0, sizeof p);
		p.mc = va.p + 64 + b.mis;
		p.out = out.p + 64 + b.omis;
		p.pad = pads.at(0);
		p.numel = 8;
		p.mode = b.mode;
		p.world = 1;
		run_rank(gs_nvls_bf16_sum, p, 1, 32);
		if (pads.at(0)[GS_PAD_ERROR] != GS_ERR_CONFIG)
			return fail("nvls config: mode " + std::to_string(b.mode) + " mis " + std::to_string(b.mis) +
			            " omis " + std::to_string(b.omis) + " not reported");
	}
	for (size_t i = 0; i < 256; ++i)
		if (buf.p[i] != 0xab || out.p[i] != 0xab)
			return fail("nvls config: a refused launch wrote memory");
	passed++;
}

int main() {
	std::vector<Pads> pads;
	for (int w = 0; w <= GS_MAX_RANKS; ++w)
		pads.emplace_back(w);

	const size_t sizes[] = {0, 1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 33, 64, 1023, 1025, 4099};
	const int worlds[] = {1, 2, 3, 4, 8};
	const unsigned grids[] = {1, 3, 24};
	const unsigned blocks[] = {32, 64, 512};
	for (int algo = 0; algo < NALGO; ++algo)
		for (int dt = 0; dt < NDT; ++dt)
			for (int op = 0; op < NOP; ++op)
				for (int k = 0; k < 14; ++k) {
					int world = worlds[rng() % 5];
					size_t n = sizes[rng() % (sizeof sizes / sizeof sizes[0])];
					size_t es = dt_size[dt];
					std::vector<size_t> mis(world, 0);
					size_t omis = 0;
					switch (k % 4) {
					case 0: // all aligned
						break;
					case 1: { // equally misaligned: scalar head, vectors, tail
						size_t m = (rng() % (16 / es)) * es;
						for (auto &x : mis)
							x = m;
						omis = algo != TWOSHOT ? m : 0;
						break;
					}
					case 2: // different alignments: all scalar
						for (int r = 0; r < world; ++r)
							mis[r] = (r % 2) * es;
						break;
					default: // out misaligned against the inputs
						omis = es;
					}
					int post = GS_POST_NONE;
					if (op == SUM && is_float((DT)dt) && k % 3 != 0)
						post = k % 3 == 1 ? GS_POST_DIV : GS_POST_MUL;
					bool scatter = algo != TWOSHOT && k % 5 == 4;
					allreduce_case(algo, (DT)dt, (OP)op, world, n, mis, omis, grids[rng() % 3],
					               blocks[rng() % 3], post, scatter, pads[world]);
				}
	// Larger cases on the vector path, with every world size.
	for (int world = 1; world <= GS_MAX_RANKS; ++world)
		for (int algo = 0; algo < NALGO; ++algo)
			allreduce_case(algo, BF16, SUM, world, (1 << 16) + 3, std::vector<size_t>(world, 0), 0, 24, 512,
			               GS_POST_NONE, false, pads[world]);
	// LL: every type and op, odd sizes and offsets, in place or not, with
	// the group's counters carried from call to call (both parities, and
	// blocks that sit out some launches).
	{
		std::vector<std::unique_ptr<LLGroup>> ll;
		for (int w = 0; w <= GS_MAX_RANKS; ++w)
			ll.emplace_back(new LLGroup(std::max(w, 1)));
		const size_t ll_sizes[] = {1, 2, 3, 5, 9, 1025, 2047, 4099, 20011};
		for (int dt = 0; dt < NDT; ++dt)
			for (int op = 0; op < NOP; ++op)
				for (int k = 0; k < 6; ++k) {
					const size_t es = dt_size[dt];
					const int world = worlds[rng() % 5];
					size_t n = ll_sizes[rng() % (sizeof ll_sizes / sizeof ll_sizes[0])];
					n = std::min<size_t>(n, GS_LL_BLOCKS * GS_LL_LINES * 8 / es - 1); // LLMaxBytes
					const size_t mis = k % 2 ? (rng() % (16 / es)) * es : 0;
					int post = GS_POST_NONE;
					if (op == SUM && is_float((DT)dt) && k % 3 != 0)
						post = k % 3 == 1 ? GS_POST_DIV : GS_POST_MUL;
					ll_case((DT)dt, (OP)op, n, mis, k % 4 == 3, post, 3, *ll[world]);
					// reduce_scatter: pieces back to back, or with a gap
					ll_case((DT)dt, (OP)op, n, mis, false, post, 2, *ll[world], n + (k % 2) * (rng() % 7));
				}
		// The largest input: every block, and a later small one reusing block 0.
		ll_case(BF16, SUM, GS_LL_BLOCKS * GS_LL_LINES * 4, 0, false, GS_POST_NONE, 2, *ll[2]);
		ll_case(F32, MAX, 3, 4, false, GS_POST_NONE, 3, *ll[2]);
		ll_config_case();
		ll_timeout_case();
		// gs_llmove: every collective, from the first and the last root, in
		// place or not, at odd offsets, up to the largest segment, three
		// calls back to back (the third reuses the first's parity), on the
		// groups of the all-reduce cases (their counters carry over).
		const size_t move_sizes[] = {1, 3, 7, 8, 9, 4100, 60001, GS_LL_BLOCKS * GS_LL_LINES * 8};
		const size_t move_mis[][2] = {{0, 0}, {1, 0}, {0, 3}, {5, 13}, {7, 7}};
		for (int world = 1; world <= 4; ++world)
			for (int kind = 0; kind < NMOVE; ++kind)
				for (size_t i = 0; i < sizeof move_sizes / sizeof move_sizes[0]; ++i) {
					const size_t v = i + world + kind, *mis = move_mis[v % 5];
					llmove_case(Move((MOVE)kind, world, v % 2 ? world - 1 : 0, move_sizes[i], v / 2 % 2), mis[0],
					            mis[1], 3, *ll[world]);
				}
		ll_mixed_case();
		llmove_timeout_cases();
	}
	for (int world : worlds)
		for (size_t chunk : {0, 1, 7, 16, 33, 1000, 4097})
			copy_case(world, chunk, grids[rng() % 3], blocks[rng() % 3], pads[world]);
	for (int world = 2; world <= 4; ++world)
		for (int root : {0, world - 1}) {
			staged_bcast_case(world, root, 64 * 1024 + 48, 4, true, pads[world]);
			staged_bcast_case(world, root, 4099, 3, true, pads[world]);
		}
	staged_bcast_case(2, 0, 64 * 1024, 4, false, pads[2]);
	for (int world : worlds)
		barrier_case(world, pads[world], 5);
	for (int world = 2; world <= GS_MAX_RANKS; ++world) {
		Pads rp(world);
		std::vector<int> roots;
		for (int i = 0; i < 3; ++i)
			roots.push_back((int)(rng() % world));
		roots.push_back(world - 1);
		// push and pull modes interleaved on one group: the pull mode's counts must stay in
		// step across push-mode ops (which leave them alone)
		for (size_t bytes : {1, 15, 16, 100, 4097, 65536 + 3})
			for (int blocks : {1, 3})
				for (bool push : {false, true})
					relay_case(world, roots, bytes, blocks, 16u << (rng() % 8), rng() % 16, rng() % 2, rp, push);
		relay_case(world, {0, world - 1, 0}, 300000, 2, 4096, 5, false, rp);
		relay_case(world, {world - 1, 0}, 300000 + 7, 2, 4096, 3, true, rp, true);
	}
	relay_config_case();
	timeout_case();
	config_case();
	for (int world : worlds)
		sema_wait_case(world, 20);
	sema_timeout_case();
	const struct {
		DT dt;
		OP op;
	} nvls[] = {{F32, SUM}, {F16, SUM}, {F16, MIN}, {F16, MAX}, {BF16, SUM}, {BF16, MIN}, {BF16, MAX}};
	for (const auto &c : nvls)
		for (int k = 0; k < 40; ++k) {
			const size_t es = dt_size[c.dt];
			const int mode = k % 2 ? GS_NVLS_INPLACE : GS_NVLS_ONESHOT;
			size_t mis = (rng() % (16 / es)) * es;
			if (mode == GS_NVLS_INPLACE)
				mis &= ~(size_t)3;
			nvls_case(c.dt, c.op, mode, worlds[rng() % 5], sizes[rng() % (sizeof sizes / sizeof sizes[0])], mis,
			          (rng() % (16 / es)) * es, grids[rng() % 3], blocks[rng() % 3]);
		}
	for (int world = 1; world <= GS_MAX_RANKS; ++world)
		for (int mode : {GS_NVLS_ONESHOT, GS_NVLS_INPLACE})
			nvls_case(BF16, SUM, mode, world, (1 << 16) + 3, 0, 0, 24, 512);
	nvls_config_case();
	printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
