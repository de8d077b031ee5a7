// Package shm is the operating system's shared memory for the processes of
// a group: memfd regions mapped by every rank (Region) and the shared futex
// and yield that waits on their words use. symm builds a group's symmetric
// memory from it, memreg the regions of registered host memory.
package shm

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Region is a memfd-backed shared mapping. The fd can be sent to peers
// (SCM_RIGHTS), which map the same pages; memfds live only in memory, so a
// crash leaves nothing behind in /dev/shm or on disk.
type Region struct {
	fd   int    // -1 once closed or for an imported mapping whose fd was dropped
	mem  []byte // the mapping; nil once unmapped
	Size int
}

var liveRegions, liveFDs atomic.Int64

// LiveRegions reports mappings made by this package and not yet unmapped.
func LiveRegions() int64 { return liveRegions.Load() }

// LiveFDs reports memfds opened by this package and not yet closed.
func LiveFDs() int64 { return liveFDs.Load() }

// NewRegion creates and maps a zero-filled shared region of size bytes.
func NewRegion(name string, size int) (*Region, error) {
	if size <= 0 {
		return nil, fmt.Errorf("region %q: size %d must be positive", name, size)
	}
	fd, err := unix.MemfdCreate("gosym:"+name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("memfd_create %q: %w", name, err)
	}
	liveFDs.Add(1)
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		closeFD(fd)
		return nil, fmt.Errorf("ftruncate %q to %d bytes: %w", name, size, err)
	}
	r, err := MapFD(fd, size)
	if err != nil {
		closeFD(fd)
		return nil, err
	}
	r.fd = fd
	return r, nil
}

// MapFD maps size bytes of a shared fd. The returned region does not own fd.
func MapFD(fd int, size int) (*Region, error) {
	if size <= 0 {
		return nil, fmt.Errorf("map fd %d: size %d must be positive", fd, size)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("fstat fd %d: %w", fd, err)
	}
	if st.Size < int64(size) {
		return nil, fmt.Errorf("map fd %d: file has %d bytes, want %d", fd, st.Size, size)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap fd %d (%d bytes): %w", fd, size, err)
	}
	liveRegions.Add(1)
	return &Region{fd: -1, mem: mem, Size: size}, nil
}

// FD is the memfd backing a region this process created, or -1.
func (r *Region) FD() int { return r.fd }

// Addr is the address of the first byte of the mapping.
func (r *Region) Addr() uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(r.mem))) }

// Bytes is the mapping as a slice.
func (r *Region) Bytes() []byte { return r.mem }

// Close unmaps the region and closes its fd; it is idempotent.
func (r *Region) Close() error {
	var err error
	if r.mem != nil {
		err = unix.Munmap(r.mem)
		r.mem = nil
		liveRegions.Add(-1)
	}
	if r.fd >= 0 {
		closeFD(r.fd)
		r.fd = -1
	}
	return err
}

func closeFD(fd int) {
	unix.Close(fd)
	liveFDs.Add(-1)
}

// Word32 returns a pointer to the aligned uint32 at off in a region.
func (r *Region) Word32(off int) *uint32 {
	if off < 0 || off+4 > len(r.mem) || off%4 != 0 {
		panic(fmt.Sprintf("shm: word32 offset %d out of region of %d bytes", off, len(r.mem)))
	}
	return (*uint32)(unsafe.Pointer(&r.mem[off]))
}

// Word64 returns a pointer to the aligned uint64 at off in a region.
func (r *Region) Word64(off int) *uint64 {
	if off < 0 || off+8 > len(r.mem) || off%8 != 0 {
		panic(fmt.Sprintf("shm: word64 offset %d out of region of %d bytes", off, len(r.mem)))
	}
	return (*uint64)(unsafe.Pointer(&r.mem[off]))
}
