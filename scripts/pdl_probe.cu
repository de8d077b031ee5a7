// What programmatic dependent launch (PDL) saves a chain of small exchange kernels in a CUDA
// graph on two GPUs (issue 35 item 4: captured all_reduce <= 3.0 us at <= 16 KiB on 2 GPUs).
// Each kernel is gs_ll's shape reduced to its dependencies: read the block's launch counter,
// store one 16-byte line per thread into the peer's area with the new flag, wait for the
// peer's line, bump the counter. One process drives both GPUs (peer access), each GPU a graph
// of N such kernels on its own stream, launched together; microseconds per kernel, median
// of 9 launches (on one GPU both sides run on it, each on its own stream). Variants: plain launches; PDL (the launch attribute, griddepcontrol.wait at
// the kernel's start, launch_dependents right after it); PDL with launch_dependents at the
// kernel's end. Usage: pdl_probe [json]
#include <cuda.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <vector>

#define CK(x)                                                                                  \
	do {                                                                                   \
		cudaError_t e_ = (x);                                                          \
		if (e_ != cudaSuccess) {                                                       \
			fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
			exit(1);                                                               \
		}                                                                              \
	} while (0)

// mode 0: plain; 1: wait then trigger at start; 2: wait at start, trigger at end
__global__ void __launch_bounds__(128) xchg(unsigned *seqs, unsigned long long *mine, unsigned long long *peer,
                                            int lines, int mode) {
	if (mode)
		asm volatile("griddepcontrol.wait;" ::: "memory");
	if (mode == 1)
		asm volatile("griddepcontrol.launch_dependents;");
	unsigned seq = *(volatile unsigned *)(seqs + blockIdx.x);
	unsigned flag = seq + 1;
	int j = blockIdx.x * 128 + threadIdx.x;
	unsigned long long f = (unsigned long long)flag << 32;
	size_t at = ((size_t)(seq & 1) * lines + j) * 2;
	if (j < lines)
		asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(peer + at), "l"(f | 7), "l"(f | 9) : "memory");
	if (j < lines) {
		unsigned long long a, b;
		do {
			asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(mine + at) : "memory");
		} while ((unsigned)(a >> 32) != flag || (unsigned)(b >> 32) != flag);
	}
	__syncthreads();
	if (threadIdx.x == 0)
		*(volatile unsigned *)(seqs + blockIdx.x) = flag;
	if (mode == 2)
		asm volatile("griddepcontrol.launch_dependents;");
}

struct Side {
	int dev;
	cudaStream_t s;
	unsigned *seqs;
	unsigned long long *area;
	cudaGraphExec_t exec = nullptr;
};

static void capture(Side &me, Side &other, int n, int lines, int mode) {
	CK(cudaSetDevice(me.dev));
	if (me.exec)
		CK(cudaGraphExecDestroy(me.exec));
	cudaGraph_t g;
	CK(cudaStreamBeginCapture(me.s, cudaStreamCaptureModeThreadLocal));
	int blocks = (lines + 127) / 128;
	for (int i = 0; i < n; i++) {
		cudaLaunchConfig_t cfg = {};
		cfg.gridDim = dim3(blocks);
		cfg.blockDim = dim3(128);
		cfg.stream = me.s;
		cudaLaunchAttribute attr[1];
		attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
		attr[0].val.programmaticStreamSerializationAllowed = 1;
		cfg.attrs = attr;
		cfg.numAttrs = mode ? 1 : 0;
		CK(cudaLaunchKernelEx(&cfg, xchg, me.seqs, me.area, other.area, lines, mode));
	}
	CK(cudaStreamEndCapture(me.s, &g));
	CK(cudaGraphInstantiate(&me.exec, g, 0));
	CK(cudaGraphDestroy(g));
}

int main(int argc, char **argv) {
	int ndev = 0;
	CK(cudaGetDeviceCount(&ndev));
	if (ndev < 1)
		return 2;
	printf("pdl_probe: %s\n", ndev > 1 ? "two GPUs, peer access" : "one GPU: both sides on it, each its own stream");
	const int maxlines = 16 * 128;
	Side s[2];
	for (int d = 0; d < 2; d++) {
		s[d].dev = ndev > 1 ? d : 0;
		CK(cudaSetDevice(s[d].dev));
		if (ndev > 1)
			CK(cudaDeviceEnablePeerAccess(1 - d, 0));
		CK(cudaStreamCreateWithFlags(&s[d].s, cudaStreamNonBlocking));
		CK(cudaMalloc(&s[d].seqs, 64 * sizeof(unsigned)));
		CK(cudaMemset(s[d].seqs, 0, 64 * sizeof(unsigned)));
		CK(cudaMalloc(&s[d].area, 2 * (size_t)maxlines * 16));
		CK(cudaMemset(s[d].area, 0, 2 * (size_t)maxlines * 16));
		CK(cudaDeviceSynchronize());
	}
	FILE *js = argc > 1 ? fopen(argv[1], "w") : nullptr;
	if (js)
		fprintf(js, "[\n");
	const char *names[] = {"plain", "pdl-trigger-at-start", "pdl-trigger-at-end"};
	const int N = 50;
	bool first = true;
	printf("%-22s %6s %10s\n", "mode", "lines", "us/kernel");
	for (int lines : {64, 128, 512, 1024, 2048})
		for (int mode = 0; mode < 3; mode++) {
			for (int d = 0; d < 2; d++)
				capture(s[d], s[1 - d], N, lines, mode);
			std::vector<double> t;
			for (int rep = 0; rep < 11; rep++) {
				for (int d = 0; d < 2; d++) {
					CK(cudaSetDevice(s[d].dev));
					CK(cudaDeviceSynchronize());
				}
				cudaEvent_t a, b;
				CK(cudaSetDevice(0));
				CK(cudaEventCreate(&a));
				CK(cudaEventCreate(&b));
				CK(cudaEventRecord(a, s[0].s));
				for (int d = 0; d < 2; d++) {
					CK(cudaSetDevice(s[d].dev));
					CK(cudaGraphLaunch(s[d].exec, s[d].s));
				}
				CK(cudaSetDevice(0));
				CK(cudaEventRecord(b, s[0].s));
				for (int d = 0; d < 2; d++) {
					CK(cudaSetDevice(s[d].dev));
					CK(cudaStreamSynchronize(s[d].s));
				}
				float ms;
				CK(cudaSetDevice(0));
				CK(cudaEventElapsedTime(&ms, a, b));
				if (rep >= 2)
					t.push_back(ms * 1000.0 / N);
				CK(cudaEventDestroy(a));
				CK(cudaEventDestroy(b));
			}
			std::sort(t.begin(), t.end());
			double med = t[t.size() / 2];
			printf("%-22s %6d %10.2f\n", names[mode], lines, med);
			if (js) {
				fprintf(js, "%s  {\"mode\": \"%s\", \"lines\": %d, \"us_per_kernel\": %.3f}", first ? "" : ",\n",
				        names[mode], lines, med);
				first = false;
			}
		}
	if (js) {
		fprintf(js, "\n]\n");
		fclose(js);
	}
	return 0;
}
