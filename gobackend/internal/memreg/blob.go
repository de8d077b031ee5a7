package memreg

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/gosym/gosym/gobackend/internal/status"
)

// Packed memh format, version 1 (all integers little-endian):
//
//	u32 magic "GSMH" | u16 version | u16 flags (none defined; must be 0)
//	u32 exporter pid | i32 device | u64 address | u64 length
//	entries to the end of the blob, each: name[8] (NUL-padded) | u32 size | payload[size]
//
// One entry per transport. Entries of transports this build does not know
// are skipped; every known entry is parsed strictly. The "memfd" payload is
//
//	secret[32] | u64 region offset | u64 region length | u16 n | socket name[n]
//
// and must be exactly that long. The "cudaipc" payload (device memory: the
// header's device is the exporter's CUDA ordinal) is
//
//	u32 PCI domain | u32 PCI bus | u32 PCI device | u32 flags (0)
//	u64 allocation size | u64 offset of the range in it | IPC handle[64]
//
// exactly: the PCI address lets an importer find the same GPU under its own
// numbering (CUDA_VISIBLE_DEVICES may differ), the handle is the
// allocation's cuIpcGetMemHandle. The "cudavmm" payload (VMM memory of
// gosym.empty, which has no IPC handle) starts the same way and names the
// exporter's fd server instead, which hands out the allocation's POSIX fd
// as it hands out memfds:
//
//	u32 PCI domain | u32 PCI bus | u32 PCI device | u32 flags (0)
//	u64 allocation size | u64 offset of the range in it
//	secret[32] | u16 n | socket name[n]
//
// Unlike UCC's header (a raw struct whose
// size changed with #1260), the header is fixed per version and carries a
// magic and a version, and sizes are never trusted past the blob's end.
const (
	blobMagic   = 0x484d5347 // "GSMH"
	blobVersion = 1
	headerLen   = 4 + 2 + 2 + 4 + 4 + 8 + 8
	entryHdrLen = nameLen + 4

	nameLen     = 8
	secretLen   = 32
	maxBlob     = 1 << 16
	maxEntry    = 1 << 12
	maxEntries  = 16
	maxSockName = 107 // sun_path minus the abstract namespace's leading NUL

	memfdFixed = secretLen + 8 + 8 + 2
	cudaHead   = 4*4 + 8 + 8
	cudaFixed  = cudaHead + IPCHandleLen
	vmmFixed   = cudaHead + secretLen + 2
)

// Transport entry names: host memory (memfd), CUDA memory (legacy IPC, or
// VMM memory by fd).
const (
	transportMemfd = "memfd"
	transportCUDA  = "cudaipc"
	transportVMM   = "cudavmm"
)

// Errors. Each carries its ABI status code (status.CodeOf finds it through
// the wrapping).
var (
	// ErrBadBlob is wrapped by every parse error of a packed memh.
	ErrBadBlob = &status.Error{Code: status.InvalidArg, Msg: "bad packed memh"}
	// ErrNoTransport: the blob is valid but has no entry this build can
	// import, e.g. a private (not shareable) memh.
	ErrNoTransport = &status.Error{Code: status.NotSupported,
		Msg: "packed memh has no transport this build understands (not shareable)"}
)

// packed is a parsed blob.
type packed struct {
	pid     int
	device  int
	addr    uint64
	length  uint64
	memfd   *memfdEntry // nil when the blob has none
	cuda    *cudaEntry  // nil when the blob has none
	vmm     *vmmEntry   // nil when the blob has none
	skipped int         // entries of transports this build does not know
}

// cudaEntry is the "cudaipc" transport: the allocation that holds the range.
type cudaEntry struct {
	gpu    GPUID
	size   uint64 // of the allocation
	offset uint64 // of the range in the allocation
	handle [IPCHandleLen]byte
}

// vmmEntry is the "cudavmm" transport: the VMM allocation that holds the
// range, whose fd the exporter's server (sock) lends for secret.
type vmmEntry struct {
	gpu          GPUID
	size, offset uint64
	secret       [secretLen]byte
	sock         string
}

type memfdEntry struct {
	secret    [secretLen]byte
	regionOff uint64
	regionLen uint64
	sock      string // abstract socket name, without the leading NUL
}

func badBlob(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadBlob, fmt.Sprintf(format, args...))
}

