/*
 * gosym.h - the only public header of libgosym.so.
 *
 * A stable C ABI over gosym's Go engine. Conventions:
 *  - every function returns int32_t status (GOSYM_OK == 0, negative on error)
 *    except gosym_abi_version and gosym_last_error;
 *  - on error, gosym_last_error() returns a thread-local, NUL-terminated
 *    message that stays valid until the next gosym call on the same thread;
 *  - handles are uint64_t, 0 is never a valid handle, every call validates them;
 *  - memory addresses are uint64_t; buffers are owned by the caller;
 *  - no callback ever goes from gosym into the caller.
 *
 * The ABI version is bumped on every incompatible change; callers must check
 * gosym_abi_version() == GOSYM_ABI_VERSION after loading the library.
 */
#ifndef GOSYM_H
#define GOSYM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GOSYM_ABI_VERSION 1u

/* Status codes (mirrored from gobackend's Status const block). */
#define GOSYM_OK 0
#define GOSYM_ERR_INVALID_ARG (-1)   /* bad argument: maps to ValueError    */
#define GOSYM_ERR_INVALID_HANDLE (-2) /* unknown or released handle          */
#define GOSYM_ERR_TIMEOUT (-3)       /* a peer did not arrive in time       */
#define GOSYM_ERR_PEER (-4)          /* a peer died or broke the protocol   */
#define GOSYM_ERR_MISMATCH (-5)      /* ranks disagree on an op's arguments */
#define GOSYM_ERR_NOT_SUPPORTED (-6) /* op/dtype/device not supported       */
#define GOSYM_ERR_SYSTEM (-7)        /* a syscall or driver call failed     */
#define GOSYM_ERR_INTERNAL (-8)      /* a bug: recovered panic              */
#define GOSYM_ERR_NOT_READY (-9)     /* gosym_work_test: still running      */
#define GOSYM_ERR_CLOSED (-10)       /* the endpoint was destroyed/aborted  */

/* Element types (values are gosym's own, not torch's). */
#define GOSYM_DTYPE_FLOAT32 0
#define GOSYM_DTYPE_FLOAT64 1
#define GOSYM_DTYPE_FLOAT16 2
#define GOSYM_DTYPE_BFLOAT16 3
#define GOSYM_DTYPE_INT8 4
#define GOSYM_DTYPE_UINT8 5
#define GOSYM_DTYPE_INT16 6
#define GOSYM_DTYPE_INT32 7
#define GOSYM_DTYPE_INT64 8
#define GOSYM_DTYPE_BOOL 9
#define GOSYM_DTYPE_FLOAT8_E4M3FN 10 /* reduced on CUDA tensors only */
#define GOSYM_DTYPE_FLOAT8_E5M2 11   /* reduced on CUDA tensors only */

/* Reduction operators. */
#define GOSYM_RED_SUM 0
#define GOSYM_RED_AVG 1
#define GOSYM_RED_PRODUCT 2
#define GOSYM_RED_MIN 3
#define GOSYM_RED_MAX 4
#define GOSYM_RED_PREMUL_SUM 5
#define GOSYM_RED_BAND 6
#define GOSYM_RED_BOR 7
#define GOSYM_RED_BXOR 8

/* Operations a gosym_op_desc can describe. */
#define GOSYM_OP_BARRIER 0
#define GOSYM_OP_ALLREDUCE 1
#define GOSYM_OP_REDUCE 2
#define GOSYM_OP_BROADCAST 3
#define GOSYM_OP_ALLGATHER 4
#define GOSYM_OP_REDUCE_SCATTER 5
#define GOSYM_OP_ALLTOALL 6
#define GOSYM_OP_GATHER 7
#define GOSYM_OP_SCATTER 8
#define GOSYM_OP_SEND 9
#define GOSYM_OP_RECV 10

/* The peer of a RECV from any source (host memory only). */
#define GOSYM_ANY_SOURCE (-1)

