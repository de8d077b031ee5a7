package memreg

// CUDA memory in the domain. memreg owns the memh, the blob format and the
// lifetimes; the driver calls are behind the CUDA interface, which the
// engine installs (SetCUDA) and tests fake, so that this package never
// links against CUDA and its logic is tested on machines without a GPU.
//
// An EXPORT memh of device memory is shareable when the driver can give
// its allocation a legacy IPC handle (cudaMalloc memory, the caching
// allocator's segments) or is one of gosym.empty's VMM allocations (a
// POSIX fd exports it, which the fd server lends); anything else
// (other VMM memory, managed memory, ranges that span allocations)
// registers private, with the reason kept. The handle is
// resolved once, at Map: later packs and group bindings make no driver
// call. An IMPORT memh of a CUDA blob holds this process's mapping of the
// exporter's allocation (cuIpcOpenMemHandle) until it is freed.

import (
	"fmt"
	"os"
	"time"

	"github.com/gosym/gosym/gobackend/internal/status"
)

// IPCHandleLen is the size of a legacy CUDA IPC handle (CUipcMemHandle).
const IPCHandleLen = 64

// GPUID names a physical GPU by its PCI address: the same in every process
// of the host, whatever each one's CUDA_VISIBLE_DEVICES numbering is.
type GPUID struct{ Domain, Bus, Device uint32 }

func (g GPUID) String() string { return fmt.Sprintf("%04x:%02x:%02x.0", g.Domain, g.Bus, g.Device) }

// CUDAShare is a CUDA allocation as another process of the host opens it.
type CUDAShare struct {
	GPU    GPUID
	Handle [IPCHandleLen]byte // cuIpcGetMemHandle of the allocation (zero for VMM)
	Base   uint64             // the allocation's address in the exporter
	Size   uint64             // the allocation's size
	// VMM: the allocation is VMM memory made exportable as a POSIX fd
	// (gosym.empty on CUDA). It has no legacy handle: groups bind it by
	// sending the fd over their links, and its blob names the fd server
	// that lends the fd (the "cudavmm" entry).
	VMM bool
}

// CUDA is the driver side of CUDA registrations. Methods are called outside
// the domain's lock and may be called concurrently.
type CUDA interface {
	// Share resolves the allocation that holds [addr, addr+n) on device.
	// A nil share with a nil error means the range can be registered only
	// privately, for the reason why; an error means device memory cannot be
	// registered at all (no driver, no such device, memory of another device).
	Share(device int, addr uintptr, n int) (s *CUDAShare, why string, err error)
	// Open maps s on device (an ordinal of this process) and returns where
	// the allocation starts here.
	Open(device int, s *CUDAShare) (base uintptr, err error)
	// ExportFD is a POSIX fd (the caller's to close) of the VMM allocation
	// s of this process, on device.
	ExportFD(device int, s *CUDAShare) (fd int, err error)
	// OpenFD maps the VMM allocation s that fd exports (the fd stays the
	// caller's) on device and returns where it starts here.
	OpenFD(device int, s *CUDAShare, fd int) (base uintptr, err error)
	// Close unmaps what Open or OpenFD mapped of s at base, once the device
	// no longer uses it.
	Close(device int, s *CUDAShare, base uintptr) error
}

type cudaBox struct{ c CUDA }

// SetCUDA installs the driver side of CUDA registrations (nil removes it:
// maps of device memory and imports of CUDA blobs then fail with
// NotSupported).
func (d *Domain) SetCUDA(c CUDA) {
	if c == nil {
		d.cuda.Store(nil)
		return
	}
	d.cuda.Store(&cudaBox{c})
}

func (d *Domain) cudaImpl() CUDA {
	if b := d.cuda.Load(); b != nil {
		return b.c
	}
	return nil
}