// encode serialises p (its memfd and cudaipc entries, if any; skipped
// entries are not kept).
func (p *packed) encode() []byte {
	le := binary.LittleEndian
	b := make([]byte, headerLen, headerLen+2*entryHdrLen+vmmFixed+maxSockName+cudaFixed)
	le.PutUint32(b[0:], blobMagic)
	le.PutUint16(b[4:], blobVersion)
	le.PutUint16(b[6:], 0)
	le.PutUint32(b[8:], uint32(p.pid))
	le.PutUint32(b[12:], uint32(int32(p.device)))
	le.PutUint64(b[16:], p.addr)
	le.PutUint64(b[24:], p.length)
	if e := p.memfd; e != nil {
		pl := make([]byte, memfdFixed+len(e.sock))
		copy(pl, e.secret[:])
		le.PutUint64(pl[secretLen:], e.regionOff)
		le.PutUint64(pl[secretLen+8:], e.regionLen)
		le.PutUint16(pl[secretLen+16:], uint16(len(e.sock)))
		copy(pl[memfdFixed:], e.sock)
		b = appendEntry(b, transportMemfd, pl)
	}
	if e := p.cuda; e != nil {
		pl := putCUDAHead(make([]byte, cudaFixed), e.gpu, e.size, e.offset)
		copy(pl[cudaHead:], e.handle[:])
		b = appendEntry(b, transportCUDA, pl)
	}
	if e := p.vmm; e != nil {
		pl := putCUDAHead(make([]byte, vmmFixed+len(e.sock)), e.gpu, e.size, e.offset)
		copy(pl[cudaHead:], e.secret[:])
		le.PutUint16(pl[cudaHead+secretLen:], uint16(len(e.sock)))
		copy(pl[vmmFixed:], e.sock)
		b = appendEntry(b, transportVMM, pl)
	}
	return b
}

// putCUDAHead writes the part the CUDA entries share (flags 0).
func putCUDAHead(pl []byte, gpu GPUID, size, offset uint64) []byte {
	le := binary.LittleEndian
	le.PutUint32(pl[0:], gpu.Domain)
	le.PutUint32(pl[4:], gpu.Bus)
	le.PutUint32(pl[8:], gpu.Device)
	le.PutUint64(pl[16:], size)
	le.PutUint64(pl[24:], offset)
	return pl
}

func appendEntry(b []byte, name string, payload []byte) []byte {
	var n [entryHdrLen]byte
	copy(n[:nameLen], name)
	binary.LittleEndian.PutUint32(n[nameLen:], uint32(len(payload)))
	return append(append(b, n[:]...), payload...)
}

// parse decodes a blob made by encode, checking every bound; it never reads
// past b and never trusts a size it has not checked against what remains.
func parse(b []byte) (*packed, error) {
	le := binary.LittleEndian
	switch {
	case len(b) == 0:
		return nil, badBlob("empty")
	case len(b) < headerLen:
		return nil, badBlob("truncated: %d bytes, the header alone is %d", len(b), headerLen)
	case len(b) > maxBlob:
		return nil, badBlob("%d bytes exceeds the limit of %d", len(b), maxBlob)
	}
	if m := le.Uint32(b); m != blobMagic {
		return nil, badBlob("magic %#08x, want %#08x", m, blobMagic)
	}
	if v := le.Uint16(b[4:]); v != blobVersion {
		return nil, badBlob("format version %d, this build understands %d", v, blobVersion)
	}
	if f := le.Uint16(b[6:]); f != 0 {
		return nil, badBlob("unknown flags %#x", f)
	}
	p := &packed{
		pid:    int(le.Uint32(b[8:])),
		device: int(int32(le.Uint32(b[12:]))),
		addr:   le.Uint64(b[16:]),
		length: le.Uint64(b[24:]),
	}
	switch {
	case p.pid <= 0 || p.pid > math.MaxInt32:
		return nil, badBlob("exporter pid %d", p.pid)
	case p.device < HostDevice:
		return nil, badBlob("device %d", p.device)
	case p.addr == 0:
		return nil, badBlob("null address")
	case p.length == 0:
		return nil, badBlob("zero length")
	case p.length > math.MaxInt64:
		return nil, badBlob("length %d too large", p.length)
	case p.addr+p.length < p.addr:
		return nil, badBlob("address %#x + length %d wraps around", p.addr, p.length)
	}
	rest := b[headerLen:]
	seen := map[string]bool{}
	for n := 0; len(rest) > 0; n++ {
		if n == maxEntries {
			return nil, badBlob("more than %d entries", maxEntries)
		}
		if len(rest) < entryHdrLen {
			return nil, badBlob("entry %d truncated: %d bytes left, its header is %d", n, len(rest), entryHdrLen)
		}
		name, err := entryName(rest[:nameLen])
		if err != nil {
			return nil, badBlob("entry %d: %v", n, err)
		}
		size := uint64(le.Uint32(rest[nameLen:]))
		rest = rest[entryHdrLen:]
		switch {
		case size > maxEntry:
			return nil, badBlob("entry %q of %d bytes exceeds the limit of %d", name, size, maxEntry)
		case size > uint64(len(rest)):
			return nil, badBlob("entry %q says %d bytes, %d remain", name, size, len(rest))
		case seen[name]:
			return nil, badBlob("entry %q appears twice", name)
		}
		seen[name] = true
		payload := rest[:size]
		rest = rest[size:]
		switch name {
		case transportMemfd:
			p.memfd, err = parseMemfd(payload, p)
		case transportCUDA:
			p.cuda, err = parseCUDA(payload, p)
		case transportVMM:
			p.vmm, err = parseVMM(payload, p)
		default:
			p.skipped++
		}
		if err != nil {
			return nil, badBlob("entry %q: %v", name, err)
		}
	}
	if p.cuda != nil && p.vmm != nil {
		return nil, badBlob("two CUDA transports (%q and %q)", transportCUDA, transportVMM)
	}
	return p, nil
}

