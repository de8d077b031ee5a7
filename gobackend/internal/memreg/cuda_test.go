package memreg

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/gosym/gosym/gobackend/internal/status"
)

// fakeGPUs is the host's GPUs and their allocations as the fake driver
// sees them: one world shared by the fake "processes" (domains) of a test.
type fakeGPUs struct {
	mu     sync.Mutex
	allocs []*fakeAlloc
	nextVA uintptr
}

type fakeAlloc struct {
	gpu        GPUID
	base, size uintptr
	ipc        bool // cudaMalloc memory (legacy IPC works); false: VMM
	fd         bool // VMM memory exportable as a POSIX fd (gosym.empty's)
	handle     [IPCHandleLen]byte
}

// alloc makes an allocation of size bytes on gpu; each has its own handle.
func (w *fakeGPUs) alloc(gpu GPUID, size uintptr, ipc bool) *fakeAlloc {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.nextVA += 1 << 32
	a := &fakeAlloc{gpu: gpu, base: 0x7e0000000000 + w.nextVA, size: size, ipc: ipc}
	binary.LittleEndian.PutUint64(a.handle[:], uint64(a.base))
	binary.LittleEndian.PutUint64(a.handle[8:], uint64(len(w.allocs)+1)) // new handle after a free + realloc
	w.allocs = append(w.allocs, a)
	return a
}

// fakeCUDA is one process's driver: the GPUs it sees, by ordinal.
type fakeCUDA struct {
	w    *fakeGPUs
	gpus []GPUID

	mu                    sync.Mutex
	shares, opens, closes int
	mapped                map[uintptr]int // base -> device
	openErr               error
}

func newFakeCUDA(w *fakeGPUs, gpus ...GPUID) *fakeCUDA {
	return &fakeCUDA{w: w, gpus: gpus, mapped: map[uintptr]int{}}
}

func (f *fakeCUDA) Share(device int, addr uintptr, n int) (*CUDAShare, string, error) {
	f.mu.Lock()
	f.shares++
	f.mu.Unlock()
	if device >= len(f.gpus) {
		return nil, "", status.Errorf(status.InvalidArg, "cuda:%d does not exist", device)
	}
	f.w.mu.Lock()
	defer f.w.mu.Unlock()
	for _, a := range f.w.allocs {
		switch {
		case addr < a.base || addr >= a.base+a.size:
		case a.gpu != f.gpus[device]:
			return nil, "", status.Errorf(status.InvalidArg, "memory of another device")
		case addr+uintptr(n) > a.base+a.size:
			return nil, "spans allocations", nil
		case a.fd:
			return &CUDAShare{GPU: a.gpu, Base: uint64(a.base), Size: uint64(a.size), VMM: true}, "", nil
		case !a.ipc:
			return nil, "not legacy-IPC shareable", nil
		default:
			return &CUDAShare{GPU: a.gpu, Handle: a.handle, Base: uint64(a.base), Size: uint64(a.size)}, "", nil
		}
	}
	return nil, "not device memory", nil
}

