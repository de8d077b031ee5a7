// Runs the kernels of p2p.cu on the host (see emu.h) over a channel between
// two emulated ranks and checks every message byte for byte. Unlike
// emu_main.cpp, the threads of a block run as OS threads with a real
// __syncthreads: the protocol relies on every thread's copy being done
// before thread 0 signals. Every kernel launch runs in a thread of its own,
// as the send and receive streams of a GPU do. Prints one line per failure
// and a final "N passed, M failed" line; exits non-zero on failure.
#include "p2p.cu"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "emu_check.h"

static std::mt19937_64 rng(4242);

static const unsigned long long kTimeout = 20000000000ull; // 20 s: only a bug waits that long

// One launch: the blocks one after another, the threads of each as OS
// threads of one emulated block.
static void launch(void (*k)(gs_p2p_params), const gs_p2p_params &p, unsigned grid, unsigned block) {
	for (unsigned b = 0; b < grid; ++b) {
		gs_emu_block blk;
		blk.n = block;
		std::vector<std::thread> th;
		for (unsigned t = 0; t < block; ++t)
			th.emplace_back([&, t] {
				gridDim = {grid, 1, 1};
				blockDim = {block, 1, 1};
				blockIdx = {b, 0, 0};
				threadIdx = {t, 0, 0};
				gs_emu_blk = &blk;
				k(p);
			});
		for (auto &x : th)
			x.join();
	}
}

// One side of a channel: its control words and its outbox (with guards).
struct Side {
	std::vector<unsigned> ctrl;
	Buf box;
	explicit Side(size_t slot) : ctrl(GS_P2P_CTRL_BYTES / 4, 0), box(GS_P2P_BLOCKS * GS_P2P_SLOTS * slot, 0) {}
	unsigned *err() { return ctrl.data() + GS_P2P_ERROR; }
};

struct Chan {
	size_t slot;
	std::unique_ptr<Side> s[2];
	explicit Chan(size_t slot_) : slot(slot_) {
		s[0].reset(new Side(slot));
		s[1].reset(new Side(slot));
	}
	// The parameters of rank `me` sending to (send) or receiving from the other rank.
	gs_p2p_params params(int me, bool send, void *buf, size_t bytes, long long tag) {
		gs_p2p_params p;
		memset(&p, 0, sizeof p);
		const int from = send ? me : 1 - me;
		p.buf = buf;
		p.ctrl = s[me]->ctrl.data();
		p.peer_ctrl = s[1 - me]->ctrl.data();
		p.box = s[from]->box.data();
		p.bytes = bytes;
		p.tag = tag;
		p.slot_bytes = slot;
		p.timeout_ns = kTimeout;
		return p;
	}
	std::string errors() {
		std::string e;
		for (int r = 0; r < 2; ++r)
			if (s[r]->err()[0])
				e += " rank" + std::to_string(r) + ":err=" + std::to_string(s[r]->err()[0]) + "/" +
				     std::to_string(s[r]->err()[1]);
		return e;
	}
	// Every block's four counters agree in both directions and nothing was
	// written past the outboxes.
	std::string in_step() {
		for (int r = 0; r < 2; ++r) {
			if (!s[r]->box.guards_intact())
				return "rank " + std::to_string(r) + "'s outbox guards overwritten";
			const unsigned *me = s[r]->ctrl.data(), *peer = s[1 - r]->ctrl.data();
			for (int b = 0; b < GS_P2P_BLOCKS; ++b) {
				const int l = b * GS_P2P_LINE;
				if (me[GS_P2P_SENT + l] != peer[GS_P2P_READY + l] || me[GS_P2P_SENT + l] != me[GS_P2P_ACK + l] ||
				    me[GS_P2P_SENT + l] != peer[GS_P2P_RECVD + l])
					return "rank " + std::to_string(r) + " block " + std::to_string(b) + " counters out of step";
			}
		}
		return "";
	}
	// Sets every counter of both directions to v (a consistent state).
	void preset(unsigned v) {
		for (int r = 0; r < 2; ++r)
			for (int b = 0; b < GS_P2P_BLOCKS; ++b)
				for (int w : {GS_P2P_READY, GS_P2P_ACK, GS_P2P_SENT, GS_P2P_RECVD})
					s[r]->ctrl[w + b * GS_P2P_LINE] = v;
	}
};

