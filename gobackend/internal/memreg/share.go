package memreg

import "golang.org/x/sys/unix"

// Share is what a group needs to map a shareable export memh's memory in
// its peers: a duplicate of the region's memfd (the caller closes it), the
// region's size and local base, and the memh's offset in it. ok is false
// for private, imported or unmapped memhs.
func (m *Memh) Share() (fd int, size int, base uintptr, offset int, ok bool) {
	d := m.d
	if d == nil {
		return -1, 0, 0, 0, false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if m.unmapped || m.freed || m.alloc == nil || m.mode != Export {
		return -1, 0, 0, 0, false
	}
	r := m.alloc.region
	dup, err := unix.FcntlInt(uintptr(r.FD()), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, 0, 0, 0, false
	}
	return dup, r.Size, r.Addr(), m.offset, true
}
