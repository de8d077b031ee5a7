// Runs gs_a2av of p2p.cu on the host (see emu.h) over groups of up to four
// emulated ranks and checks every piece byte for byte. The blocks of one
// rank's launch wait on blocks of the other ranks' launches (a sender block
// on its receiver's ACKs, a receiver block on its sender's chunks), so every
// block of every rank's launch runs at once, the threads of each block as
// OS threads with a real __syncthreads; each rank runs its launches one
// after another in a thread of its own, as a GPU's stream does, with no
// host barrier between the ranks' launches. Pads and stagings are plain
// host memory shared by the emulated ranks, standing in for the peer
// mappings. Prints one line per failure and a final "N passed, M failed"
// line; exits non-zero on failure.
#include "p2p.cu"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "emu_check.h"

static std::mt19937_64 rng(2727);

static const unsigned long long kTimeout = 20000000000ull; // 20 s: only a bug waits that long
static const unsigned kBlock = 32;                         // the fewest threads gs_a2av takes
static const size_t kPadWords = GS_PAD_BYTES / 4;

// One launch on one rank: every block at once, the threads of each as OS
// threads of one emulated block.
static void launch(const gs_a2av_params &p, unsigned grid, unsigned block = kBlock) {
	emu_launch_threads(gs_a2av, &p, 1, grid, block);
}

// Chunks of a piece of bytes (gs_p2p_rounds): at least one.
static unsigned long long rounds(size_t bytes, size_t slot, unsigned nb) {
	const size_t round = slot * nb;
	return bytes == 0 ? 1 : (bytes + round - 1) / round;
}

static std::string hex(unsigned v) {
	char b[16];
	snprintf(b, sizeof b, "%#x", v);
	return b;
}

// The pads and stagings of a group, and what the counters on them should
// read: chunks[s][r] sent from s to r since `start`.
static int g_push; // the cases of main's current pass push (gs_a2av_params.push)

struct Group {
	int world;
	unsigned nb;
	size_t slot, region;
	int push = g_push;
	unsigned start = 0;
	std::vector<std::vector<unsigned>> pads;
	std::vector<std::unique_ptr<Buf>> stages;
	std::vector<std::vector<unsigned long long>> chunks, last;
	std::vector<std::vector<bool>> ran;

	Group(int world_, unsigned nb_, size_t slot_, size_t region_)
	    : world(world_), nb(nb_), slot(slot_), region(region_), pads(world_, std::vector<unsigned>(kPadWords, 0)),
	      chunks(world_, std::vector<unsigned long long>(world_, 0)),
	      last(world_, std::vector<unsigned long long>(world_, 0)), ran(world_, std::vector<bool>(world_, false)) {
		// a region for each other rank (gs_a2av_slot), one at world 1
		for (int r = 0; r < world; ++r)
			stages.emplace_back(new Buf((size_t)(world > 1 ? world - 1 : 1) * region, 0));
	}

	std::string name() const {
		char b[112];
		snprintf(b, sizeof b, "world=%d nb=%u slot=%zu region=%zu start=%#x%s", world, nb, slot, region, start,
		         push ? " push" : "");
		return b;
	}

	// Sets the counters of every pair and block (of all GS_A2AV_BLOCKS) to
	// v, consistently: s's SENT[r][b] = r's RECVD[s][b] = r's READY[s][b] =
	// s's ACK[r][b] = v.
	void preset(unsigned v) {
		start = v;
		for (int s = 0; s < world; ++s)
			for (int r = 0; r < world; ++r)
				if (s != r)
					for (unsigned b = 0; b < GS_A2AV_BLOCKS; ++b) {
						pads[s][GS_PAD_A2AV_SENT + r * GS_A2AV_BLOCKS + b] = v;
						pads[s][GS_PAD_A2AV_ACK + r * GS_A2AV_BLOCKS + b] = v;
						pads[r][GS_PAD_A2AV_RECVD + s * GS_A2AV_BLOCKS + b] = v;
						pads[r][GS_PAD_A2AV_READY + s * GS_A2AV_BLOCKS + b] = v;
					}
	}

	// Rank r's parameters, without its buffers and splits.
	gs_a2av_params params(int r) {
		gs_a2av_params p;
		memset(&p, 0, sizeof p);
		for (int q = 0; q < world; ++q) {
			p.stages[q] = stages[q]->data();
			p.pads[q] = pads[q].data();
		}
		p.region = region;
		p.slot_bytes = slot;
		p.timeout_ns = kTimeout;
		p.nb = (int)nb;
		p.world = world;
		p.rank = r;
		p.push = push;
		return p;
	}