struct Msg {
	size_t n, smis, dmis;
	long long tag;
	size_t want;     // bytes the receiver expects (n unless testing a mismatch)
	long long wtag;  // tag the receiver expects
};

// The source (random bytes) and poisoned destination of every message.
struct Bufs {
	std::vector<std::unique_ptr<Buf>> src, dst;
	explicit Bufs(const std::vector<Msg> &msgs) {
		for (const Msg &m : msgs) {
			src.emplace_back(new Buf(m.n, m.smis));
			for (size_t i = 0; i < m.n; ++i)
				src.back()->data()[i] = (unsigned char)rng();
			dst.emplace_back(new Buf(m.want, m.dmis));
		}
	}
};

// Sends msgs from rank `from` to the other rank, the sender's launches in
// one thread and the receiver's in another.
static void exchange(Chan &c, int from, const std::vector<Msg> &msgs, unsigned grid, unsigned block, Bufs &b) {
	std::thread snd([&] {
		for (size_t i = 0; i < msgs.size(); ++i)
			launch(gs_p2p_send, c.params(from, true, b.src[i]->data(), msgs[i].n, msgs[i].tag), grid, block);
	});
	std::thread rcv([&] {
		for (size_t i = 0; i < msgs.size(); ++i)
			launch(gs_p2p_recv, c.params(1 - from, false, b.dst[i]->data(), msgs[i].want, msgs[i].wtag), grid,
			       block);
	});
	snd.join();
	rcv.join();
}

static std::string describe(const char *what, size_t slot, unsigned grid, unsigned block, const Msg &m) {
	char b[256];
	snprintf(b, sizeof b, "%s slot=%zu grid=%u block=%u n=%zu smis=%zu dmis=%zu", what, slot, grid, block, m.n,
	         m.smis, m.dmis);
	return b;
}

// Checks a delivered message against what was sent.
static bool delivered(const std::string &name, Buf &src, Buf &dst) {
	if (!dst.guards_intact()) {
		fail(name + ": write outside the destination");
		return false;
	}
	if (src.len && memcmp(src.data(), dst.data(), src.len) != 0) {
		fail(name + ": bytes differ");
		return false;
	}
	return true;
}

static bool channel_ok(const std::string &name, Chan &c) {
	std::string e = c.errors();
	if (e.empty())
		e = c.in_step();
	if (!e.empty()) {
		fail(name + ": " + e);
		return false;
	}
	return true;
}

static Msg plain(size_t n, size_t smis, size_t dmis) { return Msg{n, smis, dmis, 0, n, 0}; }

// One message of every interesting size and alignment.
static void single_case(size_t slot, unsigned grid, unsigned block, const Msg &m) {
	Chan c(slot);
	Bufs b({m});
	exchange(c, (int)(rng() % 2), {m}, grid, block, b);
	const std::string name = describe("single", slot, grid, block, m);
	if (delivered(name, *b.src[0], *b.dst[0]) && channel_ok(name, c))
		passed++;
}

// Many messages back to back, both directions at once, from counters
// preset to `start` (near the wrap of 32 bits when asked).
static void stream_case(size_t slot, unsigned grid, unsigned block, int count, unsigned start) {
	Chan c(slot);
	c.preset(start);
	const size_t round = slot * grid;
	std::vector<Msg> dir[2];
	for (int d = 0; d < 2; ++d)
		for (int i = 0; i < count; ++i) {
			size_t n;
			switch (rng() % 4) {
			case 0:
				n = rng() % 20;
				break;
			case 1:
				n = rng() % (2 * round);
				break;
			default: // several rounds: more than the slots hold
				n = round * (GS_P2P_SLOTS + 1 + rng() % 4) + rng() % round;
			}
			Msg m = plain(n, rng() % 16, rng() % 16);
			m.tag = m.wtag = (long long)(rng() % 5) - 2;
			dir[d].push_back(m);
		}
	Bufs bufs[2] = {Bufs(dir[0]), Bufs(dir[1])};
	std::thread t0([&] { exchange(c, 0, dir[0], grid, block, bufs[0]); });
	std::thread t1([&] { exchange(c, 1, dir[1], grid, block, bufs[1]); });
	t0.join();
	t1.join();
	char name[128];
	snprintf(name, sizeof name, "stream slot=%zu grid=%u block=%u count=%d start=%#x", slot, grid, block, count,
	         start);
	for (int d = 0; d < 2; ++d)
		for (int i = 0; i < count; ++i)
			if (!delivered(std::string(name) + " dir " + std::to_string(d) + " msg " + std::to_string(i),
			               *bufs[d].src[i], *bufs[d].dst[i]))
				return;
	if (channel_ok(name, c))
		passed++;
}

