package memreg

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/status"
)

func testPacked() *packed {
	p := &packed{pid: 4242, device: HostDevice, addr: 0x7f0000001000, length: 4096,
		memfd: &memfdEntry{regionOff: 4096, regionLen: 3 * 4096, sock: "gosym-memreg-4242-0011223344556677"}}
	for i := range p.memfd.secret {
		p.memfd.secret[i] = byte(i + 1)
	}
	return p
}

// testCUDAPacked is a CUDA memh: 1000 bytes at offset 4096 of a 2 MiB
// allocation on the exporter's cuda:1.
func testCUDAPacked() *packed {
	p := &packed{pid: 4243, device: 1, addr: 0x7f2000001000, length: 1000,
		cuda: &cudaEntry{gpu: GPUID{Domain: 0, Bus: 0x1b, Device: 0}, size: 2 << 20, offset: 4096}}
	for i := range p.cuda.handle {
		p.cuda.handle[i] = byte(0xa0 + i)
	}
	return p
}

// testVMMPacked is a VMM blob (gosym.empty's memory on cuda:1): its fd is
// lent by the exporter's server.
func testVMMPacked() *packed {
	p := &packed{pid: 4244, device: 1, addr: 0x7f2000201000, length: 5000,
		vmm: &vmmEntry{gpu: GPUID{Bus: 0x1b}, size: 4 << 20, offset: 4096, sock: "gosym-memreg-4244-00"}}
	for i := range p.vmm.secret {
		p.vmm.secret[i] = byte(0x30 + i)
	}
	return p
}

func withVMM(f func(p *packed)) []byte {
	p := testVMMPacked()
	f(p)
	return p.encode()
}

func withCUDA(f func(p *packed)) []byte {
	p := testCUDAPacked()
	f(p)
	return p.encode()
}

// seedBlobs are valid blobs of each shape, the fuzzer's starting points.
func seedBlobs() map[string][]byte {
	shareable := testPacked().encode()
	private := (&packed{pid: 1, device: 3, addr: 1 << 20, length: 7}).encode()
	unknown := appendEntry(append([]byte(nil), shareable...), "cufabric", []byte{1, 2, 3, 4, 5})
	return map[string][]byte{"shareable": shareable, "private": private, "unknown-entry": unknown,
		"cuda": testCUDAPacked().encode(), "vmm": testVMMPacked().encode()}
}

// mutate returns a copy of the shareable seed with f applied.
func mutate(f func(b []byte) []byte) []byte {
	return f(append([]byte(nil), testPacked().encode()...))
}

// sizeAt is the offset of the first entry's size field.
const sizeAt = headerLen + nameLen

// memfdAt is the offset of the memfd payload.
const memfdAt = headerLen + entryHdrLen

func withPacked(f func(p *packed)) []byte {
	p := testPacked()
	f(p)
	return p.encode()
}

func TestParseRoundTrip(t *testing.T) {
	for name, b := range seedBlobs() {
		t.Run(name, func(t *testing.T) {
			p, err := parse(b)
			require.NoError(t, err)
			q, err := parse(p.encode())
			require.NoError(t, err)
			q.skipped = p.skipped
			assert.Equal(t, p, q)
		})
	}
	p, err := parse(seedBlobs()["shareable"])
	require.NoError(t, err)
	assert.Equal(t, testPacked(), p)
	p, err = parse(seedBlobs()["unknown-entry"])
	require.NoError(t, err)
	assert.Equal(t, 1, p.skipped)
	assert.NotNil(t, p.memfd)
	p, err = parse(seedBlobs()["cuda"])
	require.NoError(t, err)
	assert.Equal(t, testCUDAPacked(), p)
	assert.Nil(t, p.memfd)
	p, err = parse(seedBlobs()["vmm"])
	require.NoError(t, err)
	assert.Equal(t, testVMMPacked(), p)
}

// cudaAt is the offset of the cudaipc payload in a CUDA blob.
const cudaAt = headerLen + entryHdrLen

func mutateCUDA(f func(b []byte) []byte) []byte {
	return f(append([]byte(nil), testCUDAPacked().encode()...))
}

