// A stand-in libcuda for TestAgainstFakeDriver: four "GPUs" made of host
// memory, streams as worker threads, and the gosym kernels compiled as host
// code (kernels/testdata/emu.h) so that launches really run them. VMM
// allocations are memfd pages mapped with mmap, so an exported fd imported
// elsewhere aliases the same memory, as on a GPU. Enough of the driver API
// for cudacheck; everything else is absent. The p2p kernels, gs_copy and
// the one-shot and two-shot reductions run each block's threads as threads
// of their own (a real __syncthreads, see emu.h), one block after another
// (gs_copy's block barrier orders all its threads' staging before their
// pulls: run one thread after another, a thread pulled what a later one had
// yet to stage; a reduction's closing barrier must follow all its threads'
// reads of the peers' stagings, or a peer's next op overwrites them: back
// to back, unsynchronised, they summed stale data); gs_a2av, whose blocks
// wait on each other through the peers, runs every block of a launch at
// once, each with its threads as threads of their own; the rest one thread
// after another; so does gs_arpush, whose folds wait on its peers' pushes.
// FAKECUDA_P2P_THREADS=n runs the threaded kernels' blocks with at most n
// threads (at least 32; they work with any block size from 32 up): fewer OS
// threads for tests of many launches. Streams are worker
// threads, so the launches of simulated ranks on different streams run
// concurrently. Built with:
//   g++ -shared -fPIC -include kernels/testdata/emu.h -I kernels -I <cuda pkg>
#include "allreduce.cu"
#include "copy.cu"
#include "nvls.cu"
#include "p2p.cu"

#include "dispatch.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

thread_local gs_emu_dim3 threadIdx, blockIdx, blockDim, gridDim;

enum { OK = 0, INVALID_VALUE = 1, NOT_FOUND = 500, NOT_READY = 600, NOT_SUPPORTED = 801 };

// ---- streams ------------------------------------------------------------------

static int device_of_current();
struct CUstream_st;
// every stream made by cuStreamCreate, for cuCtxSynchronize (by device)
static std::mutex streams_mu;
static std::vector<CUstream_st *> live_streams;

struct CUstream_st {
	std::mutex mu;
	std::condition_variable cv;
	std::deque<std::function<void()>> q;
	bool busy = false, stop = false;
	std::thread worker;
	int device = device_of_current();
	CUstream_st() {
		worker = std::thread([this] {
			std::unique_lock<std::mutex> l(mu);
			for (;;) {
				cv.wait(l, [this] { return stop || !q.empty(); });
				if (q.empty())
					return;
				auto f = std::move(q.front());
				q.pop_front();
				busy = true;
				l.unlock();
				f();
				l.lock();
				busy = false;
				cv.notify_all();
			}
		});
	}
	void push(std::function<void()> f) {
		std::lock_guard<std::mutex> l(mu);
		q.push_back(std::move(f));
		cv.notify_all();
	}
	void drain() {
		std::unique_lock<std::mutex> l(mu);
		cv.wait(l, [this] { return q.empty() && !busy; });
	}
	~CUstream_st() {
		{
			std::lock_guard<std::mutex> l(streams_mu);
			live_streams.erase(std::remove(live_streams.begin(), live_streams.end(), this), live_streams.end());
		}
		{
			std::lock_guard<std::mutex> l(mu);
			stop = true;
			cv.notify_all();
		}
		worker.join();
	}
};

static CUstream_st *legacy() {
	static CUstream_st *s = new CUstream_st;
	return s;
}
static CUstream_st *stream_of(CUstream s) { return s ? s : legacy(); }