// ExportFD stands a VMM allocation's fd by a memfd holding its base.
func (f *fakeCUDA) ExportFD(device int, s *CUDAShare) (int, error) {
	fd, err := unix.MemfdCreate("fakevmm", unix.MFD_CLOEXEC)
	if err != nil {
		return -1, err
	}
	if _, err = unix.Pwrite(fd, binary.LittleEndian.AppendUint64(nil, s.Base), 0); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// OpenFD maps what the fd names, checking that it is s's allocation.
func (f *fakeCUDA) OpenFD(device int, s *CUDAShare, fd int) (uintptr, error) {
	var b [8]byte
	if _, err := unix.Pread(fd, b[:], 0); err != nil {
		return 0, err
	}
	if got := binary.LittleEndian.Uint64(b[:]); got != s.Base {
		return 0, fmt.Errorf("the fd exports the allocation at %#x, the blob says %#x", got, s.Base)
	}
	return f.Open(device, s)
}

func (f *fakeCUDA) Open(device int, s *CUDAShare) (uintptr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.openErr != nil {
		return 0, f.openErr
	}
	visible := false
	for _, g := range f.gpus {
		visible = visible || g == s.GPU
	}
	if !visible || device >= len(f.gpus) {
		return 0, status.Errorf(status.NotSupported, "GPU %s is not visible", s.GPU)
	}
	f.opens++
	base := uintptr(0x600000000000) + uintptr(f.opens)<<32
	f.mapped[base] = device
	return base, nil
}

func (f *fakeCUDA) Close(device int, _ *CUDAShare, base uintptr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if d, ok := f.mapped[base]; !ok || d != device {
		return fmt.Errorf("close of %#x on cuda:%d, which is not open", base, device)
	}
	delete(f.mapped, base)
	f.closes++
	return nil
}

func (f *fakeCUDA) counts() (shares, opens, closes, mapped int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.shares, f.opens, f.closes, len(f.mapped)
}

var gpu0, gpu1 = GPUID{Bus: 0x1b}, GPUID{Domain: 1, Bus: 0x2c, Device: 3}

// foreign makes a blob look packed by another process (a CUDA IPC handle
// cannot be opened by its exporter).
func foreign(b []byte) []byte {
	binary.LittleEndian.PutUint32(b[8:], uint32(os.Getpid()+1))
	return b
}

func TestCUDAMap(t *testing.T) {
	w := &fakeGPUs{}
	drv := newFakeCUDA(w, gpu0, gpu1)
	d := newDomain(t)
	d.SetCUDA(drv)
	a := w.alloc(gpu1, 2<<20, true)
	vmm := w.alloc(gpu1, 2<<20, false)

	m, err := d.Map(a.base+4096, 1000, 1)
	require.NoError(t, err)
	assert.True(t, m.Shareable())
	assert.Empty(t, m.WhyPrivate())
	s, off, ok := m.CUDA()
	require.True(t, ok)
	assert.Equal(t, CUDAShare{GPU: gpu1, Handle: a.handle, Base: uint64(a.base), Size: uint64(a.size)}, s)
	assert.Equal(t, 4096, off)
	assert.Nil(t, m.Bytes(), "device memory has no host view")

	// Packing, twice, makes no driver call: the handle was resolved at Map.
	for range 2 {
		blob, err := m.Pack()
		require.NoError(t, err)
		p, err := parse(blob)
		require.NoError(t, err)
		assert.Equal(t, &cudaEntry{gpu: gpu1, size: 2 << 20, offset: 4096, handle: a.handle}, p.cuda)
		assert.Equal(t, 1, p.device)
		assert.Equal(t, uint64(a.base+4096), p.addr)
		info, err := BlobInfo(blob)
		require.NoError(t, err)
		assert.Equal(t, "cudaipc", info["transport"])
		assert.Equal(t, gpu1.String(), info["gpu"])
	}
	shares, _, _, _ := drv.counts()
	assert.Equal(t, 1, shares)

	private := []struct {
		name   string
		addr   uintptr
		n, dev int
		why    string
	}{
		{"VMM memory", vmm.base, 64, 1, "not legacy-IPC"},
		{"range past the allocation", a.base + a.size - 10, 11, 1, "spans"},
		{"not device memory", 0x1000, 8, 0, "not device memory"},
	}
	for _, tt := range private {
		t.Run(tt.name, func(t *testing.T) {
			m, err := d.Map(tt.addr, tt.n, tt.dev)
			require.NoError(t, err)
			defer d.Unmap(m)
			assert.False(t, m.Shareable())
			assert.Contains(t, m.WhyPrivate(), tt.why)
			_, _, ok := m.CUDA()
			assert.False(t, ok)
			blob, err := m.Pack()
			require.NoError(t, err)
			_, err = d.ImportOn(foreign(blob), 0, time.Now().Add(time.Second))
			assert.ErrorIs(t, err, ErrNoTransport)
		})
	}

	// VMM memory made exportable (gosym.empty's) is shared with groups by
	// fd: shareable, with no blob to carry it.
	exp := w.alloc(gpu1, 4<<20, false)
	exp.fd = true
	mv, err := d.Map(exp.base+2<<20, 100, 1)
	require.NoError(t, err)
	assert.True(t, mv.Shareable())
	sv, off, ok := mv.CUDA()
	require.True(t, ok)
	assert.Equal(t, CUDAShare{GPU: gpu1, Base: uint64(exp.base), Size: 4 << 20, VMM: true}, sv)
	assert.Equal(t, 2<<20, off)
	// Its blob names the fd server, which lends the allocation's fd; the
	// importer (here another domain of this process) maps it.
	blob, err := mv.Pack()
	require.NoError(t, err)
	info, err := BlobInfo(blob)
	require.NoError(t, err)
	assert.Equal(t, "cudavmm", info["transport"])
	other := newDomain(t)
	odrv := newFakeCUDA(w, gpu1)
	other.SetCUDA(odrv)
	im, err := other.ImportOn(blob, 0, time.Now().Add(5*time.Second))
	require.NoError(t, err)
	_, opens, _, mapped := odrv.counts()
	assert.Equal(t, 1, opens)
	assert.Equal(t, 1, mapped)
	assert.Equal(t, im.LocalAddress()-uintptr(2<<20), im.cudaBase, "the range's offset in the allocation")
	assert.Equal(t, int64(1), d.Stats()["served"])
	require.NoError(t, other.Unmap(im))
	_, _, closes, mapped := odrv.counts()
	assert.Equal(t, 1, closes)
	assert.Equal(t, 0, mapped)
	// Unmapped, the exporter lends nothing more.
	require.NoError(t, d.Unmap(mv))
	_, err = other.ImportOn(blob, 0, time.Now().Add(5*time.Second))
	assert.Equal(t, status.Peer, status.CodeOf(err))

	_, err = d.Map(a.base, 8, 0)
	assert.ErrorContains(t, err, "another device")
	_, err = d.Map(a.base, 8, 7)
	assert.ErrorContains(t, err, "does not exist")

	none := newDomain(t)
	_, err = none.Map(a.base, 8, 1)
	assert.Equal(t, status.NotSupported, status.CodeOf(err))
	assert.ErrorContains(t, err, "CUDA is not available")

	require.NoError(t, d.Unmap(m))
	require.NoError(t, d.Unmap(m), "unmap is idempotent")
	_, err = m.Pack()
	assert.ErrorIs(t, err, ErrUnmapped)
	assert.Equal(t, int64(0), d.Stats()["live"])
}

// TestCUDAImport: a CUDA blob imported in another "process" opens the
// allocation on the importer's device, once, and its unmap (or the
// domain's close, or the last release) closes it, once.
func TestCUDAImport(t *testing.T) {
	w := &fakeGPUs{}
	expDrv, impDrv := newFakeCUDA(w, gpu0, gpu1), newFakeCUDA(w, gpu1, gpu0) // other numbering
	exp, imp := newDomain(t), newDomain(t)
	exp.SetCUDA(expDrv)
	imp.SetCUDA(impDrv)
	a := w.alloc(gpu0, 4<<20, true)
	m, err := exp.Map(a.base+12345, 777, 0)
	require.NoError(t, err)
	blob, err := m.Pack()
	require.NoError(t, err)
	blob = foreign(blob)
	deadline := time.Now().Add(time.Second)

	got, err := imp.ImportOn(blob, 0, deadline)
	require.NoError(t, err)
	assert.Equal(t, Import, got.Mode())
	assert.False(t, got.Shareable())
	assert.Equal(t, 0, got.Device())
	assert.Equal(t, m.Address(), got.Address())
	assert.Equal(t, 777, got.Len())
	_, opens, _, mapped := impDrv.counts()
	require.Equal(t, 1, opens)
	require.Equal(t, 1, mapped)
	var base uintptr
	for b := range impDrv.mapped {
		base = b
	}
	assert.Equal(t, base+12345, got.LocalAddress())
	found, ok := imp.Find(got.LocalAddress()+10, 10)
	assert.True(t, ok)
	assert.Same(t, got, found)
	_, err = got.Pack()
	assert.Equal(t, status.NotSupported, status.CodeOf(err))
	assert.Equal(t, int64(1), imp.Stats()["regions"])

	// Retained past Unmap: the mapping stays until the release.
	require.NoError(t, got.Retain())
	require.NoError(t, imp.Unmap(got))
	_, _, closes, _ := impDrv.counts()
	assert.Equal(t, 0, closes)
	require.NoError(t, got.Release())
	_, _, closes, mapped = impDrv.counts()
	assert.Equal(t, 1, closes)
	assert.Equal(t, 0, mapped)
	require.NoError(t, imp.Unmap(got))
	assert.Equal(t, int64(0), imp.Stats()["regions"])

	// The exporter's own unmap does not touch the importer's mapping.
	again, err := imp.ImportOn(blob, 1, deadline)
	require.NoError(t, err)
	require.NoError(t, exp.Unmap(m))
	_, _, _, mapped = impDrv.counts()
	assert.Equal(t, 1, mapped)
	assert.Equal(t, 1, again.Device())

	// Closing the domain closes what is left.
	require.NoError(t, imp.Close())
	_, opens, closes, mapped = impDrv.counts()
	assert.Equal(t, 2, opens)
	assert.Equal(t, 2, closes)
	assert.Equal(t, 0, mapped)
}

func TestCUDAImportRefused(t *testing.T) {
	w := &fakeGPUs{}
	exp := newDomain(t)
	exp.SetCUDA(newFakeCUDA(w, gpu0))
	a := w.alloc(gpu0, 1<<20, true)
	m, err := exp.Map(a.base, 100, 0)
	require.NoError(t, err)
	own, err := m.Pack()
	require.NoError(t, err)
	blob := foreign(append([]byte(nil), own...))
	deadline := time.Now().Add(time.Second)

	other := newFakeCUDA(w, gpu1) // cannot see gpu0
	imp := newDomain(t)
	imp.SetCUDA(other)
	cases := []struct {
		name   string
		d      *Domain
		blob   []byte
		device int
		code   status.Code
		want   string
	}{
		{"no device given", imp, blob, HostDevice, status.NotSupported, "name the device"},
		{"own process", exp, own, 0, status.NotSupported, "process that exported it"},
		{"no CUDA here", newDomain(t), blob, 0, status.NotSupported, "CUDA is not available"},
		{"GPU not visible", imp, blob, 0, status.NotSupported, "not visible"},
		{"bad blob", imp, blob[:len(blob)-1], 0, status.InvalidArg, "bad packed memh"},
	}
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.d.ImportOn(tt.blob, tt.device, deadline)
			require.Error(t, err)
			assert.Equal(t, tt.code, status.CodeOf(err), "%v", err)
			assert.ErrorContains(t, err, tt.want)
			assert.Equal(t, int64(0), tt.d.Stats()["imports"])
		})
	}
	_, err = imp.Import(blob)
	assert.ErrorContains(t, err, "name the device", "Import is for host memory")

	// A failure after the open closes the mapping again.
	ok := newFakeCUDA(w, gpu0)
	imp2 := newDomain(t)
	imp2.SetCUDA(ok)
	imp2.SetHooks(&Hooks{Fault: func(step string) error {
		if step == "import.cuda" {
			return errors.New("injected")
		}
		return nil
	}})
	_, err = imp2.ImportOn(blob, 0, deadline)
	assert.ErrorContains(t, err, "injected")
	_, opens, closes, mapped := ok.counts()
	assert.Equal(t, []int{1, 1, 0}, []int{opens, closes, mapped})

	ok.openErr = errors.New("cuIpcOpenMemHandle: out of memory")
	imp2.SetHooks(nil)
	_, err = imp2.ImportOn(blob, 0, deadline)
	assert.ErrorContains(t, err, "out of memory")
	assert.Equal(t, int64(0), imp2.Stats()["regions"])
}