	const unsigned *err(int r) const { return pads[r].data() + GS_PAD_ERROR; }

	void clear_errors() {
		for (auto &p : pads)
			for (int w = GS_PAD_ERROR; w <= GS_PAD_ERROR_MISSING; ++w)
				p[w] = 0;
	}

	std::string errors() const {
		std::string e;
		for (int r = 0; r < world; ++r)
			if (err(r)[0] || err(r)[1] || err(r)[2])
				e += " rank" + std::to_string(r) + ":err=" + std::to_string(err(r)[0]) + "/detail " +
				     hex(err(r)[1]) + "/missing " + hex(err(r)[2]);
		return e;
	}

	// What word w of rank r's pad should hold, or false for the error words
	// (checked on their own).
	bool expected(int r, size_t w, unsigned *want) const {
		*want = 0;
		if (w >= GS_PAD_ERROR && w < GS_PAD_HOST_ERROR + 2)
			return false;
		const size_t span = GS_MAX_RANKS * GS_A2AV_BLOCKS;
		if (w >= GS_PAD_A2AV_READY && w < GS_PAD_A2AV_HDR) {
			const size_t i = (w - GS_PAD_A2AV_READY) % span;
			const int q = (int)(i / GS_A2AV_BLOCKS);
			const unsigned b = (unsigned)(i % GS_A2AV_BLOCKS);
			if (q >= world || q == r)
				return true;
			// READY and RECVD count what q sent r; ACK and SENT what r sent q.
			const bool in = w < GS_PAD_A2AV_ACK || w >= GS_PAD_A2AV_RECVD;
			*want = start + (b < nb ? (unsigned)(in ? chunks[q][r] : chunks[r][q]) : 0u);
			return true;
		}
		if (w >= GS_PAD_A2AV_HDR && w < GS_PAD_A2AV_HDR + 2 * span) {
			const size_t i = (w - GS_PAD_A2AV_HDR) / 2;
			const int q = (int)(i / GS_A2AV_BLOCKS);
			const unsigned b = (unsigned)(i % GS_A2AV_BLOCKS);
			if (q < world && q != r && b < nb && ran[q][r]) {
				const unsigned long long n = last[q][r];
				*want = (w - GS_PAD_A2AV_HDR) % 2 ? (unsigned)(n >> 32) : (unsigned)n;
			}
		}
		return true;
	}

	// Every pair's counters advanced by the chunks of its pieces (and agree
	// on both pads), each header holds the size of the pair's last piece,
	// nothing else on the pads was written, and senders staged only into
	// their slots of the regions (world-1 of them).
	std::string in_step() const {
		for (int r = 0; r < world; ++r) {
			for (size_t w = 0; w < kPadWords; ++w) {
				unsigned want;
				if (expected(r, w, &want) && pads[r][w] != want)
					return "rank " + std::to_string(r) + " pad word " + std::to_string(w) + " is " + hex(pads[r][w]) +
					       ", want " + hex(want);
			}
			const Buf &st = *stages[r];
			if (!st.guards_intact())
				return "rank " + std::to_string(r) + ": write outside the staging";
			const size_t used = (size_t)nb * GS_A2AV_SLOTS * slot;
			for (size_t i = 0; i < st.len; ++i) {
				const size_t q = i / region, at = i % region;
				if ((q + 1 >= (size_t)world || at >= used) && st.mem[st.off + i] != kPoison)
					return "rank " + std::to_string(r) + ": staging byte " + std::to_string(i) +
					       " written outside the slots";
			}
		}
		return "";
	}

	// Books the chunks of the pieces of ops (run by every rank).
	template <class O> void account(const std::vector<O *> &ops) {
		for (const O *o : ops)
			for (int s = 0; s < world; ++s)
				for (int r = 0; r < world; ++r)
					if (s != r) {
						const size_t n = o->send[s][r];
						chunks[s][r] += rounds(n, slot, nb);
						last[s][r] = n;
						ran[s][r] = true;
					}
	}
};

typedef std::vector<std::vector<size_t>> Split;