// One cuEventRecord: complete once its stream reached it. As on a GPU, a
// wait (cuStreamWaitEvent, cuEventSynchronize) is for the record that was
// the event's latest at the call, whatever the event is recorded on later:
// records of one event on different streams complete in any order (the
// engine's deferral events are recorded again on another caller's stream
// while the internal stream's wait for the previous record is still
// queued), so one "last completed" count per event would go back and leave
// a wait for a later record waiting for good, or release a wait for an
// earlier record before that record's stream reached it.
struct EventRecord {
	std::mutex mu;
	std::condition_variable cv;
	bool done = false;
	std::chrono::steady_clock::time_point at;
	void complete() {
		std::lock_guard<std::mutex> l(mu);
		done = true;
		at = std::chrono::steady_clock::now();
		cv.notify_all();
	}
	void wait() {
		std::unique_lock<std::mutex> l(mu);
		cv.wait(l, [this] { return done; });
	}
	bool completed() {
		std::lock_guard<std::mutex> l(mu);
		return done;
	}
};

struct CUevent_st {
	std::mutex mu;
	std::shared_ptr<EventRecord> last; // the latest record; null: never recorded (waits return at once)
	std::shared_ptr<EventRecord> latest() {
		std::lock_guard<std::mutex> l(mu);
		return last;
	}
};

// ---- memory -------------------------------------------------------------------

static std::mutex mem_mu;
struct Alloc {
	size_t size;
	int device;
};
static std::map<uintptr_t, Alloc> allocs; // cuMemAlloc'd and VMM-mapped ranges
thread_local CUcontext current;

struct CUctx_st {
	int device;
};
enum { NDEV = 4 }; // simulated ranks of the gobackend tests run at up to 4
static CUctx_st contexts[NDEV] = {{0}, {1}, {2}, {3}};
static int device_of_current() { return current ? current->device : 0; }

struct Phys { // a VMM allocation: a memfd
	int fd;
	size_t size;
	int device;
};
static std::map<CUmemGenericAllocationHandle, Phys> phys;
static CUmemGenericAllocationHandle next_handle = 1;

// ---- kernels --------------------------------------------------------------------

struct CUmod_st {
	int dummy;
};
struct CUfunc_st {
	const char *name;
	void (*run)(void *fn, void *param);
	void *fn;
	size_t param_size;
	bool threaded = false;   // a block's threads run concurrently (they talk to each other)
	bool concurrent = false; // so do all blocks of a launch (they wait on each other)
};

template <class P> static void invoke(void *fn, void *param) {
	((void (*)(P))fn)(*(P *)param);
}

// A kernel f taking a P: its name, how to call it, and its parameter's size.
#define FN(f, P) #f, invoke<P>, (void *)f, sizeof(P)
#define AR(a, t, o) {FN(gs_##a##_##t##_##o, gs_ar_params)},
#define AR_OPS(a, t) AR(a, t, sum) AR(a, t, prod) AR(a, t, min) AR(a, t, max)
// one-shot and two-shot: a rank's closing barrier must follow every thread's reads of
// its peers' stagings, or a peer's next op overwrites what a later thread has yet to read
#define AR_THR(a, t, o) {FN(gs_##a##_##t##_##o, gs_ar_params), true},
#define AR_THR_OPS(a, t) AR_THR(a, t, sum) AR_THR(a, t, prod) AR_THR(a, t, min) AR_THR(a, t, max)
#define AR_ONESHOT(t, T) AR_THR_OPS(oneshot, t)
#define AR_TWOSHOT(t, T) AR_THR_OPS(twoshot, t)
#define AR_PULL(t, T) AR_OPS(pull, t)
#define AR_LL(t, T) AR_OPS(ll, t)
// gs_arpush: a rank's fold waits for every thread of its peers' blocks to have pushed
#define AR_CONC(a, t, o) {FN(gs_##a##_##t##_##o, gs_ar_params), true, true},
#define AR_ARPUSH(t, T) AR_CONC(arpush, t, sum) AR_CONC(arpush, t, prod) AR_CONC(arpush, t, min) AR_CONC(arpush, t, max)
#define NVLS(t, o) {FN(gs_nvls_##t##_##o, gs_nvls_params)},
static CUfunc_st functions[] = {
    GS_AR_TYPES(AR_ONESHOT) GS_AR_TYPES(AR_TWOSHOT) GS_AR_TYPES(AR_PULL) GS_AR_TYPES(AR_LL)
    GS_AR_TYPES(AR_ARPUSH)
    {FN(gs_copy, gs_copy_params), true},
    {FN(gs_copy_steps, gs_steps_params), true},
    {FN(gs_llmove, gs_llmove_params)},
    {FN(gs_bcast_relay, gs_relay_params)},
    {FN(gs_barrier, gs_barrier_params)},
    {FN(gs_sema_wait, gs_sema_params)},
    NVLS(f32, sum) NVLS(f16, sum) NVLS(f16, min) NVLS(f16, max) NVLS(bf16, sum) NVLS(bf16, min)
    NVLS(bf16, max)
    {FN(gs_p2p_send, gs_p2p_params), true},
    {FN(gs_p2p_recv, gs_p2p_params), true},
    {FN(gs_a2av, gs_a2av_params), true, true},
};

