package memreg

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/gosym/gosym/gobackend/internal/comm"
	"github.com/gosym/gosym/gobackend/internal/status"
	"golang.org/x/sys/unix"
)

// The fd server hands a shareable memh's memfd (or, for gosym.empty's VMM
// memory, its allocation's POSIX fd) to an importer that proves it was
// given the blob. One SOCK_SEQPACKET exchange per import:
//
//	importer -> exporter: u32 reqMagic | secret[32]
//	exporter -> importer: u32 repMagic | u32 code | u64 region (allocation) length | error text (code != 0)
//	                      with the fd as SCM_RIGHTS when code == 0
//
// Both sides check SO_PEERCRED: the importer that the server is the pid the
// blob names and runs as its uid, the server that the importer runs as its
// uid. A client with another uid, a malformed request or a secret that
// names no mapped shareable memh gets nothing: the connection is closed and
// the refusal counted.
const (
	reqMagic     = 0x51525347 // "GSRQ"
	repMagic     = 0x50525347 // "GSRP"
	reqLen       = 4 + secretLen
	repFixed     = 4 + 4 + 8
	maxRep       = repFixed + 512
	serveTimeout = 5 * time.Second
	repOK        = 0
	repFailed    = 1
)

type server struct {
	ln     *net.UnixListener
	name   string
	wg     sync.WaitGroup // the accept loop and each connection
	mu     sync.Mutex
	closed bool
	conns  map[*net.UnixConn]struct{}
}

// ensureServer starts the fd server once and returns its abstract name.
func (d *Domain) ensureServer() (string, error) {
	d.srvMu.Lock()
	defer d.srvMu.Unlock()
	if d.srvClosed {
		return "", ErrClosed
	}
	if d.srv != nil {
		return d.srv.name, nil
	}
	if err := d.fault("server.listen"); err != nil {
		return "", err
	}
	var nonce [8]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return "", status.Wrap(status.System, err, "memreg: random socket name")
	}
	name := fmt.Sprintf("gosym-memreg-%d-%x", os.Getpid(), nonce)
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: "@" + name, Net: "unixpacket"})
	if err != nil {
		return "", status.Wrap(status.System, err, "memreg: listen on @%s", name)
	}
	if err := d.fault("server.start"); err != nil {
		ln.Close()
		return "", err
	}
	s := &server{ln: ln, name: name, conns: map[*net.UnixConn]struct{}{}}
	s.wg.Add(1)
	go d.acceptLoop(s)
	d.srv = s
	return name, nil
}

// stopServer closes the listener and every open connection and waits for
// their goroutines; no server starts afterwards.
func (d *Domain) stopServer() {
	d.srvMu.Lock()
	s := d.srv
	d.srv, d.srvClosed = nil, true
	d.srvMu.Unlock()
	if s == nil {
		return
	}
	s.mu.Lock()
	s.closed = true
	s.ln.Close()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

func (d *Domain) acceptLoop(s *server) {
	defer s.wg.Done()
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed || errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // EMFILE and the like: let it pass
			continue
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			d.serve(c)
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
			c.Close()
		}()
	}
}