// One all_to_all: send[i][j] bytes that rank i sends j, recv[j][i] bytes
// that j expects from i (send[i][j] unless testing a mismatch), the pieces
// packed back to back in random bytes (input) and poison (output), each
// buffer starting at a random misalignment.
struct Op {
	int world;
	Split send, recv, in_off, out_off;
	std::vector<unsigned> self; // local copy blocks of each rank
	std::vector<std::unique_ptr<Buf>> in, out;

	Op(const Split &send_, const Split &recv_)
	    : world((int)send_.size()), send(send_), recv(recv_), in_off(world), out_off(world) {
		for (int r = 0; r < world; ++r) {
			size_t n = 0;
			for (int q = 0; q < world; ++q) {
				in_off[r].push_back(n);
				n += send[r][q];
			}
			in.emplace_back(new Buf(n, rng() % 16));
			for (size_t i = 0; i < n; ++i)
				in.back()->data()[i] = (unsigned char)rng();
			n = 0;
			for (int q = 0; q < world; ++q) {
				out_off[r].push_back(n);
				n += recv[r][q];
			}
			out.emplace_back(new Buf(n, rng() % 16));
			self.push_back(1 + (unsigned)(rng() % 3));
		}
	}
	explicit Op(const Split &send_) : Op(send_, transpose(send_)) {}

	static Split transpose(const Split &m) {
		Split t(m.size(), std::vector<size_t>(m.size()));
		for (size_t i = 0; i < m.size(); ++i)
			for (size_t j = 0; j < m.size(); ++j)
				t[j][i] = m[i][j];
		return t;
	}

	gs_a2av_params params(Group &g, int r) const {
		gs_a2av_params p = g.params(r);
		for (int q = 0; q < world; ++q) {
			p.src[q] = in[r]->data() + in_off[r][q];
			p.dst[q] = out[r]->data() + out_off[r][q];
			p.send[q] = send[r][q];
			p.recv[q] = recv[r][q];
		}
		return p;
	}

	unsigned grid(const Group &g, int r) const { return 2u * (unsigned)(world - 1) * g.nb + self[r]; }

	std::string matrix() const {
		std::string s = "send=[";
		for (int i = 0; i < world; ++i) {
			s += i ? ",[" : "[";
			for (int j = 0; j < world; ++j)
				s += (j ? "," : "") + std::to_string(send[i][j]);
			s += "]";
		}
		return s + "]";
	}

	// What rank r holds: every piece whose two sizes agree and whose sender
	// ran equals what the sender sent, byte for byte; every other piece is
	// still poison, and so is everything around the output.
	std::string check(int r, const std::vector<bool> &on) const {
		const std::string who = "rank " + std::to_string(r);
		const Buf &o = *out[r];
		if (!o.guards_intact())
			return who + ": write outside the output";
		for (int q = 0; q < world; ++q) {
			const size_t n = recv[r][q];
			const unsigned char *got = o.mem.data() + o.off + out_off[r][q];
			if (!on[r] || !on[q] || send[q][r] != n) {
				for (size_t i = 0; i < n; ++i)
					if (got[i] != kPoison)
						return who + ": piece from " + std::to_string(q) + " (" + std::to_string(n) +
						       " bytes, not to be delivered) written at byte " + std::to_string(i);
				continue;
			}
			const unsigned char *want = in[q]->mem.data() + in[q]->off + in_off[q][r];
			for (size_t i = 0; i < n; ++i)
				if (got[i] != want[i]) {
					char b[160];
					snprintf(b, sizeof b, ": piece from %d (%zu bytes at output offset %zu) differs at byte %zu: %#x, "
					         "want %#x", q, n, out_off[r][q], i, got[i], want[i]);
					return who + b;
				}
		}
		return "";
	}
};

// Every rank runs its launches of ops in order in a thread of its own (its
// stream); all of their blocks run at once. False (failure recorded) if
// that took as long as a wait's timeout: a wait may have timed out, which
// a mismatch recorded first would hide from the error words.
static bool run(Group &g, const std::vector<Op *> &ops, const std::string &name) {
	const auto t0 = std::chrono::steady_clock::now();
	std::vector<std::thread> streams;
	for (int r = 0; r < g.world; ++r)
		streams.emplace_back([&g, &ops, r] {
			for (const Op *o : ops)
				launch(o->params(g, r), o->grid(g, r));
		});
	for (auto &s : streams)
		s.join();
	const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
	g.account(ops);
	if (secs >= kTimeout * 1e-9) {
		fail(name + ": took " + std::to_string(secs) + " s, a wait timed out");
		return false;
	}
	return true;
}

