package comm

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

const helloMagic = 0x4f4c4548 // "HELO"

// Bootstrap is a rank's half-open communicator: its listener exists, its
// peers are not known yet.
type Bootstrap struct {
	Self *PeerInfo
	ln   *net.UnixListener
}

// Rejected counts connections refused by authentication (for tests).
var Rejected atomic.Int64

// Listen creates this rank's abstract listening socket and its blob.
func Listen(rank, size int) (*Bootstrap, error) {
	nonce, err := newNonce()
	if err != nil {
		return nil, fmt.Errorf("random nonce: %w", err)
	}
	name := fmt.Sprintf("gosym-%d-%s", os.Getpid(), hex.EncodeToString(nonce[:8]))
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: "@" + name, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("listen on @%s: %w", name, err)
	}
	self := &PeerInfo{Rank: rank, Size: size, PID: os.Getpid(), UID: os.Getuid(), Nonce: nonce, Socket: name}
	return &Bootstrap{Self: self, ln: ln}, nil
}

// Close releases the listener; safe to call more than once.
func (b *Bootstrap) Close() {
	if b.ln != nil {
		b.ln.Close()
		b.ln = nil
	}
}

// Mesh is the set of authenticated links of one rank to every other rank.
type Mesh struct {
	Rank   int
	Peers  []*PeerInfo
	Links  []*Link       // Links[Rank] is nil
	pidfds []int         // -1 where unavailable
	marked []atomic.Bool // MarkExited's ranks
}

// Link is an authenticated SOCK_SEQPACKET connection to one peer.
type Link struct {
	Peer int
	conn *net.UnixConn
}

// Connect authenticates every peer and returns the mesh. Rank j dials every
// rank i < j; rank i accepts every j > i. A connection that fails the
// checks (uid, announced pid, group token, rank) is closed and counted, and
// accepting goes on: an outsider gets nothing.
func (b *Bootstrap) Connect(blobs [][]byte, deadline time.Time) (*Mesh, error) {
	me, size := b.Self.Rank, b.Self.Size
	if len(blobs) != size {
		return nil, fmt.Errorf("connect: got %d blobs for a group of %d", len(blobs), size)
	}
	peers := make([]*PeerInfo, size)
	for r, blob := range blobs {
		p, err := DecodePeerInfo(blob)
		if err != nil {
			return nil, fmt.Errorf("connect: blob of rank %d: %w", r, err)
		}
		if p.Rank != r || p.Size != size {
			return nil, fmt.Errorf("connect: blob %d says rank %d of %d", r, p.Rank, p.Size)
		}
		if p.UID != b.Self.UID {
			return nil, fmt.Errorf("connect: rank %d runs as uid %d, this rank as uid %d", r, p.UID, b.Self.UID)
		}
		peers[r] = p
	}
	if !bytes.Equal(blobs[me], b.Self.Encode()) {
		return nil, fmt.Errorf("connect: the blob at rank %d is not this rank's", me)
	}
	token := GroupToken(peers)
	m := &Mesh{Rank: me, Peers: peers, Links: make([]*Link, size)}
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := b.acceptAll(m, token, deadline, &mu); err != nil {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
	}()
	for i := 0; i < me; i++ {
		l, err := dial(peers[i], me, token, deadline)
		mu.Lock()
		if err != nil {
			errs = append(errs, fmt.Errorf("rank %d: %w", i, err))
		} else {
			m.Links[i] = l
		}
		mu.Unlock()
	}
	wg.Wait()
	if len(errs) > 0 {
		m.Close()
		return nil, fmt.Errorf("connect: %w", errors.Join(errs...))
	}
	m.openPidfds()
	return m, nil
}

