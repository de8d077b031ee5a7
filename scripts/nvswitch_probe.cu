// NVSwitch copy probe: what each way of moving bytes between the GPUs of one
// host reaches, one process driving every visible GPU (peer access), so the
// collectives' algorithms can be chosen against measured bounds. Not part of
// the library. Patterns, each GPU's bytes per second reported:
//   pair      GPU 0 -> GPU 1 alone
//   alltoall  every GPU sends a distinct piece to every peer at once
//             (all_gather, all_to_all, reduce_scatter's traffic)
//   bcast     GPU 0 sends the same bytes to every peer at once (root egress)
// Ways: SM push (kernel on the sender stores into the peer), SM pull (kernel
// on the receiver loads from the peer), CE push/pull (cudaMemcpyPeerAsync on
// the sender's/receiver's streams, one stream per peer), over CTA counts.
// Build and run on the GPU machine:
//   nvcc -O3 -arch=sm_90 -o /tmp/probe scripts/nvswitch_probe.cu && /tmp/probe [MiB per piece]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)
constexpr int MAXG = 8;

struct Task { uint4 *dst[MAXG]; const uint4 *src[MAXG]; int n; size_t words; };

// Block b serves task b % t.n; the blocks of one task stride over it, U
// 16-byte loads in flight per thread before the stores.
template <int U>
__global__ void __launch_bounds__(512) movek(Task t) {
	const int k = blockIdx.x % t.n, per = gridDim.x / t.n;
	const size_t stride = (size_t)per * blockDim.x;
	size_t i = (size_t)(blockIdx.x / t.n) * blockDim.x + threadIdx.x;
	uint4 *dst = t.dst[k];
	const uint4 *src = t.src[k];
	for (; i + (U - 1) * stride < t.words; i += U * stride) {
		uint4 v[U];
#pragma unroll
		for (int u = 0; u < U; ++u) v[u] = src[i + u * stride];
#pragma unroll
		for (int u = 0; u < U; ++u) dst[i + u * stride] = v[u];
	}
	for (; i < t.words; i += stride) dst[i] = src[i];
}

int ng;
size_t bytes;
uint4 *buf[MAXG][MAXG]; // buf[g][p]: on GPU g, piece for/from peer p
uint4 *own[MAXG];        // on GPU g: its own outgoing data
cudaStream_t st[MAXG][MAXG];

double timeit(const std::function<void()> &launch) {
	for (int g = 0; g < ng; ++g) { CK(cudaSetDevice(g)); CK(cudaDeviceSynchronize()); }
	launch(); // warm
	for (int g = 0; g < ng; ++g) { CK(cudaSetDevice(g)); CK(cudaDeviceSynchronize()); }
	double best = 1e30;
	for (int rep = 0; rep < 5; ++rep) {
		auto t0 = std::chrono::steady_clock::now();
		launch();
		for (int g = 0; g < ng; ++g) { CK(cudaSetDevice(g)); CK(cudaDeviceSynchronize()); }
		double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
		best = s < best ? s : best;
	}
	return best;
}

void sm(int g, Task t, int ctas, int s = 0) {
	CK(cudaSetDevice(g));
	int grid = ctas - ctas % t.n;
	movek<4><<<grid, 512, 0, st[g][s]>>>(t);
	CK(cudaGetLastError());
}

// senders: which GPUs send; to(g): the peers g sends to; the same bytes
// (bcast) or a piece per peer.
void report(const char *pat, const char *way, int ctas, double s, double perGPUbytes) {
	printf("%-9s %-8s ctas=%-4d %8.3f ms  %7.1f GB/s per sending GPU\n", pat, way, ctas, s * 1e3, perGPUbytes / s / 1e9);
	fflush(stdout);
}

