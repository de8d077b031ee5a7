package gobackend

import (
	"encoding/binary"
	"fmt"
	"slices"
	"time"

	"github.com/gosym/gosym/gobackend/internal/comm"
	"github.com/gosym/gosym/gobackend/internal/symm"
)

// The group-wide exchanges of setup tasks (CUDA setup, NVLS setup,
// contiguous views, the direct path), run inside the collective queue so
// their messages never interleave with others:
//   - an fd exchange: every rank sends every peer one announcement (a
//     header, a body, and any number of fds up to fdxMaxFDs) over the
//     authenticated mesh links, and receives one from each;
//   - an agreement: every rank says whether it succeeded (one byte through
//     the host barrier) and learns which ranks did not.

// fdxHeader is magic, version, sender rank, the announcement's fd count.
const fdxHeader = 16

// fdxMaxFDs bounds the fds of one announcement. A link message carries at
// most comm.MaxFDs: the first carries the header, the body and the first
// of them, continuation messages (the header alone) the rest.
const fdxMaxFDs = 1024

// exchangeFD announces body and fds (the caller keeps ownership of them)
// to every peer and returns every rank's announcement, by rank; the caller
// must close the fds with closeFDX. A malformed announcement or a link
// failure is an error: the links are out of step.
func (e *Endpoint) exchangeFD(magic uint32, body []byte, fds []int, deadline time.Time) ([]comm.FDMsg, error) {
	if len(fds) > fdxMaxFDs {
		return nil, fmt.Errorf("an announcement of %d fds (at most %d)", len(fds), fdxMaxFDs)
	}
	le := binary.LittleEndian
	head := make([]byte, fdxHeader)
	le.PutUint32(head[0:], magic)
	le.PutUint32(head[4:], 1)
	le.PutUint32(head[8:], uint32(e.Rank))
	le.PutUint32(head[12:], uint32(len(fds)))
	var linkErr error
	fail := func(err error) {
		if linkErr == nil {
			linkErr = err
		}
	}
	first := append(slices.Clip(head), body...) // then continuations: head alone
	for _, l := range e.mesh.Links {
		if l == nil {
			continue
		}
		msg, rest := first, fds
		for sent := false; !sent || len(rest) > 0; sent, msg = true, head {
			n := min(len(rest), comm.MaxFDs)
			if err := l.Send(msg, rest[:n], deadline); err != nil {
				fail(err)
				break
			}
			rest = rest[n:]
		}
	}
	out := make([]comm.FDMsg, e.Size)
	out[e.Rank] = comm.FDMsg{OK: len(fds) > 0, Body: body}
	for r, l := range e.mesh.Links {
		if l == nil {
			continue
		}
		m, err := recvFDX(l, magic, r, deadline)
		if err != nil {
			fail(err)
		}
		out[r] = m
	}
	if linkErr != nil {
		comm.CloseFDs(out)
		return nil, linkErr
	}
	return out, nil
}

// recvFDX receives rank r's announcement over l, with its continuation
// messages. On error the fds received so far are closed.
func recvFDX(l *comm.Link, magic uint32, r int, deadline time.Time) (comm.FDMsg, error) {
	le := binary.LittleEndian
	var m comm.FDMsg
	want := -1
	for want < 0 || len(m.FDs) < want {
		got, gfds, err := l.Recv(deadline)
		m.FDs = append(m.FDs, gfds...)
		if err == nil && !fdxWellFormed(got, len(gfds), len(m.FDs), magic, r, want) {
			err = fmt.Errorf("rank %d sent a malformed announcement (%d bytes, %d fds)", r, len(got), len(gfds))
		}
		if err != nil {
			comm.CloseFDs([]comm.FDMsg{m})
			return comm.FDMsg{}, err
		}
		if want < 0 {
			want, m.Body = int(le.Uint32(got[12:])), got[fdxHeader:]
		}
	}
	m.OK = want > 0
	return m, nil
}

// fdxWellFormed says whether got, which brought n fds (have so far), is a
// message of rank r's announcement: its first (want < 0) or a continuation
// of one announcing want fds.
func fdxWellFormed(got []byte, n, have int, magic uint32, r, want int) bool {
	le := binary.LittleEndian
	if len(got) < fdxHeader {
		return false
	}
	total := int(le.Uint32(got[12:]))
	switch {
	case le.Uint32(got) != magic || le.Uint32(got[4:]) != 1 || int(le.Uint32(got[8:])) != r:
		return false
	case total > fdxMaxFDs || have > total:
		return false
	case want < 0:
		return true
	}
	return len(got) == fdxHeader && total == want && n > 0
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
