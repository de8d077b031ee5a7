// Package memreg is gosym's domain-level memory registration (UCC's
// ucc_mem_map / ucc_mem_unmap / memh pack and import, seed a).
//
// A Domain (one per process; Default) owns a list of memhs. An EXPORT memh
// describes local memory: either a memfd region the domain allocated
// (Alloc), a range inside one (Map; shareable), CUDA device memory whose
// allocation has a legacy IPC handle, or of gosym.empty (Map; shareable,
// see cuda.go), or any other range (Map; private: it records the range but
// cannot be imported elsewhere). Pack
// turns an export into a versioned, bounds-checked blob; Import, in
// another process (or domain), parses the blob, fetches the region's memfd
// from the exporter's fd server over an authenticated abstract Unix socket
// and maps it, giving an IMPORT memh that keeps the exporter's address and
// length and records its own local ones.
//
// Ownership: a memh's memory stays mapped while the memh is mapped or
// retained (Retain/Release). An Alloc'ed region is freed when its own memh,
// every memh mapped inside it and every fd hand-out in flight have let go
// of it; an importer's mapping is its own and survives the exporter's
// unmap. Bindings (Bind) are per-owner state (an endpoint's peer mappings)
// that Unmap and Unbind remove, not null, and release outside the lock.
//
// Locking: Domain.mu guards the list, every memh's mutable state and the
// counters. It is never held across a socket operation, a wait, a hook or
// a release callback: snapshot under the lock, act outside, re-check.
package memreg

import (
	"crypto/rand"
	"fmt"
	"math"
	"os"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gosym/gosym/gobackend/internal/config"
	"github.com/gosym/gosym/gobackend/internal/shm"
	"github.com/gosym/gosym/gobackend/internal/status"
)

// HostDevice is the device number of host (CPU) memory; CUDA devices are 0, 1, ...
const HostDevice = -1

// DefaultTimeout bounds Import (connect, request, reply).
const DefaultTimeout = 10 * time.Second

// Mode says whether a memh describes local memory or an imported blob.
type Mode uint8

// Modes.
const (
	Export Mode = iota
	Import
)

func (m Mode) String() string {
	if m == Import {
		return "import"
	}
	return "export"
}

var (
	// ErrUnmapped is returned for operations on a memh after Unmap.
	ErrUnmapped = &status.Error{Code: status.InvalidHandle, Msg: "memh is unmapped"}
	// ErrClosed is returned by a Domain after Close.
	ErrClosed = &status.Error{Code: status.Closed, Msg: "memreg domain is closed"}
)

// Hooks are test instruments; a Domain has none unless SetHooks is called.
type Hooks struct {
	// Fault is called at each resource-acquisition step; a non-nil error
	// makes the step fail as if its system call had. Steps: alloc.memfd,
	// alloc.mmap, secret, cuda.share (Map of device memory), register
	// (Alloc, Map, Import), server.listen, server.start (first Pack of a
	// shareable memh), import.connect, import.peercred, import.request,
	// import.recv, import.mmap, import.cuda (Import), serve.lend (exporter
	// side: the importer gets an error reply).
	Fault func(step string) error
	// Unmap runs in Unmap after the memh has left the list, before its
	// bindings are released, outside every lock: make it slow to show that
	// nobody else waits for a deregistration.
	Unmap func(m *Memh)
}

// nextID numbers memhs process-wide, so an id names one memh in any domain.
var nextID atomic.Uint64

// Domain owns one process's memhs and its fd server.
type Domain struct {
	mu     sync.Mutex
	live   []*Memh // mapped memhs, oldest first
	closed bool
	st     counters
	uid    atomic.Int64 // the uid peers must run as; tests change it to fake another user

	hooks atomic.Pointer[Hooks]
	cuda  atomic.Pointer[cudaBox] // the driver side of CUDA memhs (cuda.go)

	srvMu     sync.Mutex // serialises starting and stopping the server; never taken under mu
	srv       *server
	srvClosed bool
}

type counters struct {
	allocs, maps, imports, unmaps, regions, served, refusals int64
}

