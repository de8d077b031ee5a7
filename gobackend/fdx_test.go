package gobackend

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestSwapFDOverLinks: the fd exchange that binds fresh VMM memhs, over
// real links. Ranks 0 and 2 send a memfd holding their rank, rank 1 sends
// none; every rank gets the others' fds (new descriptors of the same
// files) and -1 for itself and for rank 1, and done closes what it got.
func TestSwapFDOverLinks(t *testing.T) {
	const world = 3
	eps := group(t, world, 10*time.Second)
	type got struct {
		fds  []int
		done func()
		err  error
	}
	res := make([]got, world)
	var wg sync.WaitGroup
	for r, ep := range eps {
		fd := -1
		if r != 1 {
			var err error
			fd, err = unix.MemfdCreate("swap", unix.MFD_CLOEXEC)
			require.NoError(t, err)
			_, err = unix.Pwrite(fd, []byte{byte(10 + r)}, 0)
			require.NoError(t, err)
			t.Cleanup(func() { unix.Close(fd) })
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[r].fds, res[r].done, res[r].err = ep.swapFD(fd, time.Now().Add(5*time.Second))
		}()
	}
	wg.Wait()
	for me, g := range res {
		require.NoError(t, g.err)
		require.Len(t, g.fds, world)
		for r, fd := range g.fds {
			if r == me || r == 1 {
				assert.Equal(t, -1, fd, "rank %d from rank %d", me, r)
				continue
			}
			require.GreaterOrEqual(t, fd, 0, "rank %d from rank %d", me, r)
			b := make([]byte, 1)
			_, err := unix.Pread(fd, b, 0)
			require.NoError(t, err)
			assert.Equal(t, byte(10+r), b[0], "rank %d got rank %d's file", me, r)
		}
		inodes := map[int]uint64{}
		for _, fd := range g.fds {
			var st unix.Stat_t
			if fd >= 0 && unix.Fstat(fd, &st) == nil {
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