// entryName decodes a NUL-padded name: printable ASCII, then only NULs.
func entryName(raw []byte) (string, error) {
	n := 0
	for n < len(raw) && raw[n] != 0 {
		if raw[n] <= ' ' || raw[n] > '~' {
			return "", fmt.Errorf("name byte %#x at %d", raw[n], n)
		}
		n++
	}
	if n == 0 {
		return "", fmt.Errorf("empty name")
	}
	for _, c := range raw[n:] {
		if c != 0 {
			return "", fmt.Errorf("name %q is not NUL-padded", raw)
		}
	}
	return string(raw[:n]), nil
}

func parseMemfd(pl []byte, p *packed) (*memfdEntry, error) {
	le := binary.LittleEndian
	if len(pl) < memfdFixed {
		return nil, fmt.Errorf("%d bytes, need at least %d", len(pl), memfdFixed)
	}
	e := &memfdEntry{
		regionOff: le.Uint64(pl[secretLen:]),
		regionLen: le.Uint64(pl[secretLen+8:]),
	}
	copy(e.secret[:], pl)
	var err error
	if p.device != HostDevice {
		return nil, fmt.Errorf("host memory transport on device %d", p.device)
	}
	if e.sock, err = parseSock(int(le.Uint16(pl[secretLen+16:])), pl[memfdFixed:]); err != nil {
		return nil, err
	}
	switch {
	case e.regionLen == 0 || e.regionLen > math.MaxInt64:
		return nil, fmt.Errorf("region length %d", e.regionLen)
	case e.regionOff >= e.regionLen || p.length > e.regionLen-e.regionOff:
		return nil, fmt.Errorf("range [%d, +%d) lies outside the region of %d bytes", e.regionOff, p.length, e.regionLen)
	}
	return e, nil
}

// parseSock checks a socket name said to be n bytes long.
func parseSock(n int, sock []byte) (string, error) {
	switch {
	case n != len(sock):
		return "", fmt.Errorf("socket name of %d bytes, payload holds %d", n, len(sock))
	case n == 0 || n > maxSockName:
		return "", fmt.Errorf("socket name of %d bytes", n)
	}
	for _, c := range sock {
		if c <= ' ' || c > '~' {
			return "", fmt.Errorf("socket name byte %#x", c)
		}
	}
	return string(sock), nil
}

func parseCUDA(pl []byte, p *packed) (*cudaEntry, error) {
	if len(pl) != cudaFixed {
		return nil, fmt.Errorf("%d bytes, want %d", len(pl), cudaFixed)
	}
	e := &cudaEntry{}
	var err error
	if e.gpu, e.size, e.offset, err = parseCUDAHead(pl, p); err != nil {
		return nil, err
	}
	if copy(e.handle[:], pl[cudaHead:]); e.handle == [IPCHandleLen]byte{} {
		return nil, fmt.Errorf("empty IPC handle")
	}
	return e, nil
}

func parseVMM(pl []byte, p *packed) (*vmmEntry, error) {
	if len(pl) < vmmFixed {
		return nil, fmt.Errorf("%d bytes, need at least %d", len(pl), vmmFixed)
	}
	e := &vmmEntry{}
	var err error
	if e.gpu, e.size, e.offset, err = parseCUDAHead(pl, p); err != nil {
		return nil, err
	}
	copy(e.secret[:], pl[cudaHead:])
	n := int(binary.LittleEndian.Uint16(pl[cudaHead+secretLen:]))
	if e.sock, err = parseSock(n, pl[vmmFixed:]); err != nil {
		return nil, err
	}
	return e, nil
}

// parseCUDAHead checks the part the CUDA entries share against the header.
func parseCUDAHead(pl []byte, p *packed) (gpu GPUID, size, offset uint64, err error) {
	le := binary.LittleEndian
	gpu = GPUID{Domain: le.Uint32(pl[0:]), Bus: le.Uint32(pl[4:]), Device: le.Uint32(pl[8:])}
	size, offset = le.Uint64(pl[16:]), le.Uint64(pl[24:])
	switch {
	case le.Uint32(pl[12:]) != 0:
		err = fmt.Errorf("unknown flags %#x", le.Uint32(pl[12:]))
	case p.device == HostDevice:
		err = fmt.Errorf("CUDA transport on host memory (device %d)", p.device)
	case size == 0 || size > math.MaxInt64:
		err = fmt.Errorf("allocation size %d", size)
	case offset >= size || p.length > size-offset:
		err = fmt.Errorf("range [%d, +%d) lies outside the allocation of %d bytes", offset, p.length, size)
	case offset >= p.addr:
		err = fmt.Errorf("offset %d puts the allocation below address %#x", offset, p.addr)
	}
	return gpu, size, offset, err
}