// The receiver expects another size or tag: it drains the message in step
// with the sender, writes nothing, records the sender's size and tag, and
// the next message arrives intact.
static void mismatch_case(size_t slot, unsigned grid, size_t n, size_t want, long long tag, long long wtag) {
	Chan c(slot);
	std::vector<Msg> msgs = {Msg{n, 0, 3, tag, want, wtag}, plain(1000, 1, 2)};
	Bufs b(msgs);
	exchange(c, 0, msgs, grid, 32, b);
	char name[160];
	snprintf(name, sizeof name, "mismatch slot=%zu grid=%u sent %zu/tag %lld, expected %zu/tag %lld", slot, grid, n,
	         tag, want, wtag);
	const unsigned *e = c.s[1]->err();
	if (e[0] != GS_ERR_MISMATCH || e[2] != (unsigned)n || e[3] != (unsigned)((unsigned long long)n >> 32) ||
	    e[4] != (unsigned)tag || e[5] != (unsigned)((unsigned long long)tag >> 32))
		return fail(std::string(name) + ": error words " + std::to_string(e[0]) + "," + std::to_string(e[2]) + "," +
		            std::to_string(e[4]));
	if (!b.dst[0]->untouched())
		return fail(std::string(name) + ": the destination was written");
	if (c.s[0]->err()[0])
		return fail(std::string(name) + ": the sender recorded an error");
	if (!delivered(std::string(name) + ": next message", *b.src[1], *b.dst[1]))
		return;
	const std::string step = c.in_step();
	if (!step.empty())
		return fail(std::string(name) + ": " + step);
	passed++;
}

// Nobody on the other side: the receiver gives up waiting for data, the
// sender after filling every slot; both name the block and what it waited
// for, and return.
static void timeout_case() {
	{
		Chan c(16);
		Buf dst(100, 0);
		gs_p2p_params p = c.params(1, false, dst.data(), 100, 0);
		p.timeout_ns = 2000000;
		launch(gs_p2p_recv, p, 2, 32);
		const unsigned *e = c.s[1]->err();
		if (e[0] != GS_ERR_TIMEOUT || (e[1] & 0xff) != GS_P2P_WAIT_DATA || !dst.untouched())
			return fail("timeout: receiver error words " + std::to_string(e[0]) + "," + std::to_string(e[1]));
	}
	{
		Chan c(16);
		const unsigned grid = 2;
		const size_t n = 16 * grid * (GS_P2P_SLOTS + 2);
		Buf src(n, 0);
		gs_p2p_params p = c.params(0, true, src.data(), n, 0);
		p.timeout_ns = 2000000;
		launch(gs_p2p_send, p, grid, 32);
		const unsigned *e = c.s[0]->err();
		if (e[0] != GS_ERR_TIMEOUT || (e[1] & 0xff) != GS_P2P_WAIT_SLOT)
			return fail("timeout: sender error words " + std::to_string(e[0]) + "," + std::to_string(e[1]));
		for (unsigned b = 0; b < grid; ++b)
			if (c.s[1]->ctrl[GS_P2P_READY + b * GS_P2P_LINE] != GS_P2P_SLOTS)
				return fail("timeout: the sender did not fill exactly the slots of block " + std::to_string(b));
	}
	passed++;
}