// NewDomain returns an empty domain; it starts nothing until a shareable
// memh is packed.
func NewDomain() *Domain {
	d := &Domain{}
	d.uid.Store(int64(os.Getuid()))
	return d
}

// Default is the process's domain.
var Default = NewDomain()

// SetHooks installs test hooks (nil removes them).
func (d *Domain) SetHooks(h *Hooks) { d.hooks.Store(h) }

func (d *Domain) fault(step string) error {
	if h := d.hooks.Load(); h != nil && h.Fault != nil {
		if err := h.Fault(step); err != nil {
			return status.Wrap(status.System, err, "memreg: %s", step)
		}
	}
	return nil
}

// allocation is a region this domain created; refs counts its holders:
// the Alloc memh, memhs mapped inside it, and fd hand-outs in flight.
type allocation struct {
	region *shm.Region
	refs   int // guarded by Domain.mu
}

// Memh is a registered range. Its identity fields never change; the rest
// is guarded by its domain's mutex.
type Memh struct {
	d      *Domain
	id     uint64
	mode   Mode
	addr   uintptr // the exporter's address (this process's, for an export)
	length int
	device int
	local  uintptr // this process's address of the range

	alloc  *allocation // export inside a region of this domain (shareable), else nil
	imp    *shm.Region // import: this process's mapping of the exporter's region
	offset int         // offset of the range in alloc's region, imp, or the CUDA allocation
	owner  bool        // made by Alloc: its alloc ref is the region's first
	secret [secretLen]byte

	cuda      *CUDAShare // export of shareable device memory: its allocation
	why       string     // export of device memory: why it is private
	cudaBase  uintptr    // CUDA import: where this process mapped the allocation
	cudaClose CUDA       // CUDA import: who unmaps it
	cudaOf    *CUDAShare // CUDA import: the allocation it mapped

	unmapped bool      // left the list: no new lookups, retains or bindings
	mapRef   bool      // held from creation until Unmap has released the bindings
	holds    int       // Retain count
	freed    bool      // resources released
	binds    []binding // one per owner
}

type binding struct {
	owner   any
	state   any
	release func()
}

// ID is the memh's process-wide unique id (never 0).
func (m *Memh) ID() uint64 { return m.id }

// Mode is Export or Import.
func (m *Memh) Mode() Mode { return m.mode }

// Address is the exporter's address of the range.
func (m *Memh) Address() uintptr { return m.addr }

// Len is the exporter's length of the range in bytes.
func (m *Memh) Len() int { return m.length }

// Device is HostDevice or a CUDA device number.
func (m *Memh) Device() int { return m.device }

// LocalAddress is where the range is mapped in this process (Address for an export).
func (m *Memh) LocalAddress() uintptr { return m.local }

// LocalLen is the length mapped in this process (Len for an export).
func (m *Memh) LocalLen() int { return m.length }

// Shareable reports whether Pack gives a blob another process can import
// (and a group may bind the memory).
func (m *Memh) Shareable() bool { return m.mode == Export && (m.alloc != nil || m.cuda != nil) }

func (m *Memh) String() string {
	return fmt.Sprintf("memh %d (%s, %#x+%d, device %d, local %#x)", m.id, m.mode, m.addr, m.length, m.device, m.local)
}

// Bytes is the range as a slice where this package owns the mapping
// (Alloc'ed, mapped inside an Alloc'ed region, or imported); nil for a
// private memh or once the memory has been released. The slice must not
// be used after Unmap unless the memh is retained.
func (m *Memh) Bytes() []byte {
	d := m.d
	if d == nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case m.freed:
		return nil
	case m.imp != nil:
		return m.imp.Bytes()[m.offset : m.offset+m.length]
	case m.alloc != nil:
		return m.alloc.region.Bytes()[m.offset : m.offset+m.length]
	}
	return nil
}

func newSecret(d *Domain) ([secretLen]byte, error) {
	var s [secretLen]byte
	if _, err := rand.Read(s[:]); err != nil {
		return s, status.Wrap(status.System, err, "memreg: random secret")
	}
	return s, d.fault("secret")
}