// This driver has no multicast: an NVLS kernel that runs anyway stops the
// process (cudacheck only loads them and looks them up).
char *gs_emu_mc_peer(const void *, int) {
	fprintf(stderr, "fakecuda: an NVLS kernel ran; there is no multicast here\n");
	abort();
}
int gs_emu_mc_world(const void *) { return 0; }

// ---- the API ----------------------------------------------------------------------

extern "C" {

CUresult cuInit(unsigned int) { return OK; }
CUresult cuDriverGetVersion(int *v) {
	*v = 13000;
	return OK;
}
CUresult cuGetErrorString(CUresult, const char **s) {
	*s = "fake error";
	return OK;
}
CUresult cuGetErrorName(CUresult, const char **s) {
	*s = "FAKE_ERROR";
	return OK;
}
CUresult cuDeviceGetCount(int *n) {
	*n = NDEV;
	return OK;
}
CUresult cuDeviceGet(CUdevice *d, int ordinal) {
	if (ordinal < 0 || ordinal >= NDEV)
		return 101;
	*d = ordinal;
	return OK;
}
CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice) {
	switch (a) {
	case 75: *v = 9; break;   // compute capability 9.0
	case 76: *v = 0; break;
	case 16: *v = 132; break; // SMs
	case 102: case 103: case 41: *v = 1; break;
	case 132: *v = 1; break;  // multicast "supported": the gate must still say no
	default: *v = 0;
	}
	return OK;
}
CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
	snprintf(name, len, "Fake GPU %d", d);
	return OK;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
	*c = &contexts[d];
	return OK;
}
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice) { return OK; }
CUresult cuCtxGetCurrent(CUcontext *c) {
	*c = current;
	return OK;
}
CUresult cuCtxSetCurrent(CUcontext c) {
	current = c;
	return OK;
}

CUresult cuModuleLoadData(CUmodule *m, const void *image) {
	if (memcmp(image, "\x7f" "ELF", 4) != 0) // gosym hands over CUBINs
		return 200;
	*m = new CUmod_st{0};
	return OK;
}
CUresult cuModuleUnload(CUmodule m) {
	delete m;
	return OK;
}
CUresult cuModuleGetFunction(CUfunction *f, CUmodule, const char *name) {
	for (auto &fn : functions)
		if (strcmp(fn.name, name) == 0) {
			*f = &fn;
			return OK;
		}
	return NOT_FOUND;
}
CUresult cuFuncGetAttribute(int *v, CUfunction_attribute, CUfunction) {
	*v = 0;
	return OK;
}

static CUresult launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                       unsigned bz, CUstream s, void **params);

