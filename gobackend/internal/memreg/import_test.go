package memreg

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/gosym/gosym/gobackend/internal/shm"
	"github.com/gosym/gosym/gobackend/internal/status"
)

func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = seed + byte(i*7)
	}
}

func TestImportRoundTrip(t *testing.T) {
	exp, imp := newDomain(t), newDomain(t)
	a, err := exp.Alloc(5 * 4096)
	require.NoError(t, err)
	fill(a.Bytes(), 1)
	tests := []struct {
		name string
		off  int
		n    int
	}{
		{"whole region", 0, 5 * 4096},
		{"page-aligned sub-range", 4096, 4096},
		{"odd sub-range", 4096 + 13, 1001},
		{"last byte", 5*4096 - 1, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := a
			if tt.off != 0 || tt.n != a.Len() {
				m, err = exp.Map(a.Address()+uintptr(tt.off), tt.n, HostDevice)
				require.NoError(t, err)
				defer exp.Unmap(m)
			}
			blob, err := m.Pack()
			require.NoError(t, err)
			got, err := imp.Import(blob)
			require.NoError(t, err)
			defer imp.Unmap(got)

			assert.Equal(t, Import, got.Mode())
			assert.False(t, got.Shareable())
			assert.Equal(t, a.Bytes()[tt.off:tt.off+tt.n], got.Bytes())
			// Writes go both ways: it is the same memory.
			got.Bytes()[0] ^= 0xff
			assert.Equal(t, got.Bytes()[0], a.Bytes()[tt.off])
			a.Bytes()[tt.off+tt.n-1] ^= 0xff
			assert.Equal(t, a.Bytes()[tt.off+tt.n-1], got.Bytes()[tt.n-1])

			found, ok := imp.Find(got.LocalAddress(), got.LocalLen())
			assert.True(t, ok)
			assert.Same(t, got, found)
			_, err = got.Pack()
			assert.Equal(t, status.NotSupported, status.CodeOf(err), "an import is not re-exported")
		})
	}
	assert.Equal(t, int64(len(tests)), exp.Stats()["served"])
	assert.Equal(t, int64(len(tests)), imp.Stats()["imports"])
	assert.Equal(t, int64(0), imp.Stats()["live"])
	assert.Equal(t, int64(0), imp.Stats()["regions"])
}

// TestImportPreservesRemoteAddress is UCC's import_preserves_remote_address:
// Address/Len stay the exporter's, LocalAddress/LocalLen are the importer's.
func TestImportPreservesRemoteAddress(t *testing.T) {
	exp, imp := newDomain(t), newDomain(t)
	a, err := exp.Alloc(3 * 4096)
	require.NoError(t, err)
	sub, err := exp.Map(a.Address()+4096+24, 4000, HostDevice)
	require.NoError(t, err)
	blob, err := sub.Pack()
	require.NoError(t, err)
	m, err := imp.Import(blob)
	require.NoError(t, err)
	assert.Equal(t, sub.Address(), m.Address())
	assert.Equal(t, sub.Len(), m.Len())
	assert.Equal(t, HostDevice, m.Device())
	assert.NotEqual(t, sub.Address(), m.LocalAddress(), "a second mapping of the region")
	assert.Equal(t, 4000, m.LocalLen())
	assert.Equal(t, uintptr(24), m.LocalAddress()%4096, "the range keeps its offset in the region")
	require.NoError(t, imp.Unmap(m))
	assert.Equal(t, sub.Address(), m.Address(), "unchanged by unmap")
}

// TestUnmapExportBeforeImport is UCC's unmap_export_before_import: the
// import fails cleanly, the exporter counts the refusal, nothing leaks.
func TestUnmapExportBeforeImport(t *testing.T) {
	exp, imp := newDomain(t), newDomain(t)
	a, err := exp.Alloc(4096)
	require.NoError(t, err)
	blob, err := a.Pack()
	require.NoError(t, err)
	require.NoError(t, exp.Unmap(a))
	regions := shm.LiveRegions()
	m, err := imp.Import(blob)
	require.Error(t, err)
	assert.Nil(t, m)
	assert.Contains(t, err.Error(), "refused")
	assert.Equal(t, status.Peer, status.CodeOf(err))
	assert.Equal(t, regions, shm.LiveRegions())
	assert.Equal(t, int64(1), exp.Stats()["refusals"])
	assert.Equal(t, int64(0), imp.Stats()["live"])

	// And once the exporter's domain is closed, nobody listens any more.
	b, err := exp.Alloc(4096)
	require.NoError(t, err)
	blob, err = b.Pack()
	require.NoError(t, err)
	require.NoError(t, exp.Close())
	_, err = imp.Import(blob)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "connect")
}

