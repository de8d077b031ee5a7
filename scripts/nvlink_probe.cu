// NVLink bandwidth probe (2 GPUs of one process, peer access): what SM
// loads, SM stores and the copy engines move per direction, by unroll and
// grid, with both GPUs moving at once. Informs the kernels' shapes; not part
// of the library. Build on the GPU machine: nvcc -O3 -arch=sm_90 -o probe nvlink_probe.cu
#include <chrono>
#include <cstdio>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

// dst[i] = src[i] (+ add[i] when add), U 16-byte vectors in flight per thread.
template <int U>
__global__ void __launch_bounds__(512) copyk(uint4 *dst, const uint4 *src, const uint4 *add, size_t n) {
	const size_t stride = (size_t)gridDim.x * blockDim.x;
	size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	for (; i + (U - 1) * stride < n; i += U * stride) {
		uint4 v[U];
#pragma unroll
		for (int u = 0; u < U; ++u) v[u] = src[i + u * stride];
		if (add) {
			uint4 w[U];
#pragma unroll
			for (int u = 0; u < U; ++u) w[u] = add[i + u * stride];
#pragma unroll
			for (int u = 0; u < U; ++u) {
				float4 a = *(float4 *)&v[u], b = *(float4 *)&w[u];
				a.x += b.x; a.y += b.y; a.z += b.z; a.w += b.w;
				v[u] = *(uint4 *)&a;
			}
		}
#pragma unroll
		for (int u = 0; u < U; ++u) dst[i + u * stride] = v[u];
	}
	for (; i < n; i += stride) dst[i] = src[i];
}

