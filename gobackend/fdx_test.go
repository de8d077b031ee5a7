package gobackend

import (
	"encoding/binary"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gosym/gosym/gobackend/internal/comm"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestSwapFDOverLinks: the fd exchange (the CUDA plane binds fresh VMM
// memory with it) over real links. Rank 0 sends 40 memfds (more than one link message carries:
// continuation messages), rank 1 none, rank 2 three; each file holds its
// sender and index, and the body names the count. Every rank gets the
// others' fds in order (new descriptors of the same files), none for
// itself or from rank 1, and done closes what it got.
func TestSwapFDOverLinks(t *testing.T) {
	const world = 3
	sent := []int{40, 0, 3}
	eps := group(t, world, 10*time.Second)
	type got struct {
		msgs []comm.FDMsg
		done func()
		err  error
	}
	res := make([]got, world)
	var wg sync.WaitGroup
	for r, ep := range eps {
		var fds []int
		for i := range sent[r] {
			fd, err := unix.MemfdCreate("swap", unix.MFD_CLOEXEC)
			require.NoError(t, err)
			_, err = unix.Pwrite(fd, []byte{byte(10 + r), byte(i)}, 0)
			require.NoError(t, err)
			t.Cleanup(func() { unix.Close(fd) })
			fds = append(fds, fd)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := []byte(fmt.Sprint(len(fds)))
			msgs, err := ep.exchangeFD(0x4d565347, body, fds, time.Now().Add(5*time.Second))
			res[r].msgs, res[r].done, res[r].err = msgs, func() { comm.CloseFDs(msgs) }, err
		}()
	}
	wg.Wait()
	for me, g := range res {
		require.NoError(t, g.err)
		require.Len(t, g.msgs, world)
		inodes := map[int]uint64{}
		for r, m := range g.msgs {
			assert.Equal(t, fmt.Sprint(sent[r]), string(m.Body), "rank %d from rank %d", me, r)
			assert.Equal(t, sent[r] > 0, m.OK)
			if r == me {
				assert.Empty(t, m.FDs, "rank %d's own entry", me)
				continue
			}
			require.Len(t, m.FDs, sent[r], "rank %d from rank %d", me, r)
			for i, fd := range m.FDs {
				b := make([]byte, 2)
				_, err := unix.Pread(fd, b, 0)
				require.NoError(t, err)
				assert.Equal(t, []byte{byte(10 + r), byte(i)}, b, "rank %d got rank %d's file %d", me, r, i)
				var st unix.Stat_t
				require.NoError(t, unix.Fstat(fd, &st))
				inodes[fd] = st.Ino
			}
		}
		g.done()
		for fd, ino := range inodes {
			// Closed, or the number already reused for another file.
			var st unix.Stat_t
			if err := unix.Fstat(fd, &st); err == nil {
				assert.NotEqual(t, ino, st.Ino, "done closes what was received (fd %d)", fd)
			}
		}
	}
}

// TestSwapFDTooMany: an announcement of more than fdxMaxFDs fds is refused
// before anything is sent.
func TestSwapFDTooMany(t *testing.T) {
	eps := group(t, 2, 10*time.Second)
	_, err := eps[0].exchangeFD(0x4d565347, nil, make([]int, fdxMaxFDs+1), time.Now().Add(time.Second))
	require.ErrorContains(t, err, "at most")
}

// TestFDXWellFormed: the receiver's check of each message of an
// announcement (rank 2's, magic 7): header, sender, counts, continuations.
func TestFDXWellFormed(t *testing.T) {
	msg := func(magic, version, rank, total uint32, body int) []byte {
		b := make([]byte, fdxHeader+body)
		for i, v := range []uint32{magic, version, rank, total} {
			binary.LittleEndian.PutUint32(b[4*i:], v)
		}
		return b
	}
	for _, c := range []struct {
		name          string
		got           []byte
		n, have, want int
		ok            bool
	}{
		{"first, with a body", msg(7, 1, 2, 20, 5), 16, 16, -1, true},
		{"first, no fds", msg(7, 1, 2, 0, 0), 0, 0, -1, true},
		{"short", msg(7, 1, 2, 0, 0)[:fdxHeader-1], 0, 0, -1, false},
		{"other magic", msg(8, 1, 2, 0, 0), 0, 0, -1, false},
		{"other version", msg(7, 2, 2, 0, 0), 0, 0, -1, false},
		{"other sender", msg(7, 1, 1, 0, 0), 0, 0, -1, false},
		{"more fds than announced", msg(7, 1, 2, 3, 0), 4, 4, -1, false},
		{"over the limit", msg(7, 1, 2, fdxMaxFDs+1, 0), 16, 16, -1, false},
		{"continuation", msg(7, 1, 2, 20, 0), 4, 20, 20, true},
		{"continuation with a body", msg(7, 1, 2, 20, 1), 4, 20, 20, false},
		{"continuation, another total", msg(7, 1, 2, 21, 0), 4, 20, 20, false},
		{"continuation with no fd", msg(7, 1, 2, 20, 0), 0, 16, 20, false},
	} {
		assert.Equal(t, c.ok, fdxWellFormed(c.got, c.n, c.have, 7, 2, c.want), c.name)
	}
}