// shareCUDA fills in m's shareable allocation, or its reason to stay
// private; outside the lock.
func (d *Domain) shareCUDA(m *Memh) error {
	c := d.cudaImpl()
	if c == nil {
		return errNoCUDA("map %#x+%d on cuda:%d", m.addr, m.length, m.device)
	}
	if err := d.fault("cuda.share"); err != nil {
		return err
	}
	s, why, err := c.Share(m.device, m.addr, m.length)
	switch {
	case err != nil:
		return err
	case s == nil:
		m.why = why
	case uint64(m.addr) < s.Base || uint64(m.addr)+uint64(m.length) > s.Base+s.Size:
		return status.Errorf(status.Internal, "memreg: map %#x+%d: the driver's allocation %#x+%d does not hold it", m.addr, m.length, s.Base, s.Size)
	default:
		m.cuda, m.offset = s, int(uint64(m.addr)-s.Base)
	}
	return nil
}

func errNoCUDA(format string, args ...any) error {
	return status.Errorf(status.NotSupported, "memreg: %s: CUDA is not available in this process", fmt.Sprintf(format, args...))
}

// CUDA returns a shareable CUDA export's allocation and the range's offset
// in it; ok is false for any other memh.
func (m *Memh) CUDA() (s CUDAShare, offset int, ok bool) {
	if m.mode != Export || m.cuda == nil {
		return CUDAShare{}, 0, false
	}
	return *m.cuda, m.offset, true
}

// WhyPrivate says why a CUDA export cannot be shared ("" otherwise).
func (m *Memh) WhyPrivate() string { return m.why }

// importCUDA maps a parsed CUDA blob on device and registers it: a legacy
// IPC handle is opened directly; VMM memory's fd is fetched from the
// exporter's server first (authenticated as for memfds).
func (d *Domain) importCUDA(p *packed, device int, deadline time.Time) (*Memh, error) {
	c := d.cudaImpl()
	switch {
	case device < 0:
		return nil, status.Errorf(status.NotSupported, "memreg: import of CUDA memory (cuda:%d of pid %d): name the device to map it on",
			p.device, p.pid)
	case p.cuda != nil && p.pid == os.Getpid():
		return nil, status.Errorf(status.NotSupported,
			"memreg: import of CUDA memory in the process that exported it (a CUDA IPC handle cannot be opened there): use the exported memh")
	case c == nil:
		return nil, errNoCUDA("import of cuda:%d memory of pid %d", p.device, p.pid)
	}
	var s *CUDAShare
	var off uint64
	var base uintptr
	var err error
	if e := p.cuda; e != nil {
		s, off = &CUDAShare{GPU: e.gpu, Handle: e.handle, Base: p.addr - e.offset, Size: e.size}, e.offset
		base, err = c.Open(device, s)
	} else {
		e := p.vmm
		s, off = &CUDAShare{GPU: e.gpu, Base: p.addr - e.offset, Size: e.size, VMM: true}, e.offset
		var fd int
		if fd, err = d.fetchFD(p.pid, e.secret, e.sock, e.size, deadline); err == nil {
			base, err = c.OpenFD(device, s, fd)
			closeFD(fd) // the mapping keeps the memory
		}
	}
	if err != nil {
		return nil, err
	}
	m := &Memh{d: d, mode: Import, addr: uintptr(p.addr), length: int(p.length), device: device,
		local: base + uintptr(off), offset: int(off), mapRef: true, cudaBase: base, cudaClose: c, cudaOf: s}
	if err = d.fault("import.cuda"); err == nil {
		err = d.insert(m, nil)
	}
	if err != nil {
		c.Close(device, s, base)
		return nil, err
	}
	return m, nil
}

// BlobInfo describes a packed memh without importing it: the exporter's
// pid, device, address and length, and its transport ("memfd", "cudaipc", "cudavmm",
// or "" for a private memh); for CUDA memory, the GPU's PCI address.
func BlobInfo(blob []byte) (map[string]any, error) {
	p, err := parse(blob)
	if err != nil {
		return nil, err
	}
	info := map[string]any{"pid": p.pid, "device": p.device, "address": p.addr, "length": p.length, "transport": ""}
	switch {
	case p.cuda != nil:
		info["transport"], info["gpu"] = transportCUDA, p.cuda.gpu.String()
	case p.vmm != nil:
		info["transport"], info["gpu"] = transportVMM, p.vmm.gpu.String()
	case p.memfd != nil:
		info["transport"] = transportMemfd
	}
	return info, nil
}
