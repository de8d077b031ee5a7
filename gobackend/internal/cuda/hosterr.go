package cuda

import (
	"fmt"
	"sync/atomic"
	"unsafe"
)

// ErrorWords is a pinned host block, mapped for the device, that the
// kernels copy their error words into (gs_record_error) when a rank's pad
// names it (PadHostErrorWord). The host reads it with atomic loads and no
// driver call, so checking it before every op costs one load. Only the
// kernels write it.
type ErrorWords struct {
	d     *Driver
	ctx   Context
	host  unsafe.Pointer          // C memory from MemHostAlloc; nil for ErrorWordsAt
	words *[HostErrorWords]uint32 // the block, as the host sees it
	dev   uintptr                 // the block, as the kernels address it
}

// DeviceError is an error a kernel recorded: its code (ErrTimeout,
// ErrConfig), a detail that says where, and the ranks that did not arrive.
type DeviceError struct {
	Code, Detail, Missing uint32
}

// NewErrorWords allocates the block in ctx (portable and device-mapped),
// zeroed.
func NewErrorWords(d *Driver, ctx Context) (*ErrorWords, error) {
	p, err := d.MemHostAlloc(ctx, 4*HostErrorWords, HostAllocPortable|HostAllocDeviceMap)
	if err != nil {
		return nil, err
	}
	w := &ErrorWords{d: d, ctx: ctx, host: p, words: (*[HostErrorWords]uint32)(p)}
	if w.dev, err = d.MemHostDevicePointer(ctx, p); err != nil {
		w.Close()
		return nil, err
	}
	for i := range w.words {
		atomic.StoreUint32(&w.words[i], 0)
	}
	return w, nil
}

// ErrorWordsAt is a block over ordinary memory, its device address its
// host one: for tests that play the kernel's part.
func ErrorWordsAt(words *[HostErrorWords]uint32) *ErrorWords {
	return &ErrorWords{words: words, dev: uintptr(unsafe.Pointer(words))}
}

// Device is the address the kernels write to (for PadHostErrorWord).
func (w *ErrorWords) Device() uintptr { return w.dev }

// Code is the recorded error code, 0 while none: one atomic load.
func (w *ErrorWords) Code() uint32 { return atomic.LoadUint32(&w.words[HostErrorCode]) }

// Words loads the whole block, the code first: a writer publishes the
// code last, so the other words are in place once it is seen. A p2p
// channel's block holds its error words (P2PErrorWords) in this order.
func (w *ErrorWords) Words() [HostErrorWords]uint32 {
	var out [HostErrorWords]uint32
	if out[HostErrorCode] = w.Code(); out[HostErrorCode] == 0 {
		return out
	}
	for i := range out {
		if i != HostErrorCode {
			out[i] = atomic.LoadUint32(&w.words[i])
		}
	}
	return out
}

// Load returns the recorded error of a collective's block, if any.
func (w *ErrorWords) Load() (DeviceError, bool) {
	ws := w.Words()
	return DeviceError{Code: ws[HostErrorCode], Detail: ws[HostErrorDetail], Missing: ws[HostErrorMissing]},
		ws[HostErrorCode] != 0
}

// Close frees the block; kernels that may still write it must have
// finished. Safe on nil and twice.
func (w *ErrorWords) Close() error {
	if w == nil || w.host == nil {
		return nil
	}
	p := w.host
	w.host, w.words = nil, nil
	return w.d.MemFreeHost(w.ctx, p)
}

// Ranks lists the ranks of the mask, in order.
func (e DeviceError) Ranks() []int {
	var rs []int
	for r := 0; r < 32; r++ {
		if e.Missing&(1<<r) != 0 {
			rs = append(rs, r)
		}
	}
	return rs
}

// Where says which wait or check recorded the error, from its detail.
func (e DeviceError) Where() string {
	switch {
	case e.Code == ErrConfig:
		return fmt.Sprintf("launch configuration or parameters out of range, detail %#x", e.Detail)
	case e.Detail&A2AVDetail != 0:
		block, peer := e.Detail>>8&0xff, e.Detail&0xff
		switch e.Detail >> 16 & 0xff {
		case A2AVWaitSlot:
			return fmt.Sprintf("all_to_all, block %d waiting for rank %d to consume a chunk", block, peer)
		case A2AVWaitData:
			return fmt.Sprintf("all_to_all, block %d waiting for rank %d's chunk", block, peer)
		default:
			return fmt.Sprintf("all_to_all: rank %d sent this rank a piece of another size than this rank's output split for it", peer)
		}
	case e.Detail&LLWaitDetail != 0:
		return fmt.Sprintf("LL kernel, block %d waiting for the lines of rank %d", e.Detail>>8&0xffff, e.Detail&0xff)
	case e.Detail>>8 == PadSemaReadyWord:
		return fmt.Sprintf("semaphore wait for staged input, rank %d", e.Detail&0xff)
	case e.Detail>>8 == PadSemaDoneWord:
		return fmt.Sprintf("semaphore wait for release, rank %d", e.Detail&0xff)
	default:
		return fmt.Sprintf("kernel barrier, block %d", e.Detail>>8)
	}
}