// serve answers one import request (see the protocol above).
func (d *Domain) serve(c *net.UnixConn) {
	c.SetDeadline(time.Now().Add(serveTimeout))
	cred, err := comm.PeerCred(c)
	if err != nil || int64(cred.Uid) != d.uid.Load() {
		d.refused()
		return
	}
	req := make([]byte, reqLen+1) // one spare byte shows an oversized request
	n, err := c.Read(req)
	if err != nil || n != reqLen || binary.LittleEndian.Uint32(req) != reqMagic {
		d.refused()
		return
	}
	l, ok := d.lend(req[4:reqLen])
	if !ok {
		d.refused()
		return
	}
	defer l.done()
	rep := make([]byte, repFixed, maxRep)
	binary.LittleEndian.PutUint32(rep, repMagic)
	binary.LittleEndian.PutUint64(rep[8:], l.size)
	err = l.err
	if err == nil {
		err = d.fault("serve.lend")
	}
	if err != nil {
		binary.LittleEndian.PutUint32(rep[4:], repFailed)
		rep = append(rep, truncate(err.Error(), maxRep-repFixed)...)
		c.Write(rep)
		return
	}
	if _, _, err := c.WriteMsgUnix(rep, unix.UnixRights(l.fd), nil); err == nil {
		d.mu.Lock()
		d.st.served++
		d.mu.Unlock()
	}
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

func (d *Domain) refused() {
	d.mu.Lock()
	d.st.refusals++
	d.mu.Unlock()
}

// lease is one hand-out: the fd to send, the length it maps (or why it
// cannot be sent), and what to release once it went.
type lease struct {
	fd   int
	size uint64
	err  error
	done func()
}

// lend finds the mapped shareable memh with this secret. A region's memh
// takes a reference on the region, so its fd stays open (and is not reused
// for another file) while it is being sent; a VMM memh's allocation is
// exported to a new fd, closed once sent.
func (d *Domain) lend(secret []byte) (lease, bool) {
	d.mu.Lock()
	var vmm *Memh
	for _, m := range d.live {
		if subtle.ConstantTimeCompare(m.secret[:], secret) != 1 {
			continue
		}
		if a := m.alloc; a != nil {
			a.refs++
			d.mu.Unlock()
			return lease{fd: a.region.FD(), size: uint64(a.region.Size), done: func() {
				d.mu.Lock()
				free := d.dropAlloc(a)
				d.mu.Unlock()
				free()
			}}, true
		}
		if m.mode == Export && m.cuda != nil && m.cuda.VMM {
			vmm = m
		}
		break
	}
	d.mu.Unlock()
	if vmm == nil {
		return lease{}, false
	}
	l := lease{fd: -1, size: vmm.cuda.Size, done: func() {}}
	if c := d.cudaImpl(); c == nil {
		l.err = errNoCUDA("lend cuda:%d memory", vmm.device)
	} else if l.fd, l.err = c.ExportFD(vmm.device, vmm.cuda); l.err == nil {
		fd := l.fd
		l.done = func() { closeFD(fd) }
	}
	return l, true
}

// fetchFD asks the fd server sock of exporter pid for the fd that secret
// names, which must map want bytes. The caller owns the returned fd.
func (d *Domain) fetchFD(pid int, secret [secretLen]byte, sock string, want uint64, deadline time.Time) (fd int, err error) {
	who := fmt.Sprintf("exporter pid %d (@%s)", pid, sock)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	var dialer net.Dialer
	nc, err := dialer.DialContext(ctx, "unixpacket", "@"+sock)
	if err != nil {
		return -1, status.Wrap(status.Peer, err, "memreg: import: connect to %s (exited, or its domain is closed?)", who)
	}
	c := nc.(*net.UnixConn)
	defer c.Close()
	if err := d.fault("import.connect"); err != nil {
		return -1, err
	}
	cred, err := comm.PeerCred(c)
	if err != nil {
		return -1, status.Wrap(status.System, err, "memreg: import: credentials of %s", who)
	}
	if int(cred.Pid) != pid || int64(cred.Uid) != d.uid.Load() {
		return -1, status.Errorf(status.Peer, "memreg: import: the socket of %s is served by pid %d uid %d, want pid %d uid %d",
			who, cred.Pid, cred.Uid, pid, d.uid.Load())
	}
	if err := d.fault("import.peercred"); err != nil {
		return -1, err
	}
	c.SetDeadline(deadline)
	req := make([]byte, reqLen)
	binary.LittleEndian.PutUint32(req, reqMagic)
	copy(req[4:], secret[:])
	if err := d.fault("import.request"); err != nil {
		return -1, err
	}
	if _, err := c.Write(req); err != nil {
		// A server that refuses by uid hangs up before reading: EPIPE.
		return -1, status.Wrap(status.Peer, err, "memreg: import: %s refused the request (uid wrong?)", who)
	}
	rep, fds, err := recvFDs(c)
	defer func() {
		for _, f := range fds {
			if f != fd || err != nil {
				closeFD(f)
			}
		}
	}()
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return -1, status.Wrap(status.Timeout, err, "memreg: import: no answer from %s by the deadline", who)
	case err != nil || len(rep) == 0:
		return -1, status.Errorf(status.Peer, "memreg: import: %s refused the request (memh unmapped, or secret or uid wrong)", who)
	case len(rep) < repFixed || binary.LittleEndian.Uint32(rep) != repMagic:
		return -1, status.Errorf(status.Peer, "memreg: import: %s sent a malformed reply of %d bytes", who, len(rep))
	case binary.LittleEndian.Uint32(rep[4:]) != repOK:
		return -1, status.Errorf(status.Peer, "memreg: import: %s failed: %q", who, rep[repFixed:])
	case len(fds) != 1:
		return -1, status.Errorf(status.Peer, "memreg: import: %s sent %d fds, want 1", who, len(fds))
	case binary.LittleEndian.Uint64(rep[8:]) != want:
		return -1, status.Errorf(status.Peer, "memreg: import: %s has a region of %d bytes, the blob says %d",
			who, binary.LittleEndian.Uint64(rep[8:]), want)
	}
	// The server hangs up once it has dropped its hold on the region and
	// counted the hand-out, so when Import returns the exporter's state is
	// settled (tests and leak checks rely on it).
	if n, rerr := c.Read(make([]byte, 1)); n != 0 || rerr != io.EOF {
		if errors.Is(rerr, os.ErrDeadlineExceeded) {
			return -1, status.Wrap(status.Timeout, rerr, "memreg: import: %s did not end the exchange by the deadline", who)
		}
		return -1, status.Errorf(status.Peer, "memreg: import: %s did not end the exchange (%d bytes, %v)", who, n, rerr)
	}
	fd = fds[0]
	if err = d.fault("import.recv"); err != nil {
		return -1, err
	}
	return fd, nil
}

// recvFDs reads one message and the fds that came with it; the caller
// closes the fds, also on error.
func recvFDs(c *net.UnixConn) ([]byte, []int, error) {
	buf := make([]byte, maxRep)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	n, oobn = max(n, 0), max(oobn, 0)
	var fds []int
	if oobn > 0 {
		if msgs, perr := unix.ParseSocketControlMessage(oob[:oobn]); perr == nil {
			for i := range msgs {
				if got, rerr := unix.ParseUnixRights(&msgs[i]); rerr == nil {
					fds = append(fds, got...)
				}
			}
		}
	}
	if err == nil && flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		err = errors.New("truncated message")
	}
	return buf[:n], fds, err
}

func closeFD(fd int) { unix.Close(fd) }