type badCase struct {
	name string
	blob []byte
	want string // in the error
}

// badBlobs are the blobs parse must refuse, one per check.
func badBlobs() []badCase {
	le := binary.LittleEndian
	return []badCase{
		{"empty", nil, "empty"},
		{"truncated header", mutate(func(b []byte) []byte { return b[:headerLen-1] }), "truncated"},
		{"too large", make([]byte, maxBlob+1), "exceeds the limit"},
		{"wrong magic", mutate(func(b []byte) []byte { b[0] ^= 0xff; return b }), "magic"},
		{"unknown version", mutate(func(b []byte) []byte { le.PutUint16(b[4:], 2); return b }), "format version 2"},
		{"unknown flags", mutate(func(b []byte) []byte { le.PutUint16(b[6:], 1); return b }), "unknown flags"},
		{"pid 0", withPacked(func(p *packed) { p.pid = 0 }), "pid 0"},
		{"negative pid", mutate(func(b []byte) []byte { le.PutUint32(b[8:], 0xffffffff); return b }), "pid"},
		{"bad device", withPacked(func(p *packed) { p.device = -2 }), "device -2"},
		{"null address", withPacked(func(p *packed) { p.addr = 0 }), "null address"},
		{"zero length", withPacked(func(p *packed) { p.length = 0 }), "zero length"},
		{"huge length", withPacked(func(p *packed) { p.length = 1 << 63 }), "too large"},
		{"address wraps", withPacked(func(p *packed) { p.addr, p.length = 1<<64-4096, 8192 }), "wraps"},
		{"entry header truncated", mutate(func(b []byte) []byte { return append(b, 'x', 0, 0) }), "truncated"},
		{"entry size past the end", mutate(func(b []byte) []byte {
			le.PutUint32(b[sizeAt:], uint32(len(b)-memfdAt+1))
			return b
		}), "remain"},
		{"entry size 4 GiB", mutate(func(b []byte) []byte { le.PutUint32(b[sizeAt:], 0xffffffff); return b }), "exceeds the limit"},
		{"oversized entry", appendEntry(testPacked().encode(), "big", make([]byte, maxEntry+1)), "exceeds the limit"},
		{"truncated blob", mutate(func(b []byte) []byte { return b[:len(b)-1] }), "remain"},
		{"empty entry name", appendEntry(testPacked().encode(), "", nil), "empty name"},
		{"unprintable entry name", appendEntry(testPacked().encode(), "a\x01", nil), "name byte"},
		{"name not NUL-padded", appendEntry(testPacked().encode(), "ab\x00cd", nil), "NUL-padded"},
		{"duplicate entry", appendEntry(testPacked().encode(), transportMemfd,
			testPacked().encode()[memfdAt:]), "twice"},
		{"too many entries", func() []byte {
			b := (&packed{pid: 1, device: HostDevice, addr: 4096, length: 1}).encode()
			for i := 0; i <= maxEntries; i++ {
				b = appendEntry(b, fmt.Sprintf("t%d", i), nil)
			}
			return b
		}(), "more than"},
		{"memfd payload short", mutate(func(b []byte) []byte {
			b = b[:memfdAt+memfdFixed-1]
			le.PutUint32(b[sizeAt:], memfdFixed-1)
			return b
		}), "need at least"},
		{"socket name length mismatch", mutate(func(b []byte) []byte {
			le.PutUint16(b[memfdAt+secretLen+16:], 5)
			return b
		}), "payload holds"},
		{"empty socket name", withPacked(func(p *packed) { p.memfd.sock = "" }), "socket name of 0"},
		{"socket name too long", withPacked(func(p *packed) { p.memfd.sock = string(make([]byte, 200)) }), "socket name of 200"},
		{"socket name unprintable", withPacked(func(p *packed) { p.memfd.sock = "a b" }), "socket name byte"},
		{"region length 0", withPacked(func(p *packed) { p.memfd.regionLen = 0 }), "region length 0"},
		{"range past the region", withPacked(func(p *packed) { p.memfd.regionOff = 2*4096 + 1 }), "outside the region"},
		{"offset past the region", withPacked(func(p *packed) { p.memfd.regionOff = 1 << 63 }), "outside the region"},
		{"region length past int64", withPacked(func(p *packed) { p.memfd.regionOff, p.memfd.regionLen = 1<<64-1, 1<<63 }), "region length"},
		{"memfd on a CUDA device", withPacked(func(p *packed) { p.device = 0 }), "device 0"},
		{"cudaipc payload short", mutateCUDA(func(b []byte) []byte {
			b = b[:len(b)-1]
			le.PutUint32(b[sizeAt:], cudaFixed-1)
			return b
		}), "want 96"},
		{"cudaipc payload long", appendEntry(testCUDAPacked().encode()[:cudaAt-entryHdrLen], transportCUDA,
			append(testCUDAPacked().encode()[cudaAt:], 0)), "want 96"},
		{"cudaipc unknown flags", mutateCUDA(func(b []byte) []byte { b[cudaAt+12] = 1; return b }), "unknown flags"},
		{"cudaipc on host memory", withCUDA(func(p *packed) { p.device = HostDevice }), "host memory"},
		{"cudaipc allocation size 0", withCUDA(func(p *packed) { p.cuda.size = 0 }), "allocation size 0"},
		{"cudaipc allocation size past int64", withCUDA(func(p *packed) { p.cuda.size = 1 << 63 }), "allocation size"},
		{"cudaipc range past the allocation", withCUDA(func(p *packed) { p.cuda.offset = 2<<20 - 999 }), "outside the allocation"},
		{"cudaipc offset past the allocation", withCUDA(func(p *packed) { p.cuda.offset = 1<<64 - 1 }), "outside the allocation"},
		{"cudaipc allocation below address 0", withCUDA(func(p *packed) { p.addr, p.cuda.offset = 4096, 4096 }), "below address"},
		{"cudaipc empty handle", withCUDA(func(p *packed) { p.cuda.handle = [IPCHandleLen]byte{} }), "empty IPC handle"},
		{"cudaipc twice", appendEntry(testCUDAPacked().encode(), transportCUDA,
			testCUDAPacked().encode()[cudaAt:]), "twice"},
		{"cudaipc and memfd", appendEntry(testCUDAPacked().encode(), transportMemfd,
			testPacked().encode()[memfdAt:]), "host memory transport on device 1"},
		{"cudavmm payload short", appendEntry(testVMMPacked().encode()[:cudaAt-entryHdrLen], transportVMM,
			make([]byte, vmmFixed-1)), "need at least"},
		{"cudavmm on host memory", withVMM(func(p *packed) { p.device = HostDevice }), "host memory"},
		{"cudavmm range past the allocation", withVMM(func(p *packed) { p.vmm.offset = 4<<20 - 10 }), "outside the allocation"},
		{"cudavmm empty socket name", withVMM(func(p *packed) { p.vmm.sock = "" }), "socket name of 0 bytes"},
		{"cudavmm socket name unprintable", withVMM(func(p *packed) { p.vmm.sock = "a\x01" }), "socket name byte"},
		{"cudavmm socket name length mismatch", func() []byte {
			b := testVMMPacked().encode()
			le.PutUint16(b[cudaAt+cudaHead+secretLen:], 3)
			return b
		}(), "payload holds"},
		{"cudavmm and cudaipc", appendEntry(testVMMPacked().encode(), transportCUDA,
			testCUDAPacked().encode()[cudaAt:]), "two CUDA transports"},
	}
}