// The outputs of ops, the error words and the counters.
static bool all_ok(const std::string &name, const Group &g, const std::vector<Op *> &ops) {
	for (size_t i = 0; i < ops.size(); ++i)
		for (int r = 0; r < g.world; ++r) {
			const std::string e = ops[i]->check(r, std::vector<bool>(g.world, true));
			if (!e.empty()) {
				fail(name + " op " + std::to_string(i) + " " + ops[i]->matrix() + ": " + e);
				return false;
			}
		}
	std::string e = g.errors();
	if (e.empty())
		e = g.in_step();
	if (!e.empty()) {
		fail(name + " " + (ops.empty() ? std::string() : ops.back()->matrix()) + ":" + e);
		return false;
	}
	return true;
}

// A piece size: empty, tiny, odd, a few rounds, or more rounds than the
// slots hold.
static size_t pick(size_t round) {
	switch (rng() % 7) {
	case 0:
		return 0;
	case 1:
		return 1;
	case 2:
		return rng() % 40;
	case 3:
		return 1 + 2 * (rng() % round); // odd, under two rounds
	case 4:
		return rng() % (3 * round);
	default:
		return round * (GS_A2AV_SLOTS + 1 + rng() % 5) + rng() % round;
	}
}

static Split random_split(int world, size_t round, bool skewed) {
	Split m(world, std::vector<size_t>(world));
	for (auto &row : m)
		for (auto &n : row)
			n = pick(round);
	if (skewed) // one pair (perhaps a rank to itself) far larger than the rest
		m[rng() % world][rng() % world] = round * (4 * GS_A2AV_SLOTS + rng() % 8) + 1 + 2 * (rng() % round);
	return m;
}

static Split constant_split(int world, size_t n) { return Split(world, std::vector<size_t>(world, n)); }

// A region that holds the slots, sometimes with room to spare (which must
// stay untouched).
static size_t region_for(unsigned nb, size_t slot) { return nb * GS_A2AV_SLOTS * slot + 16 * (rng() % 3); }

// One all_to_all on fresh pads.
static void single_case(int world, unsigned nb, size_t slot, const Split &send) {
	Group g(world, nb, slot, region_for(nb, slot));
	Op op(send);
	const std::string name = "single " + g.name();
	if (run(g, {&op}, name) && all_ok(name, g, {&op}))
		passed++;
}

// Several all_to_alls back to back on the same pads and stagings, each rank
// going on to its next launch as soon as its last one ended; the counters
// carry over (from `start`, near the 32-bit wrap when asked).
static void stream_case(int world, unsigned nb, size_t slot, int count, unsigned start) {
	Group g(world, nb, slot, region_for(nb, slot));
	g.preset(start);
	const size_t round = slot * nb;
	std::vector<std::unique_ptr<Op>> keep;
	std::vector<Op *> ops;
	for (int i = 0; i < count; ++i) {
		keep.emplace_back(new Op(random_split(world, round, i % 2 == 1)));
		ops.push_back(keep.back().get());
	}
	const std::string name = "stream " + g.name() + " count=" + std::to_string(count);
	if (!run(g, ops, name) || !all_ok(name, g, ops))
		return;
	// And once more, after the host looked (a stream that went idle).
	Op next(random_split(world, round, true));
	if (run(g, {&next}, name + ", one more") && all_ok(name + ", one more", g, {&next}))
		passed++;
}

// Runs op, which holds a mismatch, and checks every rank's pieces (the
// mismatched one left as it was); false (failure reported) if either fails.
static bool run_mismatched(Group &g, Op &op, const char *name) {
	if (!run(g, {&op}, name))
		return false;
	const std::vector<bool> on(g.world, true);
	for (int r = 0; r < g.world; ++r) {
		const std::string e = op.check(r, on);
		if (!e.empty()) {
			fail(std::string(name) + " " + op.matrix() + ": " + e);
			return false;
		}
	}
	return true;
}