// FAKECUDA_LAUNCHES=dependent refuses plain launches, =plain refuses
// programmatic dependents: a test shows which way every launch of the
// engine went. A dependent's overlap with the kernel before it is not
// emulated (a stream runs its launches one after another; the kernels'
// griddepcontrol.wait is not compiled for the host).
static bool refuse_launch(const char *kind) {
	static const char *want = getenv("FAKECUDA_LAUNCHES");
	return want && strcmp(want, kind) != 0;
}

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned, CUstream s, void **params, void **) {
	if (refuse_launch("plain"))
		return INVALID_VALUE;
	return launch(f, gx, gy, gz, bx, by, bz, s, params);
}

// The configuration must be what the driver takes: known attributes only,
// programmatic stream serialization 0 or 1.
CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
	if (!c || extra || (c->numAttrs && !c->attrs))
		return INVALID_VALUE;
	bool dependent = false;
	for (unsigned i = 0; i < c->numAttrs; i++) {
		const CUlaunchAttribute &a = c->attrs[i];
		if (a.id != GSCU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION ||
		    (unsigned)a.value.programmaticStreamSerializationAllowed > 1)
			return INVALID_VALUE;
		dependent = a.value.programmaticStreamSerializationAllowed;
	}
	if (refuse_launch(dependent ? "dependent" : "plain"))
		return INVALID_VALUE;
	return launch(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY, c->blockDimZ,
	              c->hStream, params);
}

static CUresult launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                       unsigned bz, CUstream s, void **params) {
	if (!current)
		return 201; // CUDA_ERROR_INVALID_CONTEXT: gosym must set one
	if (gy != 1 || gz != 1 || by != 1 || bz != 1 || bx > 1024 || gx == 0)
		return INVALID_VALUE;
	if (f->threaded) // FAKECUDA_P2P_THREADS: fewer OS threads per block
		if (const char *v = getenv("FAKECUDA_P2P_THREADS"))
			bx = std::min(bx, (unsigned)std::max(32, atoi(v)));
	std::string p((const char *)params[0], f->param_size); // copied now, like the driver
	static const bool skip = getenv("FAKECUDA_SKIP_KERNELS") != nullptr;
	if (skip) // the engine's host path alone (gobackend's BenchmarkPostCUDA): no kernel runs
		return OK;
	stream_of(s)->push([f, gx, bx, p] {
		std::string local = p;
		auto thread = [&](unsigned b, unsigned t, gs_emu_block *blk) {
			gridDim = {gx, 1, 1};
			blockDim = {bx, 1, 1};
			blockIdx = {b, 0, 0};
			threadIdx = {t, 0, 0};
			gs_emu_blk = blk;
			f->run(f->fn, &local[0]);
		};
		if (f->concurrent) { // every thread of every block at once
			std::deque<gs_emu_block> blks(gx);
			std::vector<std::thread> th;
			th.reserve((size_t)gx * bx);
			for (unsigned b = 0; b < gx; ++b) {
				blks[b].n = bx;
				for (unsigned t = 0; t < bx; ++t)
					th.emplace_back(thread, b, t, &blks[b]);
			}
			for (auto &x : th)
				x.join();
			return;
		}
		for (unsigned b = 0; b < gx; ++b) {
			if (!f->threaded) {
				for (unsigned t = 0; t < bx; ++t)
					thread(b, t, nullptr);
				continue;
			}
			gs_emu_block blk;
			blk.n = bx;
			std::vector<std::thread> th;
			for (unsigned t = 0; t < bx; ++t)
				th.emplace_back(thread, b, t, &blk);
			for (auto &x : th)
				x.join();
		}
	});
	return OK;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
	void *m = aligned_alloc(256, (n + 255) / 256 * 256);
	if (!m)
		return 2;
	std::lock_guard<std::mutex> l(mem_mu);
	allocs[(uintptr_t)m] = {n, device_of_current()};
	*p = (CUdeviceptr)m;
	return OK;
}
CUresult cuMemFree_v2(CUdeviceptr p) {
	std::lock_guard<std::mutex> l(mem_mu);
	if (!allocs.erase(p))
		return INVALID_VALUE;
	free((void *)p);
	return OK;
}
// Pinned host memory (the engine's host-visible error words): heap memory,
// its device address the host one, as with unified addressing.
CUresult cuMemHostAlloc(void **p, size_t n, unsigned int flags) {
	(void)flags;
	*p = calloc(1, n);
	return *p ? OK : 2;
}
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned int flags) {
	(void)flags;
	*d = (CUdeviceptr)p;
	return OK;
}
CUresult cuMemFreeHost(void *p) {
	free(p);
	return OK;
}
CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) {
	memcpy((void *)d, s, n);
	return OK;
}
CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) {
	memcpy(d, (const void *)s, n);
	return OK;
}
static bool find_alloc(CUdeviceptr p, uintptr_t *base, Alloc *a);
// FAKECUDA_LOCAL_COPY_DELAY_MS=n: an asynchronous copy within one device's
// memory waits n ms on its stream first, so a test sees whether whatever
// must follow it (a join of streams) does.
static int local_copy_delay_ms(CUdeviceptr d, CUdeviceptr s) {
	static const char *v = getenv("FAKECUDA_LOCAL_COPY_DELAY_MS");
	uintptr_t b;
	Alloc ad, as;
	if (!v || !find_alloc(d, &b, &ad) || !find_alloc(s, &b, &as) || ad.device != as.device)
		return 0;
	return atoi(v);
}
CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) {
	const int delay = local_copy_delay_ms(d, s);
	stream_of(st)->push([=] {
		if (delay > 0)
			std::this_thread::sleep_for(std::chrono::milliseconds(delay));
		memcpy((void *)d, (const void *)s, n);
	});
	return OK;
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) {
	return cuMemcpyAsync(d, s, n, st);
}
CUresult cuMemsetD32Async(CUdeviceptr d, unsigned v, size_t n, CUstream st) {
	stream_of(st)->push([=] {
		for (size_t i = 0; i < n; ++i)
			((unsigned *)d)[i] = v;
	});
	return OK;
}