// Alloc creates a shareable host memory region of size bytes (zero-filled
// memfd pages) and returns its EXPORT memh. Unmap releases it.
func (d *Domain) Alloc(size int) (*Memh, error) {
	if size <= 0 {
		return nil, status.Errorf(status.InvalidArg, "memreg: alloc of %d bytes: size must be positive", size)
	}
	if err := d.fault("alloc.memfd"); err != nil {
		return nil, err
	}
	r, err := shm.NewRegion(fmt.Sprintf("memreg:%d", size), size)
	if err != nil {
		return nil, status.Wrap(status.System, err, "memreg: alloc %d bytes", size)
	}
	m := &Memh{d: d, mode: Export, addr: r.Addr(), length: size, device: HostDevice, local: r.Addr(),
		alloc: &allocation{region: r, refs: 1}, owner: true, mapRef: true}
	if err = d.fault("alloc.mmap"); err == nil {
		m.secret, err = newSecret(d)
	}
	if err == nil {
		err = d.insert(m, nil)
	}
	if err != nil {
		r.Close()
		return nil, err
	}
	return m, nil
}

// Map registers [addr, addr+length) on device (HostDevice or a CUDA
// ordinal) as an EXPORT memh. A host range inside a region this domain
// allocated is shareable, and so is device memory whose allocation the
// driver can export (resolved here, once); any other range is private
// (Pack gives a blob with no transport). Map never talks to another process.
func (d *Domain) Map(addr uintptr, length int, device int) (*Memh, error) {
	switch {
	case length <= 0:
		return nil, status.Errorf(status.InvalidArg, "memreg: map %#x: length %d must be positive", addr, length)
	case addr == 0:
		return nil, status.Errorf(status.InvalidArg, "memreg: map of a null address (%d bytes)", length)
	case uint64(length) > uint64(^uintptr(0)-addr):
		return nil, status.Errorf(status.InvalidArg, "memreg: map %#x + %d bytes wraps around the address space", addr, length)
	case device < HostDevice:
		return nil, status.Errorf(status.InvalidArg, "memreg: map %#x: device %d", addr, device)
	}
	m := &Memh{d: d, mode: Export, addr: addr, length: length, device: device, local: addr, mapRef: true}
	var err error
	// The secret is drawn outside the lock, before we know whether the
	// range is shareable (host memory in a region, or VMM memory: what the
	// fd server lends); a memh that is neither never uses it.
	if m.secret, err = newSecret(d); err != nil {
		return nil, err
	}
	if device != HostDevice {
		if err = d.shareCUDA(m); err != nil {
			return nil, err
		}
	}
	if err := d.insert(m, d.attachToAlloc); err != nil {
		return nil, err
	}
	return m, nil
}

// attachToAlloc (under mu) makes m shareable when it lies inside a live
// Alloc'ed region, taking a region reference.
func (d *Domain) attachToAlloc(m *Memh) error {
	lo, hi := m.addr, m.addr+uintptr(m.length)
	for _, o := range d.live {
		if !o.owner {
			continue
		}
		olo, ohi := o.addr, o.addr+uintptr(o.length)
		if hi <= olo || lo >= ohi {
			continue
		}
		switch {
		case lo < olo || hi > ohi:
			return status.Errorf(status.InvalidArg, "memreg: map %#x+%d straddles the edge of region %#x+%d",
				m.addr, m.length, o.addr, o.length)
		case m.device != HostDevice:
			return status.Errorf(status.InvalidArg, "memreg: map %#x+%d on device %d lies in host region %#x+%d",
				m.addr, m.length, m.device, o.addr, o.length)
		}
		m.alloc, m.offset = o.alloc, int(lo-olo)
		o.alloc.refs++
		return nil
	}
	return nil
}

// insert numbers m and adds it to the list; attach, if given, runs under
// the lock first and may refuse.
func (d *Domain) insert(m *Memh, attach func(*Memh) error) error {
	if err := d.fault("register"); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return ErrClosed
	}
	if attach != nil {
		if err := attach(m); err != nil {
			return err
		}
	}
	m.id = nextID.Add(1)
	d.live = append(d.live, m)
	switch {
	case m.mode == Import:
		d.st.imports++
		d.st.regions++
	case m.owner:
		d.st.allocs++
		d.st.regions++
	default:
		d.st.maps++
	}
	return nil
}