// Rank 1 expects another size from rank 0 than rank 0 sends: it drains the
// piece in step, writes nothing of it, records the mismatch naming rank 0,
// gets its other pieces, and the next all_to_all on the same pads works.
static void mismatch_case(int world, unsigned nb, size_t slot, size_t n, size_t want) {
	Group g(world, nb, slot, region_for(nb, slot));
	Split send = random_split(world, slot * nb, false);
	send[0][1] = n;
	Split recv = Op::transpose(send);
	recv[1][0] = want;
	Op op(send, recv);
	char name[160];
	snprintf(name, sizeof name, "mismatch %s: rank 0 sends %zu, rank 1 expects %zu", g.name().c_str(), n, want);
	if (!run_mismatched(g, op, name))
		return;
	const unsigned *e = g.err(1);
	if (e[0] != GS_ERR_MISMATCH || !(e[1] & GS_A2AV_DETAIL) || ((e[1] >> 16) & 0xff) != GS_A2AV_MISMATCH ||
	    (e[1] & 0xff) != 0 || ((e[1] >> 8) & 0xff) >= nb || e[2] != 1u)
		return fail(std::string(name) + ": rank 1's error words " + std::to_string(e[0]) + "/" + hex(e[1]) + "/" +
		            hex(e[2]));
	for (int r = 0; r < world; ++r)
		if (r != 1 && g.err(r)[0])
			return fail(std::string(name) + ": rank " + std::to_string(r) + " recorded an error:" + g.errors());
	const std::string step = g.in_step();
	if (!step.empty())
		return fail(std::string(name) + ": " + step);
	g.clear_errors();
	Op next(random_split(world, slot * nb, true));
	const std::string then = std::string(name) + ", the next all_to_all";
	if (run(g, {&next}, then) && all_ok(then, g, {&next}))
		passed++;
}

// Rank `me`'s two splits disagree on its own piece: it copies nothing of it
// and records the mismatch naming itself; everything else goes through.
static void self_mismatch_case(int world, unsigned nb, size_t slot, int me, size_t n, size_t want) {
	Group g(world, nb, slot, region_for(nb, slot));
	Split send = random_split(world, slot * nb, false);
	send[me][me] = n;
	Split recv = Op::transpose(send);
	recv[me][me] = want;
	Op op(send, recv);
	char name[160];
	snprintf(name, sizeof name, "self mismatch %s: rank %d sends itself %zu, expects %zu", g.name().c_str(), me, n,
	         want);
	if (!run_mismatched(g, op, name))
		return;
	const unsigned *e = g.err(me);
	if (e[0] != GS_ERR_MISMATCH || e[1] != (GS_A2AV_DETAIL | (GS_A2AV_MISMATCH << 16) | (unsigned)me) ||
	    e[2] != 1u << me)
		return fail(std::string(name) + ": error words " + std::to_string(e[0]) + "/" + hex(e[1]) + "/" + hex(e[2]));
	for (int r = 0; r < world; ++r)
		if (r != me && g.err(r)[0])
			return fail(std::string(name) + ": rank " + std::to_string(r) + " recorded an error:" + g.errors());
	const std::string step = g.in_step();
	if (!step.empty())
		return fail(std::string(name) + ": " + step);
	passed++;
}

