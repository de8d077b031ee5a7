// Command cabi is built with -buildmode=c-shared into libgosym.so. It holds
// only forwarders: handle tables, status codes, last-error text and panic
// recovery. All logic is in gobackend.
package main

/*
#include <stdint.h>
#include <string.h>
#include "gosym.h"
#include "lasterr.h"
#include "addr.h"

// const-qualified aliases, so that the cgo-generated prototypes match the
// const-correct ones in gosym.h exactly.
typedef const char gosym_cchar;
typedef const uint8_t gosym_cu8;
typedef const uint64_t gosym_cu64;
typedef const gosym_op_desc gosym_cdesc;
typedef const gosym_piece gosym_cpiece;
*/
import "C"

import (
	"encoding/json"
	"fmt"
	"runtime"
	"runtime/debug"
	"time"
	"unsafe"

	"github.com/gosym/gosym/gobackend"
)

func main() {}

// abiVersion must equal GOSYM_ABI_VERSION in gosym.h.
const abiVersion = 1

func init() {
	if C.GOSYM_ABI_VERSION != abiVersion {
		panic("gosym.h and cabi disagree on the ABI version")
	}
}

// ret records err as the thread's last error and returns its status code.
func ret(err error) C.int32_t {
	if err == nil {
		return C.GOSYM_OK
	}
	setLastError(err.Error())
	return C.int32_t(gobackend.CodeOf(err))
}

func setLastError(msg string) {
	b := []byte(msg)
	if len(b) == 0 {
		b = []byte("gosym: unknown error")
	}
	C.gosym_set_last_error((*C.char)(unsafe.Pointer(&b[0])), C.size_t(len(b)))
}

// guard turns a panic into GOSYM_ERR_INTERNAL; every export defers it.
func guard(rc *C.int32_t) {
	if r := recover(); r != nil {
		setLastError(fmt.Sprintf("gosym: internal error: %v\n%s", r, debug.Stack()))
		*rc = C.int32_t(gobackend.CodeInternal)
	}
}

func errArg(format string, args ...any) error {
	return gobackend.Errorf(gobackend.CodeInvalidArg, "gosym: "+format, args...)
}

//export gosym_abi_version
func gosym_abi_version() C.uint32_t { return abiVersion }

//export gosym_last_error
func gosym_last_error() *C.gosym_cchar { return (*C.gosym_cchar)(C.gosym_get_last_error()) }

// copyOut copies b into a caller-owned buffer, NUL-terminated when it fits
// a string, and reports the length needed.
func copyOut(b []byte, buf unsafe.Pointer, capacity C.uint64_t, length *C.uint64_t, nul bool) error {
	need := len(b)
	if nul {
		need++
	}
	if length != nil {
		*length = C.uint64_t(len(b))
	}
	if buf == nil || int(capacity) < need {
		return errArg("buffer of %d bytes is too small, need %d", uint64(capacity), need)
	}
	dst := unsafe.Slice((*byte)(buf), need)
	copy(dst, b)
	if nul {
		dst[len(b)] = 0
	}
	return nil
}

//export gosym_version
func gosym_version(buf *C.char, capacity C.uint64_t) (rc C.int32_t) {
	defer guard(&rc)
	return ret(copyOut([]byte(gobackend.Version), unsafe.Pointer(buf), capacity, nil, true))
}

//export gosym_endpoint_create
func gosym_endpoint_create(rank, size C.int32_t, timeoutMs C.int64_t, name *C.gosym_cchar, out *C.uint64_t) (rc C.int32_t) {
	defer guard(&rc)
	if out == nil {
		return ret(errArg("endpoint_create: null output pointer"))
	}
	n := ""
	if name != nil {
		n = C.GoString((*C.char)(name))
	}
	gobackend.FitRuntime(int(size))
	ep, err := gobackend.NewEndpoint(int(rank), int(size), time.Duration(timeoutMs)*time.Millisecond, n)
	if err != nil {
		return ret(err)
	}
	*out = C.uint64_t(handles.add(ep))
	return C.GOSYM_OK
}

//export gosym_endpoint_blob
func gosym_endpoint_blob(h C.uint64_t, buf *C.uint8_t, capacity C.uint64_t, length *C.uint64_t) (rc C.int32_t) {
	defer guard(&rc)
	ep, err := getEndpoint(uint64(h))
	if err != nil {
		return ret(err)
	}
	return ret(copyOut(ep.Blob(), unsafe.Pointer(buf), capacity, length, false))
}

