package comm

import (
	"fmt"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// connectAll bootstraps world ranks of this process and returns their meshes.
func connectAll(t *testing.T, boots []*Bootstrap) []*Mesh {
	blobs := make([][]byte, len(boots))
	for r, b := range boots {
		blobs[r] = b.Self.Encode()
	}
	meshes := make([]*Mesh, len(boots))
	errs := make([]error, len(boots))
	var wg sync.WaitGroup
	for r, b := range boots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			meshes[r], errs[r] = b.Connect(blobs, time.Now().Add(5*time.Second))
		}()
	}
	wg.Wait()
	for r := range boots {
		require.NoError(t, errs[r], "rank %d", r)
	}
	t.Cleanup(func() {
		for r, m := range meshes {
			m.Close()
			boots[r].Close()
		}
	})
	return meshes
}

func listen(t *testing.T, world int) []*Bootstrap {
	boots := make([]*Bootstrap, world)
	for r := range boots {
		b, err := Listen(r, world)
		require.NoError(t, err)
		boots[r] = b
	}
	return boots
}

// An outsider that connects to a rank's socket before the group does, with
// a wrong token, is refused and gets nothing; the group still connects.
func TestOutsiderIsRefused(t *testing.T) {
	boots := listen(t, 2)
	before := Rejected.Load()
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: "@" + boots[0].Self.Socket, Net: "unixpacket"})
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, writeStruct(c, &hello{Magic: helloMagic, Rank: 1}))
	meshes := connectAll(t, boots)
	require.Equal(t, before+1, Rejected.Load(), "the outsider was counted as refused")
	c.SetReadDeadline(time.Now().Add(time.Second))
	n, err := c.Read(make([]byte, 64))
	require.True(t, n == 0 || err != nil, "the outsider got no answer")

	// The real links work: rank 1 passes an fd to rank 0.
	fd, err := unix.MemfdCreate("probe", unix.MFD_CLOEXEC)
	require.NoError(t, err)
	defer unix.Close(fd)
	require.NoError(t, meshes[1].Links[0].Send([]byte("x"), []int{fd}, time.Now().Add(time.Second)))
	msg, fds, err := meshes[0].Links[1].Recv(time.Now().Add(time.Second))
	require.NoError(t, err)
	require.Equal(t, "x", string(msg))
	require.Len(t, fds, 1)
	unix.Close(fds[0])
}

func TestBlobRoundTripAndRejects(t *testing.T) {
	p := &PeerInfo{Rank: 3, Size: 4, PID: os.Getpid(), UID: os.Getuid(), Socket: "gosym-x"}
	got, err := DecodePeerInfo(p.Encode())
	require.NoError(t, err)
	require.Equal(t, p, got)
	good := p.Encode()
	for name, b := range map[string][]byte{
		"empty":     nil,
		"truncated": good[:len(good)-1],
		"long":      append(append([]byte(nil), good...), 0),
		"magic":     append([]byte{0, 0, 0, 0}, good[4:]...),
		"version":   append(append(append([]byte(nil), good[:4]...), 9, 0, 0, 0), good[8:]...),
	} {
		_, err := DecodePeerInfo(b)
		require.ErrorIs(t, err, ErrBadBlob, name)
	}
}

func TestConnectRejectsForeignBlobs(t *testing.T) {
	boots := listen(t, 2)
	defer boots[0].Close()
	defer boots[1].Close()
	other := *boots[1].Self
	other.UID++
	_, err := boots[0].Connect([][]byte{boots[0].Self.Encode(), other.Encode()}, time.Now().Add(time.Second))
	require.ErrorContains(t, err, fmt.Sprintf("runs as uid %d", other.UID))
}