CUresult cuStreamCreate(CUstream *s, unsigned) {
	*s = new CUstream_st;
	std::lock_guard<std::mutex> l(streams_mu);
	live_streams.push_back(*s);
	return OK;
}
// cuCtxSynchronize waits for every stream made on the current context's
// device (the legacy stream, shared by the fake's devices, apart), as a
// GPU's waits for all of its context's work.
CUresult cuCtxSynchronize(void) {
	int d = device_of_current();
	std::lock_guard<std::mutex> l(streams_mu);
	for (CUstream_st *s : live_streams)
		if (s->device == d)
			s->drain();
	return OK;
}
CUresult cuStreamDestroy_v2(CUstream s) {
	s->drain();
	delete s;
	return OK;
}
CUresult cuStreamSynchronize(CUstream s) {
	stream_of(s)->drain();
	return OK;
}
CUresult cuStreamGetCaptureInfo_v2(CUstream, int *st, cuuint64_t *id, void **, const void **, size_t *) {
	*st = 0; // the fake never captures
	*id = 0;
	return OK;
}
CUresult cuEventCreate(CUevent *e, unsigned) {
	*e = new CUevent_st;
	return OK;
}
CUresult cuEventDestroy_v2(CUevent e) {
	delete e;
	return OK;
}
// The stream's work holds the record, not the event: an event may be
// destroyed while its record is pending, as on a GPU.
CUresult cuEventRecord(CUevent e, CUstream s) {
	auto r = std::make_shared<EventRecord>();
	{
		std::lock_guard<std::mutex> l(e->mu);
		e->last = r;
	}
	stream_of(s)->push([r] { r->complete(); });
	return OK;
}
CUresult cuEventSynchronize(CUevent e) {
	if (auto r = e->latest())
		r->wait();
	return OK;
}
CUresult cuEventQuery(CUevent e) {
	auto r = e->latest();
	return !r || r->completed() ? OK : NOT_READY;
}
CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b) {
	auto ra = a->latest(), rb = b->latest();
	if (!ra || !rb)
		return INVALID_VALUE;
	if (!ra->completed() || !rb->completed())
		return NOT_READY;
	*ms = std::chrono::duration<float, std::milli>(rb->at - ra->at).count();
	return OK;
}
CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned) {
	if (auto r = e->latest()) // the latest record now, not when the stream gets there
		stream_of(s)->push([r] { r->wait(); });
	return OK;
}