//export gosym_endpoint_connect
func gosym_endpoint_connect(h C.uint64_t, blobs *C.gosym_cu8, lens *C.gosym_cu64, n C.int32_t) (rc C.int32_t) {
	defer guard(&rc)
	ep, err := getEndpoint(uint64(h))
	if err != nil {
		return ret(err)
	}
	if int(n) != ep.Size || blobs == nil || lens == nil {
		return ret(errArg("endpoint_connect: need %d blobs, got %d", ep.Size, int(n)))
	}
	ls := unsafe.Slice(lens, int(n))
	total := 0
	for _, l := range ls {
		if l > 1<<16 {
			return ret(errArg("endpoint_connect: blob of %d bytes", uint64(l)))
		}
		total += int(l)
	}
	all := C.GoBytes(unsafe.Pointer(blobs), C.int(total))
	parts := make([][]byte, n)
	off := 0
	for i, l := range ls {
		parts[i] = all[off : off+int(l)]
		off += int(l)
	}
	return ret(ep.Connect(parts))
}

//export gosym_endpoint_destroy
func gosym_endpoint_destroy(h C.uint64_t) (rc C.int32_t) {
	defer guard(&rc)
	ep, err := take[*gobackend.Endpoint](uint64(h), "endpoint")
	if err != nil {
		return ret(err)
	}
	return ret(ep.Destroy())
}

//export gosym_endpoint_stats
func gosym_endpoint_stats(h C.uint64_t, buf *C.char, capacity C.uint64_t, length *C.uint64_t) (rc C.int32_t) {
	defer guard(&rc)
	ep, err := getEndpoint(uint64(h))
	if err != nil {
		return ret(err)
	}
	b, _ := json.Marshal(ep.StatsMap())
	return ret(copyOut(b, unsafe.Pointer(buf), capacity, length, true))
}

//export gosym_endpoint_device_error
func gosym_endpoint_device_error(h C.uint64_t) (rc C.int32_t) {
	defer guard(&rc)
	ep, err := getEndpoint(uint64(h))
	if err != nil {
		return ret(err)
	}
	return ret(ep.DeviceError())
}

//export gosym_endpoint_abort_cuda
func gosym_endpoint_abort_cuda(h C.uint64_t, why *C.gosym_cchar) (rc C.int32_t) {
	defer guard(&rc)
	ep, err := getEndpoint(uint64(h))
	if err != nil {
		return ret(err)
	}
	return ret(ep.AbortCUDA(C.GoString((*C.char)(why))))
}

//export gosym_stats
func gosym_stats(buf *C.char, capacity C.uint64_t, length *C.uint64_t) (rc C.int32_t) {
	defer guard(&rc)
	m := gobackend.ProcessStats()
	m["handles"] = handles.len()
	for k, v := range gobackend.MemStats() {
		m["mem_"+k] = v
	}
	b, _ := json.Marshal(m)
	return ret(copyOut(b, unsafe.Pointer(buf), capacity, length, true))
}

//export gosym_driver_timing
func gosym_driver_timing(on C.int32_t) (rc C.int32_t) {
	defer guard(&rc)
	gobackend.SetDriverTiming(on != 0)
	return C.GOSYM_OK
}

//export gosym_host_reduce
func gosym_host_reduce(dst C.uint64_t, srcs *C.gosym_cu64, k C.int32_t, count C.uint64_t, dt, red C.int32_t,
	scale C.double, ranks C.int32_t) (rc C.int32_t) {
	defer guard(&rc)
	if dst == 0 || srcs == nil || k <= 0 || k > 1<<16 || uint64(count) > 1<<46 {
		return ret(errArg("host_reduce: bad destination, %d sources or %d elements", int32(k), uint64(count)))
	}
	ss := make([]uintptr, k)
	for i, a := range unsafe.Slice(srcs, int(k)) {
		if a == 0 {
			return ret(errArg("host_reduce: source %d is null", i))
		}
		ss[i] = uintptr(a)
	}
	return ret(gobackend.HostReduce(uintptr(dst), ss, int(count), gobackend.DType(dt), gobackend.RedOp(red),
		float64(scale), int(ranks)))
}

//export gosym_debug_stacks
func gosym_debug_stacks(buf *C.char, capacity C.uint64_t, length *C.uint64_t) (rc C.int32_t) {
	defer guard(&rc)
	b := make([]byte, 1<<20)
	for {
		n := runtime.Stack(b, true)
		if n < len(b) || len(b) >= 64<<20 {
			b = b[:n]
			break
		}
		b = make([]byte, 2*len(b))
	}
	return ret(copyOut(b, unsafe.Pointer(buf), capacity, length, true))
}