func TestParseBadBlobs(t *testing.T) {
	for _, tt := range badBlobs() {
		t.Run(tt.name, func(t *testing.T) {
			// A slice with no spare capacity: any read past the blob panics.
			b := tt.blob[:len(tt.blob):len(tt.blob)]
			p, err := parse(b)
			require.Error(t, err)
			assert.Nil(t, p)
			assert.ErrorIs(t, err, ErrBadBlob)
			assert.Contains(t, err.Error(), tt.want)
			assert.Equal(t, status.InvalidArg, status.CodeOf(err))

			// Import reports the same error, before touching any socket.
			d := NewDomain()
			defer d.Close()
			_, err = d.Import(b)
			assert.ErrorIs(t, err, ErrBadBlob)
			assert.Equal(t, int64(0), d.Stats()["imports"])
		})
	}
}

func TestParseEveryPrefix(t *testing.T) {
	// Only prefixes that end on an entry boundary are valid blobs.
	boundary := func(name string, n int) bool {
		return n == headerLen || name == "unknown-entry" && n == len(seedBlobs()["shareable"])
	}
	for name, b := range seedBlobs() {
		for n := 0; n < len(b); n++ {
			_, err := parse(b[:n:n])
			if boundary(name, n) {
				require.NoError(t, err, "%s prefix %d", name, n)
				continue
			}
			require.Error(t, err, "%s prefix %d", name, n)
		}
	}
}