/* One contiguous piece of memory: address and element count. */
typedef struct gosym_piece {
  uint64_t addr;
  uint64_t count;
} gosym_piece;

/*
 * An operation. Which fields are read depends on op:
 *  ALLREDUCE/REDUCE/BROADCAST: in_addr, out_addr, count (in-place when equal).
 *  ALLGATHER:      in_addr+count; out_pieces[world] (one per source rank).
 *  REDUCE_SCATTER: in_pieces[world] (piece r is reduced into rank r);
 *                  out_addr+count.
 *  ALLTOALL:       in_pieces[world] (sent to rank r), out_pieces[world]
 *                  (received from rank r); counts may differ and be 0.
 *  Even split (n_in and n_out 0; saves the caller building pieces): ALLTOALL
 *  sends count elements to every rank r from in_addr + r*count elements and
 *  receives count from every rank r at out_addr + r*count; ALLGATHER puts
 *  rank r's count elements at out_addr + r*count; REDUCE_SCATTER reduces
 *  in_addr + r*count elements (count of them) into rank r.
 *  GATHER:         in_addr+count; out_pieces[world] on the root only.
 *  SCATTER:        in_pieces[world] on the root only; out_addr+count.
 *  SEND/RECV:      in_addr (send) or out_addr (recv), count, peer, tag.
 *                  A host RECV with peer GOSYM_ANY_SOURCE takes the first
 *                  message with its tag from any rank that no RECV naming
 *                  that rank wants; when in_addr is not 0, the sender's rank
 *                  is stored there (an int32_t) before the work completes.
 * Element size comes from dtype; counts are in elements.
 *
 * device/stream: device -1 means host memory (stream is ignored, pass 0).
 * device >= 0 names the CUDA device (ordinal) holding every buffer of the op;
 * the op is then enqueued on stream (a CUstream, 0: the legacy default
 * stream) before gosym_op_post returns, and its work is complete on the host
 * at once: the stream carries the ordering. Every op runs on CUDA memory.
 * CUDA SEND and RECV go over a channel of the two ranks: a pair's CUDA
 * messages match in the order they were posted, one direction at a time,
 * and size and tag must agree; a SEND enqueued on a stream waits on the GPU,
 * never on the host, once it is a few MiB ahead of its RECV, so sends and
 * receives belong on different streams. The first CUDA SEND/RECV of a pair
 * sets the channel up with the peer and must not be captured. flags:
 * GOSYM_OP_CAPTURING says the stream is being captured into a CUDA graph
 * (the op then prefers the kernels that replay fastest); a collective
 * asks the driver itself (cuStreamGetCaptureInfo) whatever the flag says, a
 * SEND/RECV relies on it.
 */
#define GOSYM_OP_CAPTURING 1
typedef struct gosym_op_desc {
  uint32_t struct_size; /* sizeof(gosym_op_desc), for forward compatibility */
  int32_t op;
  int32_t dtype;
  int32_t red_op;
  double scale; /* PREMUL_SUM factor */
  int32_t root;
  int32_t peer;
  int64_t tag;
  uint64_t count;
  uint64_t in_addr;
  uint64_t out_addr;
  const gosym_piece *in_pieces;
  const gosym_piece *out_pieces;
  int32_t n_in;
  int32_t n_out;
  uint64_t stream; /* CUstream of a CUDA op */
  int32_t device;  /* CUDA device ordinal, -1: host memory */
  int32_t flags;   /* GOSYM_OP_* bits; 0 for host ops */
} gosym_op_desc;

/* Library. */
uint32_t gosym_abi_version(void);
const char *gosym_last_error(void);
/* Version string of the engine, copied into buf (NUL-terminated). */
int32_t gosym_version(char *buf, uint64_t cap);

/*
 * Endpoint: one per process group. Bootstrap is three steps driven by the
 * caller: create (local only), exchange the local blobs of all ranks through
 * an out-of-band allgather, connect (authenticates peers, shares memory).
 */