// TestRepeatedExportImportCycles is UCC's repeated_export_import_cycles:
// 20 cycles, alternating which side unmaps first, leak-free.
func TestRepeatedExportImportCycles(t *testing.T) {
	exp, imp := newDomain(t), newDomain(t)
	fds, regions, memfds := openFDs(), shm.LiveRegions(), shm.LiveFDs()
	for i := 0; i < 20; i++ {
		a, err := exp.Alloc(4096 * (1 + i%4))
		require.NoError(t, err)
		blob, err := a.Pack()
		require.NoError(t, err)
		m, err := imp.Import(blob)
		require.NoError(t, err)
		m.Bytes()[i] = byte(i + 1)
		require.Equal(t, byte(i+1), a.Bytes()[i])
		if i%2 == 0 {
			require.NoError(t, exp.Unmap(a))
			require.Equal(t, byte(i+1), m.Bytes()[i], "the import outlives the export")
			require.NoError(t, imp.Unmap(m))
		} else {
			require.NoError(t, imp.Unmap(m))
			require.NoError(t, exp.Unmap(a))
		}
		require.Equal(t, regions, shm.LiveRegions(), "cycle %d", i)
		require.Equal(t, memfds, shm.LiveFDs(), "cycle %d", i)
	}
	// The fd server's listener is the only new descriptor.
	assert.Equal(t, fds+1, openFDs())
	assert.Equal(t, int64(20), exp.Stats()["served"])
	assert.Equal(t, int64(20), imp.Stats()["unmaps"])
}

func TestImportAuthentication(t *testing.T) {
	exp := newDomain(t)
	a, err := exp.Alloc(4096)
	require.NoError(t, err)
	blob, err := a.Pack()
	require.NoError(t, err)
	p, err := parse(blob)
	require.NoError(t, err)

	wrongSecret := *p
	wrongSecret.memfd = &memfdEntry{}
	*wrongSecret.memfd = *p.memfd
	wrongSecret.memfd.secret[0] ^= 1
	otherPid := *p
	otherPid.pid = p.pid + 1
	uid := int64(os.Getuid())

	tests := []struct {
		name        string
		blob        []byte
		exporterUID int64 // the uid the exporter accepts
		importerUID int64 // the uid the importer expects of the exporter
		want        string
	}{
		{"wrong secret", wrongSecret.encode(), uid, uid, "refused"},
		{"importer of another uid", blob, uid + 1, uid, "refused"},
		// The importer hangs up on an exporter it does not trust; the
		// server then refuses the empty request.
		{"exporter of another uid", blob, uid, uid + 1, "served by pid"},
		{"socket of another pid", otherPid.encode(), uid, uid, "served by pid"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			imp := newDomain(t)
			before := exp.Stats()
			exp.uid.Store(tt.exporterUID)
			imp.uid.Store(tt.importerUID)
			defer exp.uid.Store(uid)
			m, err := imp.Import(tt.blob)
			require.Error(t, err)
			assert.Nil(t, m)
			assert.Contains(t, err.Error(), tt.want)
			assert.Equal(t, status.Peer, status.CodeOf(err))
			// The server counts a refusal on its own goroutine.
			require.Eventually(t, func() bool {
				return exp.Stats()["refusals"] == before["refusals"]+1
			}, 5*time.Second, time.Millisecond)
			assert.Equal(t, before["served"], exp.Stats()["served"], "nothing handed out")
		})
	}
	// A client that sends garbage gets nothing either.
	for _, req := range [][]byte{[]byte("hello"), make([]byte, reqLen), make([]byte, reqLen+1)} {
		before := exp.Stats()["refusals"]
		c, err := net.Dial("unixpacket", "@"+p.memfd.sock)
		require.NoError(t, err)
		_, err = c.Write(req)
		require.NoError(t, err)
		n, err := c.Read(make([]byte, 64))
		assert.Equal(t, 0, n)
		assert.Error(t, err)
		c.Close()
		require.Eventually(t, func() bool { return exp.Stats()["refusals"] == before+1 }, 5*time.Second, time.Millisecond)
	}
}

