package memreg

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gosym/gosym/gobackend/internal/status"
)

// HostView is a shareable host region (gosym.empty on CPU) as a source of
// the endpoint's contiguous views (gobackend/view.go): each row maps a rank's whole memfd region MAP_FIXED into one
// reserved range. A value type: the same memh gives an equal source, which
// keys the view cache.
type HostView struct {
	m    *Memh
	size uintptr // the region's size
	row  uintptr // the row stride: size rounded up to the page size
	at   uintptr // the memh's offset in its region
}

// NewHostView is m (an export of a gosym.empty region) as a view source.
func NewHostView(m *Memh) (HostView, error) {
	fd, size, _, off, ok := m.Share()
	if !ok {
		return HostView{}, status.Errorf(status.InvalidArg, "gosym: contiguous_view needs memory from gosym.empty (memh %d is not shareable)", m.ID())
	}
	unix.Close(fd)
	page := uintptr(unix.Getpagesize())
	return HostView{m: m, size: uintptr(size), row: (uintptr(size) + page - 1) / page * page, at: uintptr(off)}, nil
}

func (h HostView) RowBytes() uintptr { return h.row }
func (h HostView) Origin() uintptr   { return h.at }
func (h HostView) Device() int       { return -1 }
func (h HostView) Idle()             {}

func (h HostView) ExportFD() (int, error) {
	fd, _, _, _, ok := h.m.Share()
	if !ok {
		return -1, fmt.Errorf("the region was unmapped")
	}
	return fd, nil
}

func (h HostView) MapRows(rank int, fds []int) (uintptr, func(), error) {
	own, err := h.ExportFD()
	if err != nil {
		return 0, nil, err
	}
	defer unix.Close(own)
	total := h.row * uintptr(len(fds))
	base, err := unix.MmapPtr(-1, 0, nil, total, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return 0, nil, fmt.Errorf("reserve %d bytes: %w", total, err)
	}
	undo := func() { unix.MunmapPtr(base, total) }
	for r, fd := range fds {
		if r == rank {
			fd = own
		}
		row := unsafe.Add(base, uintptr(r)*h.row)
		if _, err := unix.MmapPtr(fd, 0, row, h.size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_FIXED); err != nil {
			undo()
			return 0, nil, fmt.Errorf("map rank %d's region: %w", r, err)
		}
	}
	return uintptr(base), undo, nil
}