// Find returns the mapped memh whose local range encloses [addr,
// addr+length): the largest such (so sub-ranges share their enclosing
// registration), the oldest among equals. ok is false when none does,
// for length <= 0 and for a range that wraps.
func (d *Domain) Find(addr uintptr, length int) (m *Memh, ok bool) {
	if length <= 0 || uint64(length) > uint64(^uintptr(0)-addr) {
		return nil, false
	}
	hi := addr + uintptr(length)
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.live {
		if c.local <= addr && hi <= c.local+uintptr(c.length) && (m == nil || c.length > m.length) {
			m = c
		}
	}
	return m, m != nil
}

// Get returns the mapped memh with this id.
func (d *Domain) Get(id uint64) (*Memh, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, m := range d.live {
		if m.id == id {
			return m, nil
		}
	}
	return nil, status.Errorf(status.InvalidHandle, "memreg: no mapped memh with id %d", id)
}

// Unmap removes m from the domain, removes its bindings (calling their
// release funcs) and releases its memory once it is no longer retained.
// A second Unmap of the same memh is a no-op returning nil; a memh of
// another domain (or nil) is an error.
func (d *Domain) Unmap(m *Memh) error {
	if m == nil || m.d != d {
		return status.Errorf(status.InvalidHandle, "memreg: unmap of a memh this domain does not know")
	}
	d.mu.Lock()
	if m.unmapped {
		d.mu.Unlock()
		return nil
	}
	m.unmapped = true
	d.remove(m)
	binds := m.binds
	m.binds = nil
	d.st.unmaps++
	d.mu.Unlock()

	if h := d.hooks.Load(); h != nil && h.Unmap != nil {
		h.Unmap(m)
	}
	for _, b := range binds {
		b.release()
	}
	d.mu.Lock()
	m.mapRef = false
	free := d.maybeFree(m)
	d.mu.Unlock()
	free()
	return nil
}

func (d *Domain) remove(m *Memh) {
	for i, c := range d.live {
		if c == m {
			d.live = slices.Delete(d.live, i, i+1)
			return
		}
	}
}

// maybeFree (under mu) marks m freed when nothing holds it any more and
// returns what must be released outside the lock.
func (d *Domain) maybeFree(m *Memh) func() {
	if m.freed || m.mapRef || m.holds > 0 {
		return func() {}
	}
	m.freed = true
	if m.cudaBase != 0 {
		d.st.regions--
		c, dev, s, base := m.cudaClose, m.device, m.cudaOf, m.cudaBase
		return func() { c.Close(dev, s, base) }
	}
	if m.imp != nil {
		d.st.regions--
		r := m.imp
		return func() { r.Close() }
	}
	if m.alloc != nil {
		return d.dropAlloc(m.alloc)
	}
	return func() {}
}

// dropAlloc (under mu) drops one reference of a; the last one frees it
// (outside the lock, through the returned func).
func (d *Domain) dropAlloc(a *allocation) func() {
	if a.refs--; a.refs > 0 {
		return func() {}
	}
	d.st.regions--
	return func() { a.region.Close() }
}