static bool find_alloc(CUdeviceptr p, uintptr_t *base, Alloc *a) {
	std::lock_guard<std::mutex> l(mem_mu);
	auto it = allocs.upper_bound(p);
	if (it == allocs.begin())
		return false;
	--it;
	if (p >= it->first + it->second.size)
		return false;
	*base = it->first;
	*a = it->second;
	return true;
}
CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attr, CUdeviceptr p) {
	uintptr_t base;
	Alloc a;
	if (!find_alloc(p, &base, &a))
		return INVALID_VALUE;
	if (attr != 9) // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
		return NOT_SUPPORTED;
	*(int *)data = a.device;
	return OK;
}
CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
	uintptr_t b;
	Alloc a;
	if (!find_alloc(p, &b, &a))
		return INVALID_VALUE;
	*base = b;
	*size = a.size;
	return OK;
}
CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p) {
	memset(h, 0, sizeof *h);
	memcpy(h->reserved, &p, sizeof p);
	return OK;
}
// Legacy IPC within this process (the simulated ranks of the gobackend
// tests share it): the handle carries the address, which opens as itself.
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned) {
	CUdeviceptr q;
	memcpy(&q, h.reserved, sizeof q);
	uintptr_t base;
	Alloc a;
	if (!find_alloc(q, &base, &a) || base != q)
		return INVALID_VALUE;
	*p = q;
	return OK;
}
CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
	uintptr_t base;
	Alloc a;
	return find_alloc(p, &base, &a) ? OK : INVALID_VALUE;
}

// ---- VMM ----------------------------------------------------------------------------

CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *, int) {
	*g = 2 << 20;
	return OK;
}
CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long) {
	if (size % (2 << 20) || prop->type != 1 || prop->location.type != 1)
		return INVALID_VALUE;
	int fd = memfd_create("fakecuda", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)size) != 0)
		return 2;
	std::lock_guard<std::mutex> l(mem_mu);
	*h = next_handle++;
	phys[*h] = {fd, size, prop->location.id};
	return OK;
}
CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
	std::lock_guard<std::mutex> l(mem_mu);
	auto it = phys.find(h);
	if (it == phys.end())
		return INVALID_VALUE;
	close(it->second.fd);
	phys.erase(it);
	return OK;
}
// Not modelled: the mappings do not record their handles.
CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *, void *) { return NOT_SUPPORTED; }
CUresult cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle h, int type,
                                      unsigned long long) {
	std::lock_guard<std::mutex> l(mem_mu);
	auto it = phys.find(h);
	if (it == phys.end() || type != 1)
		return INVALID_VALUE;
	*(int *)out = dup(it->second.fd);
	return OK;
}
CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os, int type) {
	int fd = (int)(uintptr_t)os;
	off_t size = lseek(fd, 0, SEEK_END);
	if (type != 1 || size <= 0)
		return INVALID_VALUE;
	std::lock_guard<std::mutex> l(mem_mu);
	*h = next_handle++;
	phys[*h] = {dup(fd), (size_t)size, -1};
	return OK;
}
CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t, CUdeviceptr, unsigned long long) {
	void *m = mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (m == MAP_FAILED)
		return 2;
	*p = (CUdeviceptr)m;
	return OK;
}
CUresult cuMemAddressFree(CUdeviceptr p, size_t size) {
	return munmap((void *)p, size) == 0 ? OK : INVALID_VALUE;
}
CUresult cuMemMap(CUdeviceptr p, size_t size, size_t off, CUmemGenericAllocationHandle h,
                  unsigned long long) {
	std::lock_guard<std::mutex> l(mem_mu);
	auto it = phys.find(h);
	if (it == phys.end() || off + size > it->second.size)
		return INVALID_VALUE;
	void *m = mmap((void *)p, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, it->second.fd, (off_t)off);
	if (m == MAP_FAILED)
		return INVALID_VALUE;
	allocs[p] = {size, it->second.device};
	return OK;
}
CUresult cuMemUnmap(CUdeviceptr p, size_t size) {
	std::lock_guard<std::mutex> l(mem_mu);
	allocs.erase(p);
	void *m = mmap((void *)p, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
	return m == MAP_FAILED ? INVALID_VALUE : OK;
}
CUresult cuMemSetAccess(CUdeviceptr, size_t, const CUmemAccessDesc *desc, size_t count) {
	for (size_t i = 0; i < count; ++i)
		if (desc[i].location.type != 1 || desc[i].flags != 3)
			return INVALID_VALUE;
	return OK;
}

// ---- stream memory operations ---------------------------------------------------------

static bool satisfied(unsigned v, unsigned want, unsigned flags) {
	switch (flags & 0xf) {
	case 0: return (int)(v - want) >= 0;
	case 1: return v == want;
	case 2: return (v & want) != 0;
	default: return ~(v | want) != 0;
	}
}
CUresult cuStreamWriteValue32_v2(CUstream s, CUdeviceptr p, cuuint32_t v, unsigned) {
	stream_of(s)->push([=] { __atomic_store_n((unsigned *)p, v, __ATOMIC_SEQ_CST); });
	return OK;
}
CUresult cuStreamWaitValue32_v2(CUstream s, CUdeviceptr p, cuuint32_t v, unsigned flags) {
	stream_of(s)->push([=] {
		while (!satisfied(__atomic_load_n((unsigned *)p, __ATOMIC_SEQ_CST), v, flags))
			std::this_thread::yield();
	});
	return OK;
}
CUresult cuStreamBatchMemOp_v2(CUstream s, unsigned n, CUstreamBatchMemOpParams *ops, unsigned) {
	for (unsigned i = 0; i < n; ++i) {
		const auto &o = ops[i].value;
		CUresult r = o.operation == 1 ? cuStreamWaitValue32_v2(s, o.address, o.v.value, o.flags) :
		             o.operation == 2 ? cuStreamWriteValue32_v2(s, o.address, o.v.value, o.flags) :
		                                INVALID_VALUE;
		if (r != OK)
			return r;
	}
	return OK;
}

// ---- cuGetProcAddress -------------------------------------------------------------------

struct Proc {
	const char *name;
	void *fn;
};
#define P(base, fn) {base, (void *)fn},
static const Proc procs[] = {
    P("cuInit", cuInit) P("cuDriverGetVersion", cuDriverGetVersion)
    P("cuGetErrorString", cuGetErrorString) P("cuGetErrorName", cuGetErrorName)
    P("cuDeviceGetCount", cuDeviceGetCount) P("cuDeviceGet", cuDeviceGet)
    P("cuDeviceGetAttribute", cuDeviceGetAttribute) P("cuDeviceGetName", cuDeviceGetName)
    P("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain)
    P("cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease_v2)
    P("cuCtxGetCurrent", cuCtxGetCurrent) P("cuCtxSetCurrent", cuCtxSetCurrent)
    P("cuModuleLoadData", cuModuleLoadData) P("cuModuleUnload", cuModuleUnload)
    P("cuModuleGetFunction", cuModuleGetFunction) P("cuFuncGetAttribute", cuFuncGetAttribute)
    P("cuLaunchKernel", cuLaunchKernel) P("cuLaunchKernelEx", cuLaunchKernelEx) P("cuMemAlloc", cuMemAlloc_v2) P("cuMemFree", cuMemFree_v2)
    P("cuMemcpyHtoD", cuMemcpyHtoD_v2) P("cuMemcpyDtoH", cuMemcpyDtoH_v2)
    P("cuMemHostAlloc", cuMemHostAlloc) P("cuMemHostGetDevicePointer", cuMemHostGetDevicePointer_v2)
    P("cuMemFreeHost", cuMemFreeHost)
    P("cuMemcpyAsync", cuMemcpyAsync) P("cuMemcpyDtoDAsync", cuMemcpyDtoDAsync_v2)
    P("cuMemsetD32Async", cuMemsetD32Async) P("cuStreamCreate", cuStreamCreate)
    P("cuStreamDestroy", cuStreamDestroy_v2) P("cuStreamSynchronize", cuStreamSynchronize)
    P("cuStreamGetCaptureInfo", cuStreamGetCaptureInfo_v2)
    P("cuStreamWaitEvent", cuStreamWaitEvent) P("cuEventCreate", cuEventCreate)
    P("cuEventRecord", cuEventRecord) P("cuEventSynchronize", cuEventSynchronize)
    P("cuEventQuery", cuEventQuery) P("cuEventElapsedTime", cuEventElapsedTime)
    P("cuEventDestroy", cuEventDestroy_v2) P("cuPointerGetAttribute", cuPointerGetAttribute)
    P("cuMemGetAddressRange", cuMemGetAddressRange_v2) P("cuIpcGetMemHandle", cuIpcGetMemHandle)
    P("cuIpcOpenMemHandle", cuIpcOpenMemHandle_v2) P("cuIpcCloseMemHandle", cuIpcCloseMemHandle)
    P("cuMemCreate", cuMemCreate) P("cuMemRelease", cuMemRelease)
    P("cuMemRetainAllocationHandle", cuMemRetainAllocationHandle)
    P("cuMemExportToShareableHandle", cuMemExportToShareableHandle)
    P("cuMemImportFromShareableHandle", cuMemImportFromShareableHandle)
    P("cuMemAddressReserve", cuMemAddressReserve) P("cuMemAddressFree", cuMemAddressFree)
    P("cuMemMap", cuMemMap) P("cuMemUnmap", cuMemUnmap) P("cuMemSetAccess", cuMemSetAccess)
    P("cuMemGetAllocationGranularity", cuMemGetAllocationGranularity)
    P("cuStreamWriteValue32", cuStreamWriteValue32_v2) P("cuStreamWaitValue32", cuStreamWaitValue32_v2)
    P("cuStreamBatchMemOp", cuStreamBatchMemOp_v2)
};

int fake_getproc_calls;
int fake_multicast_lookups;

// FAKECUDA_NO_GETPROC=1 makes every lookup fail, so the loader falls back to
// the versioned dlsym names.
CUresult cuGetProcAddress_v2(const char *name, void **fn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status) {
	__atomic_add_fetch(&fake_getproc_calls, 1, __ATOMIC_SEQ_CST);
	*fn = nullptr;
	*status = 1; // SYMBOL_NOT_FOUND
	if (strncmp(name, "cuMulticast", 11) == 0) {
		fprintf(stderr, "fakecuda: multicast symbol %s looked up\n", name);
		__atomic_add_fetch(&fake_multicast_lookups, 1, __ATOMIC_SEQ_CST);
	}
	const char *off = getenv("FAKECUDA_NO_GETPROC");
	if ((off && *off == '1') || version < 12000 || flags != 1)
		return NOT_FOUND;
	for (const auto &p : procs)
		if (strcmp(p.name, name) == 0) {
			*fn = p.fn;
			*status = 0;
			return OK;
		}
	return NOT_FOUND;
}

} // extern "C"