func (b *Bootstrap) acceptAll(m *Mesh, token [32]byte, deadline time.Time, mu *sync.Mutex) error {
	want := m.Peers[0].Size - 1 - m.Rank
	b.ln.SetDeadline(deadline)
	for got := 0; got < want; {
		c, err := b.ln.AcceptUnix()
		if err != nil {
			var missing []int
			mu.Lock()
			for r := m.Rank + 1; r < len(m.Links); r++ {
				if m.Links[r] == nil {
					missing = append(missing, r)
				}
			}
			mu.Unlock()
			return fmt.Errorf("accepting peers %v: %w", missing, err)
		}
		r, err := verifyHello(c, m, token, deadline)
		if err != nil {
			Rejected.Add(1)
			c.Close()
			continue
		}
		mu.Lock()
		dup := m.Links[r] != nil
		if !dup {
			m.Links[r] = &Link{Peer: r, conn: c}
		}
		mu.Unlock()
		if dup {
			Rejected.Add(1)
			c.Close()
			continue
		}
		got++
	}
	return nil
}

type hello struct {
	Magic uint32
	Rank  uint32
	Token [32]byte
}

func verifyHello(c *net.UnixConn, m *Mesh, token [32]byte, deadline time.Time) (int, error) {
	cred, err := PeerCred(c)
	if err != nil {
		return 0, err
	}
	c.SetDeadline(deadline)
	var h hello
	if err := readStruct(c, &h); err != nil {
		return 0, err
	}
	r := int(h.Rank)
	switch {
	case h.Magic != helloMagic || h.Token != token:
		return 0, errors.New("bad hello")
	case r <= m.Rank || r >= len(m.Peers):
		return 0, fmt.Errorf("rank %d may not dial rank %d", r, m.Rank)
	case int(cred.Pid) != m.Peers[r].PID || int(cred.Uid) != m.Peers[r].UID:
		return 0, fmt.Errorf("credentials pid %d uid %d do not match rank %d", cred.Pid, cred.Uid, r)
	}
	if err := writeStruct(c, &hello{Magic: helloMagic, Rank: uint32(m.Rank), Token: token}); err != nil {
		return 0, err
	}
	c.SetDeadline(time.Time{})
	return r, nil
}

func dial(p *PeerInfo, me int, token [32]byte, deadline time.Time) (*Link, error) {
	var c *net.UnixConn
	var err error
	for {
		c, err = net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: "@" + p.Socket, Net: "unixpacket"})
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(2 * time.Millisecond) // the peer may not listen yet
	}
	if err != nil {
		return nil, fmt.Errorf("dial @%s: %w", p.Socket, err)
	}
	fail := func(err error) (*Link, error) { c.Close(); return nil, err }
	cred, err := PeerCred(c)
	if err != nil {
		return fail(err)
	}
	if int(cred.Pid) != p.PID || int(cred.Uid) != p.UID {
		return fail(fmt.Errorf("listener credentials pid %d uid %d, announced pid %d", cred.Pid, cred.Uid, p.PID))
	}
	c.SetDeadline(deadline)
	if err := writeStruct(c, &hello{Magic: helloMagic, Rank: uint32(me), Token: token}); err != nil {
		return fail(err)
	}
	var h hello
	if err := readStruct(c, &h); err != nil {
		return fail(fmt.Errorf("no answer to hello (authentication refused?): %w", err))
	}
	if h.Magic != helloMagic || h.Token != token || int(h.Rank) != p.Rank {
		return fail(errors.New("bad hello answer"))
	}
	c.SetDeadline(time.Time{})
	return &Link{Peer: p.Rank, conn: c}, nil
}

// PeerCred returns the credentials (pid, uid, gid) of the process at the
// other end of a connected Unix socket (SO_PEERCRED).
func PeerCred(c *net.UnixConn) (*unix.Ucred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	return cred, cerr
}

func writeStruct(c *net.UnixConn, v any) error {
	var b bytes.Buffer
	binary.Write(&b, binary.LittleEndian, v)
	_, err := c.Write(b.Bytes())
	return err
}

func readStruct(c *net.UnixConn, v any) error {
	buf := make([]byte, binary.Size(v))
	n, err := c.Read(buf)
	if err != nil {
		return err
	}
	if n != len(buf) {
		return fmt.Errorf("short message: %d of %d bytes", n, len(buf))
	}
	return binary.Read(bytes.NewReader(buf), binary.LittleEndian, v)
}