func pieces(p *C.gosym_cpiece, n C.int32_t) ([]gobackend.Piece, error) {
	if n == 0 {
		return nil, nil
	}
	if p == nil || n < 0 || n > 1<<20 {
		return nil, errArg("bad piece array (%d pieces)", int(n))
	}
	cs := unsafe.Slice(p, int(n))
	out := make([]gobackend.Piece, n)
	for i, c := range cs {
		if uint64(c.count) > 1<<62 {
			return nil, errArg("piece %d has %d elements", i, uint64(c.count))
		}
		out[i] = gobackend.Piece{Addr: uintptr(c.addr), Count: int(c.count)}
	}
	return out, nil
}

// opOf validates a descriptor and converts it (addresses stay raw).
func opOf(d *C.gosym_cdesc) (*gobackend.Op, error) {
	if d == nil {
		return nil, errArg("null operation descriptor")
	}
	if uintptr(d.struct_size) < unsafe.Sizeof(*d) {
		return nil, errArg("descriptor of %d bytes, this library needs %d", uint32(d.struct_size), unsafe.Sizeof(*d))
	}
	if uint64(d.count) > 1<<62 {
		return nil, errArg("count %d", uint64(d.count))
	}
	op := &gobackend.Op{
		Kind: gobackend.Kind(d.op), DType: gobackend.DType(d.dtype), RedOp: gobackend.RedOp(d.red_op),
		Scale: float64(d.scale), Root: int(d.root), Peer: int(d.peer), Tag: int64(d.tag),
		Count: int(d.count), In: uintptr(d.in_addr), Out: uintptr(d.out_addr),
	}
	var err error
	if op.InPieces, err = pieces(d.in_pieces, d.n_in); err != nil {
		return nil, err
	}
	if op.OutPieces, err = pieces(d.out_pieces, d.n_out); err != nil {
		return nil, err
	}
	return op, nil
}

// opFor is the endpoint of handle h and the op of descriptor d.
func opFor(h C.uint64_t, d *C.gosym_cdesc) (*gobackend.Endpoint, *gobackend.Op, error) {
	ep, err := getEndpoint(uint64(h))
	if err != nil {
		return nil, nil, err
	}
	op, err := opOf(d)
	return ep, op, err
}

//export gosym_op_post
func gosym_op_post(h C.uint64_t, d *C.gosym_cdesc, out *C.uint64_t) (rc C.int32_t) {
	defer guard(&rc)
	if out == nil {
		return ret(errArg("op_post: null output"))
	}
	ep, op, err := opFor(h, d)
	if err != nil {
		return ret(err)
	}
	w, err := ep.PostCUDA(op, int(d.device), uintptr(d.stream), d.flags&C.GOSYM_OP_CAPTURING != 0)
	if err != nil {
		return ret(err)
	}
	*out = C.uint64_t(handles.add(w))
	return C.GOSYM_OK
}

// gosym_op_run is post + wait + release in one crossing of the ABI, for
// callers that wait at once (torch's synchronous collectives): no handle
// is issued, and the wait has the endpoint's timeout, as the op itself.
//
//export gosym_op_run
func gosym_op_run(h C.uint64_t, d *C.gosym_cdesc) (rc C.int32_t) {
	defer guard(&rc)
	ep, op, err := opFor(h, d)
	if err != nil {
		return ret(err)
	}
	return ret(ep.RunCUDA(op, int(d.device), uintptr(d.stream), d.flags&C.GOSYM_OP_CAPTURING != 0))
}

//export gosym_work_wait
func gosym_work_wait(h C.uint64_t, timeoutMs C.int64_t) (rc C.int32_t) {
	defer guard(&rc)
	w, err := getWork(uint64(h))
	if err != nil {
		return ret(err)
	}
	return ret(w.Wait(waitTimeout(timeoutMs)))
}

// waitTimeout is the Wait timeout for an ABI timeout_ms (< 0: none).
func waitTimeout(ms C.int64_t) time.Duration {
	if ms < 0 {
		return -1
	}
	return time.Duration(ms) * time.Millisecond
}

//export gosym_work_test
func gosym_work_test(h C.uint64_t) (rc C.int32_t) {
	defer guard(&rc)
	w, err := getWork(uint64(h))
	if err != nil {
		return ret(err)
	}
	done, err := w.Done()
	if !done {
		return C.int32_t(gobackend.CodeNotReady)
	}
	return ret(err)
}