int main(int argc, char **argv) {
	bytes = (size_t)(argc > 1 ? atoi(argv[1]) : 256) << 20;
	CK(cudaGetDeviceCount(&ng));
	if (ng > MAXG) ng = MAXG;
	printf("%d GPUs, %zu MiB per piece\n", ng, bytes >> 20);
	for (int g = 0; g < ng; ++g) {
		CK(cudaSetDevice(g));
		for (int p = 0; p < ng; ++p)
			if (p != g) {
				int ok = 0;
				CK(cudaDeviceCanAccessPeer(&ok, g, p));
				if (!ok) { printf("no peer access %d->%d\n", g, p); return 1; }
				CK(cudaDeviceEnablePeerAccess(p, 0));
			}
		CK(cudaMalloc(&own[g], bytes));
		CK(cudaMemset(own[g], g + 1, bytes));
		for (int p = 0; p < ng; ++p) {
			CK(cudaMalloc(&buf[g][p], bytes));
			CK(cudaStreamCreateWithFlags(&st[g][p], cudaStreamNonBlocking));
		}
	}
	const size_t words = bytes / 16;
	const int ctasList[] = {8, 16, 32, 64, 132};
	// pair 0 -> 1
	for (int c : ctasList) {
		Task t{{buf[1][0]}, {own[0]}, 1, words};
		report("pair", "SM push", c, timeit([&] { sm(0, t, c); }), bytes);
		report("pair", "SM pull", c, timeit([&] { sm(1, t, c); }), bytes);
	}
	report("pair", "CE push", 0, timeit([&] { CK(cudaSetDevice(0)); CK(cudaMemcpyPeerAsync(buf[1][0], 1, own[0], 0, bytes, st[0][1])); }), bytes);
	report("pair", "CE pull", 0, timeit([&] { CK(cudaSetDevice(1)); CK(cudaMemcpyPeerAsync(buf[1][0], 1, own[0], 0, bytes, st[1][0])); }), bytes);
	// every GPU to every peer
	const double a2a = (double)bytes * (ng - 1);
	for (int c : ctasList) {
		report("alltoall", "SM push", c, timeit([&] {
			for (int g = 0; g < ng; ++g) {
				Task t{}; t.words = words;
				for (int p = 0; p < ng; ++p) if (p != g) { t.dst[t.n] = buf[p][g]; t.src[t.n] = own[g]; t.n++; }
				sm(g, t, c);
			}
		}), a2a);
		report("alltoall", "SM pull", c, timeit([&] {
			for (int g = 0; g < ng; ++g) {
				Task t{}; t.words = words;
				for (int p = 0; p < ng; ++p) if (p != g) { t.dst[t.n] = buf[g][p]; t.src[t.n] = own[p]; t.n++; }
				sm(g, t, c);
			}
		}), a2a);
	}
	report("alltoall", "CE push", 0, timeit([&] {
		for (int g = 0; g < ng; ++g) { CK(cudaSetDevice(g));
			for (int p = 0; p < ng; ++p) if (p != g) CK(cudaMemcpyPeerAsync(buf[p][g], p, own[g], g, bytes, st[g][p])); }
	}), a2a);
	report("alltoall", "CE pull", 0, timeit([&] {
		for (int g = 0; g < ng; ++g) { CK(cudaSetDevice(g));
			for (int p = 0; p < ng; ++p) if (p != g) CK(cudaMemcpyPeerAsync(buf[g][p], g, own[p], p, bytes, st[g][p])); }
	}), a2a);
	report("alltoall", "CE push1", 0, timeit([&] { // one stream per GPU: peers one after another
		for (int g = 0; g < ng; ++g) { CK(cudaSetDevice(g));
			for (int p = 0; p < ng; ++p) if (p != g) CK(cudaMemcpyPeerAsync(buf[p][g], p, own[g], g, bytes, st[g][0])); }
	}), a2a);
	report("alltoall", "CE pull1", 0, timeit([&] {
		for (int g = 0; g < ng; ++g) { CK(cudaSetDevice(g));
			for (int p = 0; p < ng; ++p) if (p != g) CK(cudaMemcpyPeerAsync(buf[g][p], g, own[p], p, bytes, st[g][0])); }
	}), a2a);
	// GPU 0 sends the same bytes to every peer (broadcast's root)
	for (int c : ctasList) {
		Task t{}; t.words = words;
		for (int p = 1; p < ng; ++p) { t.dst[t.n] = buf[p][0]; t.src[t.n] = own[0]; t.n++; }
		report("bcast", "SM push", c, timeit([&] { sm(0, t, c); }), a2a);
		report("bcast", "SM pull", c, timeit([&] {
			for (int p = 1; p < ng; ++p) { Task u{{buf[p][0]}, {own[0]}, 1, words}; sm(p, u, c); }
		}), a2a);
	}
	report("bcast", "CE push", 0, timeit([&] { CK(cudaSetDevice(0));
		for (int p = 1; p < ng; ++p) CK(cudaMemcpyPeerAsync(buf[p][0], p, own[0], 0, bytes, st[0][p])); }), a2a);
	report("bcast", "CE pull", 0, timeit([&] {
		for (int p = 1; p < ng; ++p) { CK(cudaSetDevice(p)); CK(cudaMemcpyPeerAsync(buf[p][0], p, own[0], 0, bytes, st[p][0])); } }), a2a);
	// local copy for reference
	report("local", "CE", 0, timeit([&] { CK(cudaSetDevice(0)); CK(cudaMemcpyAsync(buf[0][0], own[0], bytes, cudaMemcpyDeviceToDevice, st[0][0])); }), bytes);
	report("local", "SM", 132, timeit([&] { Task t{{buf[0][0]}, {own[0]}, 1, words}; sm(0, t, 132); }), bytes);
	return 0;
}