func TestImportNoTransport(t *testing.T) {
	d := NewDomain()
	defer d.Close()
	for _, name := range []string{"private"} {
		_, err := d.Import(seedBlobs()[name])
		require.ErrorIs(t, err, ErrNoTransport)
		assert.Equal(t, status.NotSupported, status.CodeOf(err))
	}
	// A blob whose only entry is a transport this build does not know.
	b := appendEntry((&packed{pid: 1, device: 0, addr: 1 << 20, length: 9}).encode(), "cufabric", []byte("handle"))
	_, err := d.Import(b)
	require.ErrorIs(t, err, ErrNoTransport)
	assert.Contains(t, err.Error(), "1 other entries")
}

func FuzzParse(f *testing.F) {
	names := make([]string, 0)
	seeds := seedBlobs()
	for n := range seeds {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		f.Add(seeds[n])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := parse(b[:len(b):len(b)])
		if err != nil {
			if !errors.Is(err, ErrBadBlob) {
				t.Fatalf("error %v does not wrap ErrBadBlob", err)
			}
			return
		}
		if p.length == 0 || p.addr == 0 || p.addr+p.length < p.addr || p.pid <= 0 || p.device < HostDevice {
			t.Fatalf("accepted a bad header: %+v", p)
		}
		if e := p.memfd; e != nil {
			if e.regionOff >= e.regionLen || p.length > e.regionLen-e.regionOff || len(e.sock) == 0 {
				t.Fatalf("accepted a bad memfd entry: %+v", e)
			}
		}
		if e := p.cuda; e != nil {
			if p.device < 0 || e.offset >= e.size || p.length > e.size-e.offset || e.offset >= p.addr || p.memfd != nil {
				t.Fatalf("accepted a bad cudaipc entry: %+v of %+v", e, p)
			}
		}
		if e := p.vmm; e != nil {
			if p.device < 0 || e.offset >= e.size || p.length > e.size-e.offset || e.offset >= p.addr || len(e.sock) == 0 ||
				p.memfd != nil || p.cuda != nil {
				t.Fatalf("accepted a bad cudavmm entry: %+v of %+v", e, p)
			}
		}
		q, err := parse(p.encode())
		if err != nil {
			t.Fatalf("re-encoded blob does not parse: %v", err)
		}
		q.skipped = p.skipped
		if !reflect.DeepEqual(p, q) {
			t.Fatalf("round trip changed the blob: %+v -> %+v", p, q)
		}
	})
}

// TestWriteFuzzSeeds regenerates testdata/fuzz/FuzzParse/{seed,bad}-* when
// GOSYM_WRITE_FUZZ_SEEDS=1 (after a format change).
func TestWriteFuzzSeeds(t *testing.T) {
	if os.Getenv("GOSYM_WRITE_FUZZ_SEEDS") != "1" {
		t.Skip("set GOSYM_WRITE_FUZZ_SEEDS=1 to rewrite the seed corpus")
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzParse")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	write := func(name string, b []byte) {
		body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", b)
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644))
	}
	for name, b := range seedBlobs() {
		write("seed-"+name, b)
	}
	for _, bb := range badBlobs() {
		if len(bb.blob) <= 4096 {
			write("bad-"+strings.ReplaceAll(bb.name, " ", "-"), bb.blob)
		}
	}
}