//export gosym_work_release
func gosym_work_release(h C.uint64_t) (rc C.int32_t) {
	defer guard(&rc)
	_, err := take[*gobackend.Work](uint64(h), "work")
	return ret(err)
}

// gosym_work_finish is wait + release: once the work completed (well or
// not) its handle is released and its status returned; if timeout_ms
// passed first, the handle stays live and GOSYM_ERR_NOT_READY is returned.
//
//export gosym_work_finish
func gosym_work_finish(h C.uint64_t, timeoutMs C.int64_t) (rc C.int32_t) {
	defer guard(&rc)
	w, err := getWork(uint64(h))
	if err != nil {
		return ret(err)
	}
	waitErr := w.Wait(waitTimeout(timeoutMs))
	done, err := w.Done()
	if !done {
		ret(waitErr) // the last error says how long the caller waited
		return C.int32_t(gobackend.CodeNotReady)
	}
	handles.remove(uint64(h))
	return ret(err)
}

//export gosym_mem_alloc
func gosym_mem_alloc(n C.uint64_t, out *C.uint64_t, outAddr *C.uint64_t) (rc C.int32_t) {
	defer guard(&rc)
	if out == nil || outAddr == nil || n == 0 || uint64(n) > 1<<46 {
		return ret(errArg("mem_alloc: bad size %d or null output", uint64(n)))
	}
	m, err := gobackend.MemAlloc(int(n))
	if err != nil {
		return ret(err)
	}
	*out = C.uint64_t(handles.add(m))
	*outAddr = C.uint64_t(m.LocalAddress())
	return C.GOSYM_OK
}

//export gosym_mem_map
func gosym_mem_map(addr, n C.uint64_t, device C.int32_t, out *C.uint64_t) (rc C.int32_t) {
	defer guard(&rc)
	if out == nil || uint64(n) > 1<<62 {
		return ret(errArg("mem_map: bad length %d or null output", uint64(n)))
	}
	m, err := gobackend.MemMap(uintptr(addr), int(n), int(device))
	if err != nil {
		return ret(err)
	}
	*out = C.uint64_t(handles.add(m))
	return C.GOSYM_OK
}

//export gosym_mem_unmap
func gosym_mem_unmap(h C.uint64_t) (rc C.int32_t) {
	defer guard(&rc)
	m, err := take[*gobackend.Memh](uint64(h), "memory")
	if err != nil {
		return ret(err)
	}
	return ret(gobackend.MemUnmap(m))
}

//export gosym_mem_pack
func gosym_mem_pack(h C.uint64_t, buf *C.uint8_t, capacity C.uint64_t, length *C.uint64_t) (rc C.int32_t) {
	defer guard(&rc)
	m, err := getMemh(uint64(h))
	if err != nil {
		return ret(err)
	}
	b, err := m.Pack()
	if err != nil {
		return ret(err)
	}
	return ret(copyOut(b, unsafe.Pointer(buf), capacity, length, false))
}

//export gosym_mem_import
func gosym_mem_import(blob *C.gosym_cu8, n C.uint64_t, timeoutMs C.int64_t, out *C.uint64_t) (rc C.int32_t) {
	defer guard(&rc)
	return memImport(blob, n, timeoutMs, -1, out)
}

//export gosym_mem_import_on
func gosym_mem_import_on(blob *C.gosym_cu8, n C.uint64_t, timeoutMs C.int64_t, device C.int32_t, out *C.uint64_t) (rc C.int32_t) {
	defer guard(&rc)
	return memImport(blob, n, timeoutMs, int(device), out)
}

func memImport(blob *C.gosym_cu8, n C.uint64_t, timeoutMs C.int64_t, device int, out *C.uint64_t) C.int32_t {
	if blob == nil || out == nil || n > 1<<20 {
		return ret(errArg("mem_import: bad blob (%d bytes) or null output", uint64(n)))
	}
	m, err := gobackend.MemImport(C.GoBytes(unsafe.Pointer(blob), C.int(n)), device, time.Duration(timeoutMs)*time.Millisecond)
	if err != nil {
		return ret(err)
	}
	*out = C.uint64_t(handles.add(m))
	return C.GOSYM_OK
}