int32_t gosym_endpoint_create(int32_t rank, int32_t size, int64_t timeout_ms,
                              const char *name, uint64_t *out_endpoint);
/* The local bootstrap blob; *len receives its size even if cap is short. */
int32_t gosym_endpoint_blob(uint64_t endpoint, uint8_t *buf, uint64_t cap,
                            uint64_t *len);
/* blobs: concatenation of all ranks' blobs in rank order; lens[size]. */
int32_t gosym_endpoint_connect(uint64_t endpoint, const uint8_t *blobs,
                               const uint64_t *lens, int32_t n);
/* Releases everything the endpoint owns; outstanding work fails. */
int32_t gosym_endpoint_destroy(uint64_t endpoint);
/* Counters and settings as a JSON object, copied into buf. */
int32_t gosym_endpoint_stats(uint64_t endpoint, char *buf, uint64_t cap,
                             uint64_t *len);
/* GOSYM_OK, or the error a CUDA kernel of the group recorded on this rank
 * (GOSYM_ERR_TIMEOUT: a peer did not arrive; the message names it). Reads
 * host memory only: call it after waiting on the GPU. */
int32_t gosym_endpoint_device_error(uint64_t endpoint);
/* Ends this rank's CUDA work on the group at once, as NCCL's abort does: the
 * group breaks with an error that quotes why (every later op fails with it,
 * GOSYM_ERR_PEER), and this rank's kernels, running and enqueued, give up,
 * their outputs undefined. Destroy the endpoint after it. */
int32_t gosym_endpoint_abort_cuda(uint64_t endpoint, const char *why);

/* Work: one posted operation. */
int32_t gosym_op_post(uint64_t endpoint, const gosym_op_desc *desc,
                      uint64_t *out_work);
/* Blocks up to timeout_ms (<0: the endpoint's timeout). */
int32_t gosym_work_wait(uint64_t work, int64_t timeout_ms);
/* GOSYM_OK when done without error, GOSYM_ERR_NOT_READY while running. */
int32_t gosym_work_test(uint64_t work);
int32_t gosym_work_release(uint64_t work);
/*
 * wait + release in one call: once the work is done, its handle is released
 * and its status returned; if timeout_ms (<0: none) passes first, the handle
 * stays live and GOSYM_ERR_NOT_READY is returned.
 */
int32_t gosym_work_finish(uint64_t work, int64_t timeout_ms);
/*
 * post + wait + release in one call, for callers that wait at once: blocks
 * until the operation is done (it has the endpoint's timeout) and returns its
 * status. No work handle is issued.
 */
int32_t gosym_op_run(uint64_t endpoint, const gosym_op_desc *desc);

/*
 * Memory registration (the domain: one per process). A memh handle names a
 * registered range. mem_map talks to no peer: a group binds the enclosing
 * shareable region lazily, on the first collective that uses it.
 */
/* Shareable host memory (memfd); *out_addr receives its address. */
int32_t gosym_mem_alloc(uint64_t nbytes, uint64_t *out_memh, uint64_t *out_addr);
/* Registers [addr, addr+nbytes) on device (-1: host memory). */
int32_t gosym_mem_map(uint64_t addr, uint64_t nbytes, int32_t device,
                      uint64_t *out_memh);
/* Unregisters and releases the handle; unknown handles are an error. */
int32_t gosym_mem_unmap(uint64_t memh);
/* A versioned, bounds-checked blob another process can import. */
int32_t gosym_mem_pack(uint64_t memh, uint8_t *buf, uint64_t cap,
                       uint64_t *len);
/* Maps a blob packed by another process of this host (timeout_ms<=0: default).
 * A blob of CUDA memory needs mem_import_on. */
int32_t gosym_mem_import(const uint8_t *blob, uint64_t len, int64_t timeout_ms,
                         uint64_t *out_memh);
/* mem_import that maps CUDA memory on CUDA device `device` of this process
 * (its IPC handle, opened with lazy peer access); host memory ignores it. */