// MaxFDs bounds the descriptors one message may carry.
const MaxFDs = 16

// maxMsg bounds one message's payload.
const maxMsg = 1 << 16

// Send sends payload and fds to the peer as one message.
func (l *Link) Send(payload []byte, fds []int, deadline time.Time) error {
	if len(fds) > MaxFDs || len(payload) > maxMsg || len(payload) == 0 {
		return fmt.Errorf("send to rank %d: %d bytes and %d fds out of bounds", l.Peer, len(payload), len(fds))
	}
	l.conn.SetWriteDeadline(deadline)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	_, _, err := l.conn.WriteMsgUnix(payload, oob, nil)
	if err != nil {
		return fmt.Errorf("send to rank %d: %w", l.Peer, err)
	}
	return nil
}

// Recv receives one message. The caller owns (and must close) the fds.
func (l *Link) Recv(deadline time.Time) ([]byte, []int, error) {
	l.conn.SetReadDeadline(deadline)
	buf := make([]byte, maxMsg)
	oob := make([]byte, unix.CmsgSpace(MaxFDs*4))
	n, oobn, flags, _, err := l.conn.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, nil, fmt.Errorf("receive from rank %d: %w", l.Peer, err)
	}
	var fds []int
	if oobn > 0 {
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return nil, nil, fmt.Errorf("receive from rank %d: control message: %w", l.Peer, err)
		}
		for _, m := range msgs {
			got, err := unix.ParseUnixRights(&m)
			if err == nil {
				fds = append(fds, got...)
			}
		}
	}
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 || n == 0 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, nil, fmt.Errorf("receive from rank %d: truncated or empty message", l.Peer)
	}
	return buf[:n], fds, nil
}

func (m *Mesh) openPidfds() {
	m.pidfds = make([]int, len(m.Peers))
	m.marked = make([]atomic.Bool, len(m.Peers))
	for r, p := range m.Peers {
		m.pidfds[r] = -1
		if r != m.Rank {
			if fd, err := unix.PidfdOpen(p.PID, 0); err == nil {
				m.pidfds[r] = fd
			}
		}
	}
}

// Dead returns the peers whose process has exited, in rank order.
func (m *Mesh) Dead() []int {
	var dead []int
	for r := range m.pidfds {
		if r != m.Rank && m.Exited(r) {
			dead = append(dead, r)
		}
	}
	return dead
}

// Exited says whether peer r's process has exited.
func (m *Mesh) Exited(r int) bool {
	if m.marked[r].Load() {
		return true
	}
	if fd := m.pidfds[r]; fd >= 0 {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, _ := unix.Poll(pfd, 0)
		return n > 0 && pfd[0].Revents != 0
	}
	return unix.Kill(m.Peers[r].PID, 0) == unix.ESRCH
}

// MarkExited makes peer r count as exited from now on, whatever its
// process does: for tests whose simulated ranks share one process, where
// no pidfd ever fires.
func (m *Mesh) MarkExited(r int) { m.marked[r].Store(true) }

// Describe names ranks with their processes, for errors: "rank 2 (pid
// 4242)", "ranks 1 (pid 17) and 3 (pid 19)".
func (m *Mesh) Describe(ranks []int) string {
	parts := make([]string, len(ranks))
	for i, r := range ranks {
		parts[i] = fmt.Sprintf("%d (pid %d)", r, m.Peers[r].PID)
	}
	switch len(parts) {
	case 0:
		return "no rank"
	case 1:
		return "rank " + parts[0]
	}
	return "ranks " + strings.Join(parts[:len(parts)-1], ", ") + " and " + parts[len(parts)-1]
}

// Close closes every link and pidfd.
func (m *Mesh) Close() {
	for i, l := range m.Links {
		if l != nil {
			l.conn.Close()
			m.Links[i] = nil
		}
	}
	for i, fd := range m.pidfds {
		if fd >= 0 {
			unix.Close(fd)
			m.pidfds[i] = -1
		}
	}
}