// Rank `gone` never launches: the others return within about their timeout,
// each with GS_ERR_TIMEOUT naming only that rank (also in a host error
// block, on rank 0), and the pieces between the ranks that did launch
// still arrive.
static void timeout_case(int world, unsigned nb, size_t slot, int gone, unsigned long long timeout_ns) {
	Group g(world, nb, slot, region_for(nb, slot));
	const size_t round = slot * nb;
	Split send = random_split(world, round, false);
	for (int r = 0; r < world; ++r)
		send[r][gone] = round * (GS_A2AV_SLOTS + 2) + 3; // more than the slots hold
	Op op(send);
	unsigned host[GS_HOST_ERROR_MISSING + 1] = {0, 0, 0};
	unsigned *hp = host;
	memcpy(g.pads[0].data() + GS_PAD_HOST_ERROR, &hp, sizeof hp);
	std::vector<bool> on(world, true);
	on[gone] = false;
	std::vector<std::thread> streams;
	const auto t0 = std::chrono::steady_clock::now();
	for (int r = 0; r < world; ++r)
		if (on[r])
			streams.emplace_back([&g, &op, r, timeout_ns] {
				gs_a2av_params p = op.params(g, r);
				p.timeout_ns = timeout_ns;
				launch(p, op.grid(g, r));
			});
	for (auto &s : streams)
		s.join();
	const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
	char name[160];
	snprintf(name, sizeof name, "timeout %s: rank %d absent, timeout %llu ns", g.name().c_str(), gone, timeout_ns);
	if (secs > 10 + timeout_ns * 1e-9)
		return fail(std::string(name) + ": the launches took " + std::to_string(secs) + " s");
	for (int r = 0; r < world; ++r) {
		const std::string e = op.check(r, on);
		if (!e.empty())
			return fail(std::string(name) + " " + op.matrix() + ": " + e);
		if (r == gone)
			continue;
		const unsigned *w = g.err(r), what = (w[1] >> 16) & 0xff;
		if (w[0] != GS_ERR_TIMEOUT || !(w[1] & GS_A2AV_DETAIL) || (w[1] & 0xff) != (unsigned)gone ||
		    (what != GS_A2AV_WAIT_SLOT && what != GS_A2AV_WAIT_DATA) || ((w[1] >> 8) & 0xff) >= nb ||
		    w[2] != 1u << gone)
			return fail(std::string(name) + ": rank " + std::to_string(r) + "'s error words " + std::to_string(w[0]) +
			            "/" + hex(w[1]) + "/" + hex(w[2]));
	}
	if (host[GS_HOST_ERROR_CODE] != g.err(0)[0] || host[GS_HOST_ERROR_DETAIL] != g.err(0)[1] ||
	    host[GS_HOST_ERROR_MISSING] != g.err(0)[2])
		return fail(std::string(name) + ": host error words " + std::to_string(host[0]) + "/" + hex(host[1]) + "/" +
		            hex(host[2]));
	const unsigned *err = g.err(gone);
	if (err[0] || err[1] || err[2])
		return fail(std::string(name) + ": the absent rank's pad has an error");
	// Pulling, each sender filled exactly the slots (each block's READY on
	// the absent rank's pad stopped at GS_A2AV_SLOTS) and then gave up;
	// pushing, none: the absent rank never granted one, and its staging,
	// which other ops may hold, is untouched.
	const unsigned filled = g.push ? 0 : GS_A2AV_SLOTS;
	for (int s = 0; s < world; ++s)
		if (s != gone)
			for (unsigned b = 0; b < nb; ++b)
				if (g.pads[gone][GS_PAD_A2AV_READY + s * GS_A2AV_BLOCKS + b] != filled)
					return fail(std::string(name) + ": rank " + std::to_string(s) + " block " + std::to_string(b) +
					            " made " + std::to_string(g.pads[gone][GS_PAD_A2AV_READY + s * GS_A2AV_BLOCKS + b]) +
					            " chunks ready, want " + std::to_string(filled));
	if (g.push && !g.stages[gone]->untouched())
		return fail(std::string(name) + ": a sender stored into the absent rank's staging");
	passed++;
}