int32_t gosym_mem_import_on(const uint8_t *blob, uint64_t len, int64_t timeout_ms,
                            int32_t device, uint64_t *out_memh);
/* A packed blob's header as JSON (pid, device, address, length, transport,
 * and gpu, the PCI address, for CUDA memory), without importing it. */
int32_t gosym_mem_blob_info(const uint8_t *blob, uint64_t len, char *buf, uint64_t cap,
                            uint64_t *out_len);
/* The memh's fields (exporter's and local address/length, mode, bindings) as JSON. */
int32_t gosym_mem_info(uint64_t memh, char *buf, uint64_t cap, uint64_t *len);

/*
 * Symmetric GPU memory. cuda_alloc: a shareable VMM allocation of at least
 * nbytes on CUDA device `device`, mapped here; *out_size is its size (a
 * multiple of the allocation granularity). contiguous_view is collective over
 * the endpoint's group (every rank calls it, with a buffer of the same size
 * and the same offset): buf is a GPU buffer or the memh of a gosym_mem_alloc
 * region; *out_addr is where the buffer starts in row 0 of a range whose row
 * r, *out_stride bytes further per row, aliases rank r's buffer (the caller
 * adds the offset). Each view handle is released once with view_release.
 */
int32_t gosym_cuda_alloc(int32_t device, uint64_t nbytes, uint64_t *out_buf,
                         uint64_t *out_addr, uint64_t *out_size);
int32_t gosym_cuda_free(uint64_t buf);
int32_t gosym_contiguous_view(uint64_t endpoint, uint64_t buf, uint64_t offset,
                              uint64_t *out_view, uint64_t *out_addr, uint64_t *out_stride);
int32_t gosym_view_release(uint64_t view);

/*
 * torch's pluggable CUDA allocator (torch.cuda.MemPool over
 * torch._C._cuda_customAllocator), for ProcessGroup.allocate_tensor: segments
 * of torch's caching allocator that are gosym_cuda_alloc's shareable memory,
 * registered with the engine. pool_alloc returns NULL on failure (the reason
 * goes to stderr); pool_free takes what pool_alloc returned. The stream is
 * unused.
 */
void *gosym_pool_alloc(int64_t size, int32_t device, void *stream);
void gosym_pool_free(void *ptr, int64_t size, int32_t device, void *stream);

/*
 * Host memory reduced outside any group: dst[i] = srcs[0][i] op srcs[1][i] op
 * ... op srcs[k-1][i] for i < count, combined left to right (so callers that
 * pass the same sources in the same order get the same bits) by the engine's
 * CPU loops: float16 and bfloat16 accumulate in float32 and round once, AVG
 * divides by k, PREMUL_SUM multiplies each source by scale. dst may be one of
 * the sources exactly. Split in shares of 256 KiB or more across the threads
 * a rank gets where `ranks` ranks share the host's cores (GOSYM_THREADS, else
 * cores / ranks, 1 to 8), as a group's own reductions are. fp8 is refused, as
 * Gloo refuses it.
 */
int32_t gosym_host_reduce(uint64_t dst, const uint64_t *srcs, int32_t k, uint64_t count,
                          int32_t dtype, int32_t red_op, double scale, int32_t ranks);

/* Process-wide counters (live handles, fds, mappings) as JSON. */
int32_t gosym_stats(char *buf, uint64_t cap, uint64_t *len);

/* Turns on (on != 0) or off the count of CUDA driver calls and of the host time spent in
   them, reported by gosym_stats as driver_calls and driver_ns: the call-cost bench
   (gosym.callcost) tells the engine's time from the driver's with it. Off (the default), a
   driver call pays one branch. */
int32_t gosym_driver_timing(int32_t on);

/* Every goroutine's stack, as text (Go's runtime.Stack): where a call that does not return
   is waiting, for a hang report. */
int32_t gosym_debug_stacks(char *buf, uint64_t cap, uint64_t *len);

#ifdef __cplusplus
}
#endif
#endif /* GOSYM_H */