// A lost peer: this side's host leaves an abort in the channel's control
// while a receiver waits for data that never comes and a sender for slots
// nobody frees. Both return long before their timeout, with the abort
// (code and detail) as the channel's error, and the receiver writes nothing.
static void abort_case() {
	for (bool send : {false, true}) {
		Chan c(16);
		const unsigned grid = 2;
		const size_t n = 16 * grid * (GS_P2P_SLOTS + 2);
		Buf buf(n, 0);
		gs_p2p_params p = c.params(0, send, buf.data(), n, 0);
		unsigned *ctrl = c.s[0]->ctrl.data();
		std::thread host([&] {
			std::this_thread::sleep_for(std::chrono::milliseconds(50));
			__atomic_store_n(ctrl + GS_P2P_ABORT_DETAIL, 2u, __ATOMIC_RELEASE);
			__atomic_store_n(ctrl + GS_P2P_ABORT, (unsigned)GS_ERR_PEER_LOST, __ATOMIC_RELEASE);
		});
		const auto start = std::chrono::steady_clock::now();
		launch(send ? gs_p2p_send : gs_p2p_recv, p, grid, 32);
		host.join();
		const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
		const unsigned *e = c.s[0]->err();
		const std::string who = send ? "abort: sender" : "abort: receiver";
		if (e[0] != GS_ERR_PEER_LOST || e[1] != 2)
			return fail(who + " error words " + std::to_string(e[0]) + "," + std::to_string(e[1]));
		if (took > 5)
			return fail(who + " took " + std::to_string(took) + " s");
		if (!send && !buf.untouched())
			return fail(who + " wrote its destination");
	}
	passed++;
}

// Bad launches are reported and run nothing.
static void config_case() {
	const struct {
		size_t slot;
		unsigned grid, block;
	} bad[] = {{8, 1, 32}, {24, 1, 32}, {16, GS_P2P_BLOCKS + 1, 32}, {16, 1, 16}};
	for (const auto &b : bad) {
		Chan c(16);
		Buf buf(64, 0);
		gs_p2p_params p = c.params(0, false, buf.data(), 64, 0);
		p.slot_bytes = b.slot;
		launch(gs_p2p_recv, p, b.grid, b.block);
		if (c.s[0]->err()[0] != GS_ERR_CONFIG || !buf.untouched())
			return fail("config: slot " + std::to_string(b.slot) + " grid " + std::to_string(b.grid) + " block " +
			            std::to_string(b.block) + " not refused");
	}
	passed++;
}

int main() {
	const size_t slots[] = {16, 48, 256};
	const unsigned grids[] = {1, 3, GS_P2P_BLOCKS};
	const size_t sizes[] = {0, 1, 2, 3, 15, 16, 17, 33, 100, 1000, 4099};
	for (size_t slot : slots)
		for (unsigned grid : grids) {
			const size_t round = slot * grid;
			std::vector<size_t> ns(sizes, sizes + sizeof sizes / sizeof sizes[0]);
			for (size_t n : {round - 1, round, round + 1, round * GS_P2P_SLOTS, round * (2 * GS_P2P_SLOTS + 1) + 7})
				ns.push_back(n);
			for (size_t n : ns)
				single_case(slot, grid, rng() % 3 ? 32 : 64, plain(n, rng() % 16, rng() % 16));
		}
	for (unsigned start : {0u, 0xfffffff0u})
		for (unsigned grid : {1u, 3u, (unsigned)GS_P2P_BLOCKS})
			stream_case(grid == GS_P2P_BLOCKS ? 16 : 48, grid, 32, grid == GS_P2P_BLOCKS ? 6 : 20, start);
	mismatch_case(16, 3, 100, 99, 0, 0);                          // smaller than expected
	mismatch_case(16, 3, 16 * 3 * (GS_P2P_SLOTS + 3), 5, 0, 0);   // many rounds against one
	mismatch_case(16, 3, 7, 16 * 3 * (GS_P2P_SLOTS + 3), 0, 0);   // one round against many
	mismatch_case(48, GS_P2P_BLOCKS, 1000, 1000, 7, 8);          // tags
	mismatch_case(16, 1, 0, 1, -1, -1);                           // empty against one byte
	timeout_case();
	abort_case();
	config_case();
	printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