// Two-shot in place on 2 GPUs, pull + push: own half = own + peer; written to both.
template <int U>
__global__ void __launch_bounds__(512) twoshot(float4 *own, float4 *peer, size_t lo, size_t n) {
	const size_t stride = (size_t)gridDim.x * blockDim.x;
	size_t i = lo + (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	for (; i + (U - 1) * stride < lo + n; i += U * stride) {
		float4 a[U], b[U];
#pragma unroll
		for (int u = 0; u < U; ++u) { a[u] = own[i + u * stride]; b[u] = peer[i + u * stride]; }
#pragma unroll
		for (int u = 0; u < U; ++u) {
			a[u].x += b[u].x; a[u].y += b[u].y; a[u].z += b[u].z; a[u].w += b[u].w;
			own[i + u * stride] = a[u]; peer[i + u * stride] = a[u];
		}
	}
	for (; i < lo + n; i += stride) { // the tail (rows before session 8 skipped it for U > 1)
		float4 a = own[i], b = peer[i];
		a.x += b.x; a.y += b.y; a.z += b.z; a.w += b.w;
		own[i] = a; peer[i] = a;
	}
}

typedef void (*launcher)(int g, int blocks, size_t nvec);
static uint4 *buf[2], *scr[2];
static cudaStream_t st[2];

template <class F>
static double timeit(F f, int iters) { // µs per iteration, both GPUs
	for (int g = 0; g < 2; ++g) { cudaSetDevice(g); cudaDeviceSynchronize(); }
	f();
	for (int g = 0; g < 2; ++g) { cudaSetDevice(g); cudaDeviceSynchronize(); }
	auto t0 = std::chrono::steady_clock::now();
	for (int k = 0; k < iters; ++k) f();
	for (int g = 0; g < 2; ++g) { cudaSetDevice(g); cudaDeviceSynchronize(); }
	auto t1 = std::chrono::steady_clock::now();
	return std::chrono::duration<double, std::micro>(t1 - t0).count() / iters;
}

template <int U>
static void copyrun(int g, int blocks, uint4 *dst, const uint4 *src, const uint4 *add, size_t nvec) {
	cudaSetDevice(g);
	copyk<U><<<blocks, 512, 0, st[g]>>>(dst, src, add, nvec);
}

static void copyu(int U, int g, int blocks, uint4 *dst, const uint4 *src, const uint4 *add, size_t nvec) {
	switch (U) {
	case 1: copyrun<1>(g, blocks, dst, src, add, nvec); break;
	case 2: copyrun<2>(g, blocks, dst, src, add, nvec); break;
	case 4: copyrun<4>(g, blocks, dst, src, add, nvec); break;
	default: copyrun<8>(g, blocks, dst, src, add, nvec); break;
	}
}

static void tsu(int U, int g, int blocks, size_t nvec) {
	cudaSetDevice(g);
	float4 *own = (float4 *)buf[g], *peer = (float4 *)buf[1 - g];
	size_t half = nvec / 2;
	switch (U) {
	case 1: twoshot<1><<<blocks, 512, 0, st[g]>>>(own, peer, g * half, half); break;
	case 2: twoshot<2><<<blocks, 512, 0, st[g]>>>(own, peer, g * half, half); break;
	case 4: twoshot<4><<<blocks, 512, 0, st[g]>>>(own, peer, g * half, half); break;
	default: twoshot<8><<<blocks, 512, 0, st[g]>>>(own, peer, g * half, half); break;
	}
}

int main() {
	const size_t maxb = 256u << 20;
	for (int g = 0; g < 2; ++g) {
		CK(cudaSetDevice(g));
		CK(cudaDeviceEnablePeerAccess(1 - g, 0));
		CK(cudaMalloc(&buf[g], maxb));
		CK(cudaMalloc(&scr[g], maxb));
		CK(cudaMemset(buf[g], 0, maxb));
		CK(cudaMemset(scr[g], 0, maxb));
		CK(cudaStreamCreateWithFlags(&st[g], cudaStreamNonBlocking));
	}
	printf("{\"rows\": [\n");
	bool first = true;
	auto row = [&](const char *kind, int U, int blocks, size_t bytes, double us, double moved) {
		printf("%s{\"kind\": \"%s\", \"unroll\": %d, \"blocks\": %d, \"bytes\": %zu, \"us\": %.2f, \"GBps_per_dir\": %.1f}",
		       first ? "" : ",\n", kind, U, blocks, bytes, us, moved / us / 1e3);
		first = false;
		fprintf(stderr, "%18s U%d B%3d %4zuM %9.1f us %7.1f GB/s\n", kind, U, blocks, bytes >> 20, us, moved / us / 1e3);
	};
	const size_t sizes[] = {16u << 20, 256u << 20};
	for (size_t bytes : sizes) {
		const size_t nvec = bytes / 16;
		const int iters = bytes > (64u << 20) ? 10 : 100;
		for (int U : {1, 2, 4, 8})
			for (int blocks : {32, 66, 132, 264}) {
				row("pull_bidir", U, blocks, bytes, timeit([&] { for (int g = 0; g < 2; ++g) copyu(U, g, blocks, scr[g], buf[1 - g], nullptr, nvec); }, iters), bytes);
				row("push_bidir", U, blocks, bytes, timeit([&] { for (int g = 0; g < 2; ++g) copyu(U, g, blocks, scr[1 - g], buf[g], nullptr, nvec); }, iters), bytes);
				row("push_add_bidir", U, blocks, bytes, timeit([&] { for (int g = 0; g < 2; ++g) copyu(U, g, blocks, scr[1 - g], buf[g], scr[g], nvec); }, iters), bytes);
				row("twoshot_inplace", U, blocks, bytes, timeit([&] { for (int g = 0; g < 2; ++g) tsu(U, g, blocks, nvec); }, iters), bytes);
			}
		row("ce_bidir", 0, 0, bytes, timeit([&] { for (int g = 0; g < 2; ++g) { cudaSetDevice(g); cudaMemcpyPeerAsync(scr[1 - g], 1 - g, buf[g], g, bytes, st[g]); } }, iters), bytes);
		row("ce_pull_bidir", 0, 0, bytes, timeit([&] { for (int g = 0; g < 2; ++g) { cudaSetDevice(g); cudaMemcpyPeerAsync(scr[g], g, buf[1 - g], 1 - g, bytes, st[g]); } }, iters), bytes);
		row("ce_unidir", 0, 0, bytes, timeit([&] { cudaSetDevice(0); cudaMemcpyPeerAsync(scr[1], 1, buf[0], 0, bytes, st[0]); }, iters), bytes);
		row("push_unidir_U4_132", 4, 132, bytes, timeit([&] { copyu(4, 0, 132, scr[1], buf[0], nullptr, nvec); }, iters), bytes);
		row("pull_unidir_U4_132", 4, 132, bytes, timeit([&] { copyu(4, 0, 132, scr[0], buf[1], nullptr, nvec); }, iters), bytes);
		row("local_copy_U4_132", 4, 132, bytes, timeit([&] { copyu(4, 0, 132, scr[0], buf[0], nullptr, nvec); }, iters), bytes);
	}
	printf("\n]}\n");
	return 0;
}
