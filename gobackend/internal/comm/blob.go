// Package comm bootstraps a communicator: it builds this rank's bootstrap
// blob, authenticates peers over abstract Unix sockets (SO_PEERCRED uid and
// pid plus a per-group token) and passes file descriptors between them.
package comm

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
)

// Blob format: magic, version, then fixed fields and a length-prefixed
// socket name. Bounds are checked on decode; unknown versions are refused.
const (
	blobMagic   = 0x42594d53 // "SMYB"
	blobVersion = 1
	nonceLen    = 16
	maxSockName = 96
)

// PeerInfo is what one rank tells the others during bootstrap.
type PeerInfo struct {
	Rank   int
	Size   int
	PID    int
	UID    int
	Nonce  [nonceLen]byte
	Socket string // abstract socket name, without the leading NUL
}

// Encode serialises p into a bootstrap blob.
func (p *PeerInfo) Encode() []byte {
	var b bytes.Buffer
	w := func(v any) { binary.Write(&b, binary.LittleEndian, v) }
	w(uint32(blobMagic))
	w(uint32(blobVersion))
	w(uint32(p.Rank))
	w(uint32(p.Size))
	w(uint32(p.PID))
	w(uint32(p.UID))
	b.Write(p.Nonce[:])
	w(uint32(len(p.Socket)))
	b.WriteString(p.Socket)
	return b.Bytes()
}

// ErrBadBlob is wrapped by every blob decoding error.
var ErrBadBlob = errors.New("bad bootstrap blob")

// DecodePeerInfo parses a blob made by Encode, never reading past it.
func DecodePeerInfo(blob []byte) (*PeerInfo, error) {
	const fixed = 6*4 + nonceLen + 4
	if len(blob) < fixed {
		return nil, fmt.Errorf("%w: %d bytes, need at least %d", ErrBadBlob, len(blob), fixed)
	}
	le := binary.LittleEndian
	if m := le.Uint32(blob); m != blobMagic {
		return nil, fmt.Errorf("%w: magic %#x", ErrBadBlob, m)
	}
	if v := le.Uint32(blob[4:]); v != blobVersion {
		return nil, fmt.Errorf("%w: version %d, this build understands %d", ErrBadBlob, v, blobVersion)
	}
	p := &PeerInfo{
		Rank: int(le.Uint32(blob[8:])),
		Size: int(le.Uint32(blob[12:])),
		PID:  int(le.Uint32(blob[16:])),
		UID:  int(le.Uint32(blob[20:])),
	}
	copy(p.Nonce[:], blob[24:24+nonceLen])
	n := int(le.Uint32(blob[24+nonceLen:]))
	rest := blob[fixed:]
	if n > maxSockName || n != len(rest) {
		return nil, fmt.Errorf("%w: socket name of %d bytes with %d left", ErrBadBlob, n, len(rest))
	}
	p.Socket = string(rest)
	return p, nil
}

// GroupToken derives the group's shared secret from every rank's nonce, in
// rank order; only processes that took part in the allgather know it.
func GroupToken(peers []*PeerInfo) [32]byte {
	h := sha256.New()
	for _, p := range peers {
		h.Write(p.Nonce[:])
		fmt.Fprintf(h, "/%d/%d/%s;", p.Rank, p.PID, p.Socket)
	}
	var t [32]byte
	copy(t[:], h.Sum(nil))
	return t
}

func newNonce() ([nonceLen]byte, error) {
	var n [nonceLen]byte
	_, err := rand.Read(n[:])
	return n, err
}
