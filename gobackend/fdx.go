package gobackend

import (
	"encoding/binary"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gosym/gosym/gobackend/internal/symm"
)

// The group-wide exchanges of setup tasks (CUDA setup, NVLS setup,
// contiguous views, the direct path), run inside the collective queue so
// their messages never interleave with others:
//   - an fd exchange: every rank sends every peer one announcement (a
//     header, a body, and at most one fd) over the authenticated mesh
//     links, and receives one from each;
//   - an agreement: every rank says whether it succeeded (one byte through
//     the host barrier) and learns which ranks did not.

// fdxHeader is magic, version, sender rank, ok (1 when an fd is attached).
const fdxHeader = 16

// fdxMsg is what one rank announced.
type fdxMsg struct {
	ok   bool
	body []byte
	fd   int // -1 when none (always -1 for this rank's own entry)
}

// exchangeFD announces body (and fd when fd >= 0; the caller keeps
// ownership of it) to every peer and returns every rank's announcement, by
// rank; the caller must close the fds with closeFDX. A malformed
// announcement or a link failure is an error: the links are out of step.
func (e *Endpoint) exchangeFD(magic uint32, body []byte, fd int, deadline time.Time) ([]fdxMsg, error) {
	le := binary.LittleEndian
	msg := make([]byte, fdxHeader+len(body))
	le.PutUint32(msg[0:], magic)
	le.PutUint32(msg[4:], 1)
	le.PutUint32(msg[8:], uint32(e.Rank))
	var fds []int
	if fd >= 0 {
		le.PutUint32(msg[12:], 1)
		fds = []int{fd}
	}
	copy(msg[fdxHeader:], body)
	var linkErr error
	for _, l := range e.mesh.Links {
		if l != nil {
			if err := l.Send(msg, fds, deadline); err != nil && linkErr == nil {
				linkErr = err
			}
		}
	}
	out := make([]fdxMsg, e.Size)
	out[e.Rank] = fdxMsg{ok: fd >= 0, body: body, fd: -1}
	for r, l := range e.mesh.Links {
		if l == nil {
			continue
		}
		got, gfds, err := l.Recv(deadline)
		out[r].fd = -1
		switch {
		case err != nil:
			if linkErr == nil {
				linkErr = err
			}
		case len(got) != len(msg) || le.Uint32(got) != magic || le.Uint32(got[4:]) != 1 || int(le.Uint32(got[8:])) != r ||
			(le.Uint32(got[12:]) == 1) != (len(gfds) == 1):
			if linkErr == nil {
				linkErr = fmt.Errorf("rank %d sent a malformed announcement (%d bytes, %d fds)", r, len(got), len(gfds))
			}
		default:
			out[r] = fdxMsg{ok: len(gfds) == 1, body: got[fdxHeader:], fd: -1}
			if len(gfds) == 1 {
				out[r].fd, gfds = gfds[0], nil
			}
		}
		for _, f := range gfds {
			unix.Close(f)
		}
	}
	if linkErr != nil {
		closeFDX(out)
		return nil, linkErr
	}
	return out, nil
}

// gpuVMMMagic marks the fd exchange that binds fresh VMM memhs to a group
// (gpu_direct.go, swapFresh).
const gpuVMMMagic = 0x4d565347 // "GSVM"

// swapFD is a gpuSwapFD over the links: every rank sends fd (-1: none) to
// every peer and gets the fd each peer sent (-1: none), by rank.
func (e *Endpoint) swapFD(fd int, deadline time.Time) ([]int, func(), error) {
	msgs, err := e.exchangeFD(gpuVMMMagic, nil, fd, deadline)
	if err != nil {
		return nil, nil, err
	}
	fds := make([]int, len(msgs))
	for r := range msgs {
		fds[r] = msgs[r].fd
	}
	return fds, func() { closeFDX(msgs) }, nil
}

// closeFDX closes the fds an exchange returned.
func closeFDX(msgs []fdxMsg) {
	for i := range msgs {
		if msgs[i].fd >= 0 {
			unix.Close(msgs[i].fd)
			msgs[i].fd = -1
		}
	}
}

// agreeAll tells every rank whether this one succeeded and returns the
// ranks that did not (the same list on every rank).
func (e *Endpoint) agreeAll(ok bool, who symm.Who, deadline time.Time) ([]int, error) {
	all, err := e.team.Barrier(okFlag(ok), who, deadline)
	if err != nil {
		return nil, err
	}
	return failedRanks(all), nil
}

// okFlag is the one byte of metadata an agreement publishes.
func okFlag(ok bool) []byte {
	if ok {
		return []byte{1}
	}
	return []byte{0}
}

// failedRanks lists the ranks whose agreement metadata is not okFlag(true).
func failedRanks(flags [][]byte) []int {
	var failed []int
	for r, f := range flags {
		if len(f) != 1 || f[0] != 1 {
			failed = append(failed, r)
		}
	}
	return failed
}