// A bad launch on rank 0 (the others never launch): recorded as
// GS_ERR_CONFIG with the launch shape (when it has a pad to go to), and
// nothing else written anywhere.
static void config_case() {
	struct Bad {
		const char *what;
		int world, rank, nb;
		size_t slot, region;
		unsigned grid, block; // 0: the right grid, 2*(world-1)*nb + 1
		bool recorded;
	};
	const Bad bad[] = {
	    {"nb 0", 2, 0, 0, 16, 128, 0, kBlock, true},
	    {"nb over GS_A2AV_BLOCKS", 2, 0, GS_A2AV_BLOCKS + 1, 16, (GS_A2AV_BLOCKS + 1) * GS_A2AV_SLOTS * 16, 0,
	     kBlock, true},
	    {"no self block", 2, 0, 2, 16, 128, 4, kBlock, true},
	    {"no self block, world 3", 3, 0, 1, 16, 64, 4, kBlock, true},
	    {"too many self blocks", 2, 0, 1, 16, 64, 2 + GS_A2AV_SELF_MAX + 1, kBlock, true},
	    {"slot 24", 2, 0, 2, 24, 192, 0, kBlock, true},
	    {"slot 0", 2, 0, 2, 0, 128, 0, kBlock, true},
	    {"slot 8", 1, 0, 1, 8, 32, 0, kBlock, true},
	    {"slots past the region", 2, 0, 2, 16, 2 * GS_A2AV_SLOTS * 16 - 16, 0, kBlock, true},
	    {"slots past the region, world 1", 1, 0, 3, 32, 3 * GS_A2AV_SLOTS * 32 - 16, 0, kBlock, true},
	    {"region not a multiple of 16", 2, 0, 2, 16, 136, 0, kBlock, true},
	    {"block of 16 threads", 2, 0, 2, 16, 128, 0, 16, true},
	    {"rank out of range", 2, 2, 2, 16, 128, 5, kBlock, false},
	    {"rank -1", 2, -1, 2, 16, 128, 5, kBlock, false},
	    {"world 0", 0, 0, 2, 16, 128, 5, kBlock, false},
	    {"world over GS_MAX_RANKS", GS_MAX_RANKS + 1, 0, 2, 16, 128, 5, kBlock, false},
	};
	for (const Bad &c : bad) {
		const int n = c.world < 1 ? 1 : c.world > GS_MAX_RANKS ? GS_MAX_RANKS : c.world;
		Group g(n, 1, 16, c.region);
		const Split split = constant_split(n, 40);
		Op op(split);
		gs_a2av_params p = op.params(g, c.rank >= 0 && c.rank < n ? c.rank : 0);
		p.world = c.world;
		p.rank = c.rank;
		p.nb = c.nb;
		p.slot_bytes = c.slot;
		const unsigned grid = c.grid ? c.grid : 2u * (unsigned)(c.world - 1) * (unsigned)c.nb + 1u;
		launch(p, grid, c.block);
		const std::string name = std::string("config ") + c.what;
		const unsigned *e = g.err(0);
		if (c.recorded && (e[0] != GS_ERR_CONFIG || e[1] != ((grid << 16) | c.block) || e[2] != 0)) {
			fail(name + ": error words " + std::to_string(e[0]) + "/" + hex(e[1]) + "/" + hex(e[2]));
			continue;
		}
		bool clean = true;
		for (int r = 0; r < n; ++r) {
			clean = clean && op.out[r]->untouched() && g.stages[r]->untouched();
			for (size_t w = 0; w < kPadWords; ++w)
				clean = clean && (g.pads[r][w] == 0 || (c.recorded && r == 0 && (w == GS_PAD_ERROR ||
				                                                                  w == GS_PAD_ERROR_DETAIL)));
		}
		if (!clean) {
			fail(name + ": something was written");
			continue;
		}
		passed++;
	}
}

// Every case but the bad launches, in the mode g_push says.
static void run_cases() {
	// Every world with empty, one-byte and random splits (some skewed), over
	// block counts and slot sizes.
	const struct {
		unsigned nb;
		size_t slot;
	} shapes[] = {{1, 16}, {2, 32}, {3, 16}, {1, 48}, {2, 64}, {3, 32}};
	for (int world = 1; world <= 4; ++world) {
		single_case(world, 1, 16, constant_split(world, 0));
		single_case(world, 2, 16, constant_split(world, 1));
		single_case(world, 3, 48, constant_split(world, 17));
		for (const auto &s : shapes) {
			if (world == 4 && s.nb == 3 && s.slot != 32)
				continue; // the most OS threads: once is enough
			single_case(world, s.nb, s.slot, random_split(world, s.slot * s.nb, false));
			single_case(world, s.nb, s.slot, random_split(world, s.slot * s.nb, true));
		}
	}
	// Back to back, counters carrying over, and across the 32-bit wrap.
	for (unsigned start : {0u, 0xfffffffdu}) {
		stream_case(2, 3, 16, 6, start);
		stream_case(3, 2, 16, 5, start);
		stream_case(4, 1, 32, 4, start);
	}
	// Size mismatches, smaller and larger, one round against many.
	const size_t r2 = 16 * 2;
	mismatch_case(2, 1, 32, 100, 99);
	mismatch_case(2, 1, 32, 99, 100);
	mismatch_case(3, 2, 16, r2 * (GS_A2AV_SLOTS + 3) + 7, 5);
	mismatch_case(3, 2, 16, 5, r2 * (GS_A2AV_SLOTS + 3) + 7);
	mismatch_case(3, 2, 16, 0, 1);
	mismatch_case(4, 1, 16, 1, 0);
	self_mismatch_case(1, 1, 16, 0, 50, 49);
	self_mismatch_case(3, 2, 16, 2, 33, 200);
	self_mismatch_case(2, 3, 48, 1, 0, 16);
	// An absent rank.
	timeout_case(2, 2, 16, 1, 50000000ull);
	timeout_case(3, 1, 32, 2, 2000000000ull);
}

int main() {
	for (int push : {0, 1}) { // every case pulling, then pushing
		g_push = push;
		run_cases();
	}
	config_case();
	printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