// fakeExporter serves one import request with reply and returns a blob
// naming it; it lets tests play a misbehaving exporter.
func fakeExporter(t *testing.T, regionLen uint64, reply func(c *net.UnixConn)) []byte {
	t.Helper()
	name := fmt.Sprintf("gosym-memreg-fake-%d-%d", os.Getpid(), time.Now().UnixNano())
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: "@" + name, Net: "unixpacket"})
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.AcceptUnix()
		if err != nil {
			return
		}
		defer c.Close()
		c.Read(make([]byte, 64))
		reply(c)
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	p := &packed{pid: os.Getpid(), device: HostDevice, addr: 0x7f0000000000, length: 64,
		memfd: &memfdEntry{regionLen: regionLen, sock: name}}
	return p.encode()
}

func TestImportBadExporter(t *testing.T) {
	memfd := func(t *testing.T, size int) int {
		fd, err := unix.MemfdCreate("fake", unix.MFD_CLOEXEC)
		require.NoError(t, err)
		require.NoError(t, unix.Ftruncate(fd, int64(size)))
		t.Cleanup(func() { unix.Close(fd) })
		return fd
	}
	rep := func(code uint32, size uint64, text string) []byte {
		b := make([]byte, repFixed)
		binary.LittleEndian.PutUint32(b, repMagic)
		binary.LittleEndian.PutUint32(b[4:], code)
		binary.LittleEndian.PutUint64(b[8:], size)
		return append(b, text...)
	}
	send := func(b []byte, fds ...int) func(c *net.UnixConn) {
		return func(c *net.UnixConn) {
			var oob []byte
			if len(fds) > 0 {
				oob = unix.UnixRights(fds...)
			}
			c.WriteMsgUnix(b, oob, nil)
		}
	}
	tests := []struct {
		name  string
		reply func(t *testing.T) func(c *net.UnixConn)
		code  status.Code
		want  string
	}{
		{"hangs up", func(t *testing.T) func(*net.UnixConn) { return func(*net.UnixConn) {} }, status.Peer, "refused"},
		{"malformed reply", func(t *testing.T) func(*net.UnixConn) { return send([]byte("nope")) }, status.Peer, "malformed"},
		{"error reply", func(t *testing.T) func(*net.UnixConn) {
			return send(rep(repFailed, 4096, "disk on fire"))
		}, status.Peer, "disk on fire"},
		{"no fd", func(t *testing.T) func(*net.UnixConn) { return send(rep(repOK, 4096, "")) }, status.Peer, "0 fds"},
		{"two fds", func(t *testing.T) func(*net.UnixConn) {
			return send(rep(repOK, 4096, ""), memfd(t, 4096), memfd(t, 4096))
		}, status.Peer, "2 fds"},
		{"other region length", func(t *testing.T) func(*net.UnixConn) {
			return send(rep(repOK, 8192, ""), memfd(t, 8192))
		}, status.Peer, "region of 8192"},
		{"file smaller than it claims", func(t *testing.T) func(*net.UnixConn) {
			return send(rep(repOK, 4096, ""), memfd(t, 100))
		}, status.System, "want 4096"},
		{"silent", func(t *testing.T) func(*net.UnixConn) {
			return func(*net.UnixConn) { time.Sleep(500 * time.Millisecond) }
		}, status.Timeout, "deadline"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			imp := newDomain(t)
			fds, regions := openFDs(), shm.LiveRegions()
			blob := fakeExporter(t, 4096, tt.reply(t))
			m, err := imp.ImportDeadline(blob, time.Now().Add(200*time.Millisecond))
			require.Error(t, err)
			assert.Nil(t, m)
			assert.Equal(t, tt.code, status.CodeOf(err), err.Error())
			assert.Contains(t, err.Error(), tt.want)
			assert.Equal(t, regions, shm.LiveRegions())
			// The fake's own fds aside (listener, conn, its memfds), the importer closed all it received.
			n := 0
			for _, e := range must(os.ReadDir("/proc/self/fd")) {
				if l, _ := os.Readlink("/proc/self/fd/" + e.Name()); strings.Contains(l, "memfd:fake") {
					n++
				}
			}
			assert.LessOrEqual(t, n, 2, "received memfds left open (fds %d -> %d)", fds, openFDs())
		})
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

const (
	helperEnv = "GOSYM_MEMREG_HELPER"
	blobEnv   = "GOSYM_MEMREG_BLOB"
)

// TestHelperProcess is the importer half of the cross-process tests; it
// does nothing unless the parent test started it.
func TestHelperProcess(t *testing.T) {
	mode := os.Getenv(helperEnv)
	if mode == "" {
		t.Skip("helper for TestCrossProcess*")
	}
	blob, err := hex.DecodeString(os.Getenv(blobEnv))
	require.NoError(t, err)
	d := NewDomain()
	defer d.Close()
	if mode == "refused" {
		// Trust the exporter's uid, so that the refusal is the exporter's.
		d.uid.Store(int64(must(strconv.Atoi(os.Getenv(helperEnv + "_UID")))))
	}
	m, err := d.Import(blob)
	if mode == "refused" {
		require.Error(t, err)
		require.Contains(t, err.Error(), "refused the request")
		fmt.Println("import refused:", err)
		return
	}
	require.NoError(t, err)
	b := m.Bytes()
	want := make([]byte, len(b))
	fill(want, 1)
	require.Equal(t, want, b, "the exporter's data")
	fill(b, 100)
	require.NoError(t, d.Unmap(m))
	fmt.Println("import ok:", m)
}

func helper(t *testing.T, bin, mode string, blob []byte) *exec.Cmd {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, bin, "-test.run=^TestHelperProcess$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode, blobEnv+"="+hex.EncodeToString(blob))
	return cmd
}

// TestCrossProcess: a second process imports the blob over the exporter's
// fd server, checks the data and writes a pattern the parent then sees.
func TestCrossProcess(t *testing.T) {
	exp := newDomain(t)
	a, err := exp.Alloc(2 * 4096)
	require.NoError(t, err)
	sub, err := exp.Map(a.Address()+100, 5000, HostDevice)
	require.NoError(t, err)
	fill(sub.Bytes(), 1)
	blob, err := sub.Pack()
	require.NoError(t, err)
	out, err := helper(t, os.Args[0], "import", blob).CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "import ok")
	t.Logf("helper: %s", out)
	want := make([]byte, 5000)
	fill(want, 100)
	assert.Equal(t, want, a.Bytes()[100:5100])
	assert.Equal(t, int64(1), exp.Stats()["served"])
}

// TestCrossProcessOtherUser: a process of another uid that holds the blob
// gets nothing (needs root to run the helper as nobody).
func TestCrossProcessOtherUser(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to start a process of another uid")
	}
	exp := newDomain(t)
	a, err := exp.Alloc(4096)
	require.NoError(t, err)
	blob, err := a.Pack()
	require.NoError(t, err)
	// nobody must be able to run the test binary: copy it somewhere open.
	dir, err := os.MkdirTemp("", "memreg-test-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	bin := filepath.Join(dir, "memreg.test")
	data, err := os.ReadFile(os.Args[0])
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(bin, data, 0o755))
	cmd := helper(t, bin, "refused", blob)
	cmd.Env = append(cmd.Env, fmt.Sprintf("%s_UID=%d", helperEnv, os.Getuid()))
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "import refused")
	t.Logf("helper: %s", out)
	require.Eventually(t, func() bool { return exp.Stats()["refusals"] == 1 }, 5*time.Second, time.Millisecond)
	assert.Equal(t, int64(0), exp.Stats()["served"])
}