//export gosym_mem_blob_info
func gosym_mem_blob_info(blob *C.gosym_cu8, n C.uint64_t, buf *C.char, capacity C.uint64_t, length *C.uint64_t) (rc C.int32_t) {
	defer guard(&rc)
	if blob == nil || n > 1<<20 {
		return ret(errArg("mem_blob_info: bad blob (%d bytes)", uint64(n)))
	}
	info, err := gobackend.MemBlobInfo(C.GoBytes(unsafe.Pointer(blob), C.int(n)))
	if err != nil {
		return ret(err)
	}
	b, _ := json.Marshal(info)
	return ret(copyOut(b, unsafe.Pointer(buf), capacity, length, true))
}

//export gosym_mem_info
func gosym_mem_info(h C.uint64_t, buf *C.char, capacity C.uint64_t, length *C.uint64_t) (rc C.int32_t) {
	defer guard(&rc)
	m, err := getMemh(uint64(h))
	if err != nil {
		return ret(err)
	}
	b, _ := json.Marshal(map[string]any{
		"id": m.ID(), "mode": m.Mode().String(), "address": uint64(m.Address()), "length": m.Len(),
		"local_address": uint64(m.LocalAddress()), "local_length": m.LocalLen(), "device": m.Device(),
		"shareable": m.Shareable(), "bindings": m.Bindings(), "why_private": m.WhyPrivate(),
	})
	return ret(copyOut(b, unsafe.Pointer(buf), capacity, length, true))
}

//export gosym_cuda_alloc
func gosym_cuda_alloc(device C.int32_t, n C.uint64_t, out, outAddr, outSize *C.uint64_t) (rc C.int32_t) {
	defer guard(&rc)
	if out == nil || outAddr == nil || outSize == nil || device < 0 || n == 0 || uint64(n) > 1<<46 {
		return ret(errArg("cuda_alloc: bad device %d, size %d or null output", int32(device), uint64(n)))
	}
	b, err := gobackend.GPUAlloc(int(device), int(n))
	if err != nil {
		return ret(err)
	}
	*out = C.uint64_t(handles.add(b))
	*outAddr, *outSize = C.uint64_t(b.Addr()), C.uint64_t(b.Size())
	return C.GOSYM_OK
}

//export gosym_cuda_free
func gosym_cuda_free(h C.uint64_t) (rc C.int32_t) {
	defer guard(&rc)
	b, err := take[*gobackend.GPUBuf](uint64(h), "GPU buffer")
	if err != nil {
		return ret(err)
	}
	return ret(b.Free())
}

//export gosym_pool_alloc
func gosym_pool_alloc(size C.int64_t, device C.int32_t, stream unsafe.Pointer) unsafe.Pointer {
	// torch's signature has no status: NULL says it failed (PoolAlloc says why)
	if size <= 0 || device < 0 {
		return nil
	}
	addr := gobackend.PoolAlloc(int(device), int(size))
	if addr == 0 {
		return nil
	}
	return C.gsabi_addr_ptr(C.uint64_t(addr))
}

//export gosym_pool_free
func gosym_pool_free(ptr unsafe.Pointer, size C.int64_t, device C.int32_t, stream unsafe.Pointer) {
	gobackend.PoolFree(uintptr(ptr))
}

//export gosym_contiguous_view
func gosym_contiguous_view(ep, buf, offset C.uint64_t, out, outAddr, outStride *C.uint64_t) (rc C.int32_t) {
	defer guard(&rc)
	if out == nil || outAddr == nil || outStride == nil {
		return ret(errArg("contiguous_view: null output"))
	}
	e, err := getEndpoint(uint64(ep))
	if err != nil {
		return ret(err)
	}
	var v *gobackend.View
	switch b := handles.get(uint64(buf)).(type) {
	case *gobackend.GPUBuf:
		v, err = e.ContiguousView(b, uintptr(offset))
	case *gobackend.Memh:
		src, serr := gobackend.HostViewSource(b)
		if serr != nil {
			return ret(serr)
		}
		v, err = e.ContiguousView(src, uintptr(offset))
	default:
		return ret(gobackend.Errorf(gobackend.CodeInvalidHandle, "gosym: %d is neither a GPU buffer nor a memh handle", uint64(buf)))
	}
	if err != nil {
		return ret(err)
	}
	*out = C.uint64_t(handles.add(v))
	*outAddr, *outStride = C.uint64_t(v.Addr()), C.uint64_t(v.Stride())
	return C.GOSYM_OK
}

//export gosym_view_release
func gosym_view_release(h C.uint64_t) (rc C.int32_t) {
	defer guard(&rc)
	v, err := take[*gobackend.View](uint64(h), "view")
	if err != nil {
		return ret(err)
	}
	v.Release()
	return C.GOSYM_OK
}