// Retain keeps m's memory mapped past Unmap until the matching Release
// (an in-flight collective's reference). It fails on an unmapped memh.
func (m *Memh) Retain() error {
	d := m.d
	if d == nil {
		return status.Errorf(status.InvalidHandle, "memreg: retain of an unregistered memh")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if m.unmapped {
		return fmt.Errorf("%w: retain of %v", ErrUnmapped, m)
	}
	m.holds++
	return nil
}

// Release drops a reference taken by Retain.
func (m *Memh) Release() error {
	d := m.d
	if d == nil {
		return status.Errorf(status.InvalidHandle, "memreg: release of an unregistered memh")
	}
	d.mu.Lock()
	if m.holds == 0 {
		d.mu.Unlock()
		return status.Errorf(status.InvalidArg, "memreg: release of %v, which is not retained", m)
	}
	m.holds--
	free := d.maybeFree(m)
	d.mu.Unlock()
	free()
	return nil
}

// Bind attaches owner's state to m (owner: a comparable key, such as an
// endpoint pointer). If owner is already bound, nothing changes and the
// existing state comes back with added == false: the caller lost a race
// and must undo its own work. release runs exactly once, outside every
// lock, when Unbind, UnbindAll or Unmap removes the binding.
func (m *Memh) Bind(owner, state any, release func()) (cur any, added bool, err error) {
	d := m.d
	switch {
	case d == nil:
		return nil, false, status.Errorf(status.InvalidHandle, "memreg: bind to an unregistered memh")
	case owner == nil || !reflect.TypeOf(owner).Comparable():
		return nil, false, status.Errorf(status.InvalidArg, "memreg: binding owner %T is not a comparable key", owner)
	case release == nil:
		release = func() {}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if m.unmapped {
		return nil, false, fmt.Errorf("%w: bind to %v", ErrUnmapped, m)
	}
	for _, b := range m.binds {
		if b.owner == owner {
			return b.state, false, nil
		}
	}
	m.binds = append(m.binds, binding{owner: owner, state: state, release: release})
	return state, true, nil
}

// Binding returns owner's state on m.
func (m *Memh) Binding(owner any) (state any, ok bool) {
	d := m.d
	if d == nil || owner == nil || !reflect.TypeOf(owner).Comparable() {
		return nil, false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, b := range m.binds {
		if b.owner == owner {
			return b.state, true
		}
	}
	return nil, false
}

// Bindings is the number of owners bound to m.
func (m *Memh) Bindings() int {
	if m.d == nil {
		return 0
	}
	m.d.mu.Lock()
	defer m.d.mu.Unlock()
	return len(m.binds)
}

// Unbind removes owner's binding from m and runs its release; false when
// there was none (already removed by Unmap, say).
func (m *Memh) Unbind(owner any) bool {
	d := m.d
	if d == nil || owner == nil || !reflect.TypeOf(owner).Comparable() {
		return false
	}
	d.mu.Lock()
	b, ok := takeBinding(m, owner)
	d.mu.Unlock()
	if ok {
		b.release()
	}
	return ok
}

func takeBinding(m *Memh, owner any) (binding, bool) {
	for i, b := range m.binds {
		if b.owner == owner {
			m.binds = slices.Delete(m.binds, i, i+1)
			return b, true
		}
	}
	return binding{}, false
}

// UnbindAll removes owner's binding from every mapped memh (an endpoint
// going away) and runs the releases outside the lock; it returns how many
// it removed.
func (d *Domain) UnbindAll(owner any) int {
	if owner == nil || !reflect.TypeOf(owner).Comparable() {
		return 0
	}
	var taken []binding
	d.mu.Lock()
	for _, m := range d.live {
		if b, ok := takeBinding(m, owner); ok {
			taken = append(taken, b)
		}
	}
	d.mu.Unlock()
	for _, b := range taken {
		b.release()
	}
	return len(taken)
}

// Stats reports the domain's counters: allocs, maps, imports, unmaps (calls
// that did something), live (mapped memhs), regions (Alloc'ed regions and
// import mappings not yet released), bindings, served (fds handed out),
// refusals (fd requests refused).
func (d *Domain) Stats() map[string]int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	var binds int64
	for _, m := range d.live {
		binds += int64(len(m.binds))
	}
	return map[string]int64{
		"allocs": d.st.allocs, "maps": d.st.maps, "imports": d.st.imports, "unmaps": d.st.unmaps,
		"live": int64(len(d.live)), "regions": d.st.regions, "bindings": binds,
		"served": d.st.served, "refusals": d.st.refusals,
	}
}

// Close stops the fd server and unmaps every memh; later calls fail with
// ErrClosed. Retained memory stays mapped until released. Idempotent.
func (d *Domain) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	ms := append([]*Memh(nil), d.live...)
	d.mu.Unlock()
	d.stopServer()
	for _, m := range ms {
		d.Unmap(m)
	}
	return nil
}

// Pack serialises an EXPORT memh for another process (see blob.go). A
// shareable memh carries a "memfd" entry and starts the domain's fd server
// on first use; a private one packs with no transport entry.
func (m *Memh) Pack() ([]byte, error) {
	d := m.d
	if d == nil {
		return nil, status.Errorf(status.InvalidHandle, "memreg: pack of an unregistered memh")
	}
	d.mu.Lock()
	unmapped := m.unmapped
	d.mu.Unlock()
	switch {
	case unmapped:
		return nil, fmt.Errorf("%w: pack of %v", ErrUnmapped, m)
	case m.mode == Import:
		return nil, status.Errorf(status.NotSupported, "memreg: pack of %v: an imported memh cannot be re-exported", m)
	}
	p := &packed{pid: os.Getpid(), device: m.device, addr: uint64(m.addr), length: uint64(m.length)}
	switch s := m.cuda; {
	case s != nil && s.VMM:
		sock, err := d.ensureServer()
		if err != nil {
			return nil, err
		}
		p.vmm = &vmmEntry{gpu: s.GPU, size: s.Size, offset: uint64(m.offset), secret: m.secret, sock: sock}
	case s != nil:
		p.cuda = &cudaEntry{gpu: s.GPU, size: s.Size, offset: uint64(m.offset), handle: s.Handle}
	}
	if m.alloc != nil {
		sock, err := d.ensureServer()
		if err != nil {
			return nil, err
		}
		p.memfd = &memfdEntry{secret: m.secret, regionOff: uint64(m.offset),
			regionLen: uint64(m.alloc.region.Size), sock: sock}
	}
	return p.encode(), nil
}

// Import maps a packed memh within DefaultTimeout.
func (d *Domain) Import(blob []byte) (*Memh, error) {
	return d.ImportDeadline(blob, time.Now().Add(DefaultTimeout))
}

// ImportDeadline is ImportOn for host memory: a CUDA blob fails (it needs
// a device).
func (d *Domain) ImportDeadline(blob []byte, deadline time.Time) (*Memh, error) {
	return d.ImportOn(blob, HostDevice, deadline)
}

// ImportOn parses blob and maps the memory it describes. Host memory: it
// fetches the region's fd from the exporter (authenticated both ways) and
// maps it, all by deadline. CUDA memory: it opens the allocation's IPC
// handle on device (an ordinal of this process; lazy peer access) and
// needs no round trip. The IMPORT memh keeps the exporter's Address/Len;
// LocalAddress is where this process sees the range, and Device is device
// for CUDA memory. A private memh's blob fails with ErrNoTransport.
func (d *Domain) ImportOn(blob []byte, device int, deadline time.Time) (*Memh, error) {
	p, err := parse(blob)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	closed := d.closed
	d.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	if p.cuda != nil || p.vmm != nil {
		return d.importCUDA(p, device, deadline)
	}
	if p.memfd == nil {
		return nil, fmt.Errorf("%w: %#x+%d of pid %d on device %d (%d other entries)",
			ErrNoTransport, p.addr, p.length, p.pid, p.device, p.skipped)
	}
	if p.memfd.regionLen > math.MaxInt {
		return nil, fmt.Errorf("%w: region of %d bytes", ErrBadBlob, p.memfd.regionLen)
	}
	fd, err := d.fetchFD(p.pid, p.memfd.secret, p.memfd.sock, p.memfd.regionLen, deadline)
	if err != nil {
		return nil, err
	}
	r, err := shm.MapFD(fd, int(p.memfd.regionLen))
	closeFD(fd) // the mapping keeps the file
	if err != nil {
		return nil, status.Wrap(status.System, err, "memreg: import: map the region of pid %d", p.pid)
	}
	off := int(p.memfd.regionOff)
	m := &Memh{d: d, mode: Import, addr: uintptr(p.addr), length: int(p.length), device: p.device,
		local: r.Addr() + uintptr(off), imp: r, offset: off, mapRef: true}
	if err = d.fault("import.mmap"); err == nil {
		err = d.insert(m, nil)
	}
	if err != nil {
		r.Close()
		return nil, err
	}
	return m, nil
}

// UBRMode is GOSYM_ENABLE_UBR: "try" (default), "yes" or "no", read once:
// every op consults it.
var UBRMode = sync.OnceValue(func() string {
	return config.EnableUBR.Get()
})
