package host

import (
	"fmt"
	"os"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// BenchmarkPeerRead compares the two ways to move a private buffer between
// processes that the staged path could use: memmove (the staged path does
// two: into the sender's staging, out of it) against one process_vm_readv
// (a kernel copy that pins pages). On the 2-core dev machine (2026-11-22):
// memmove 38-44 GB/s, process_vm_readv 10-11 GB/s, from 64 KiB to 16 MiB,
// so two memmoves (~20 GB/s) beat it and gosym stages. Here the "peer" is
// this process, which is the same kernel path.
func BenchmarkPeerRead(b *testing.B) {
	for _, n := range []int{64 << 10, 1 << 20, 16 << 20} {
		src, dst := make([]byte, n), make([]byte, n)
		b.Run(fmt.Sprintf("memmove/%d", n), func(b *testing.B) {
			b.SetBytes(int64(n))
			for i := 0; i < b.N; i++ {
				copy(dst, src)
			}
		})
		b.Run(fmt.Sprintf("process_vm_readv/%d", n), func(b *testing.B) {
			b.SetBytes(int64(n))
			local := []unix.Iovec{{Base: &dst[0]}}
			local[0].SetLen(n)
			remote := []unix.RemoteIovec{{Base: uintptr(unsafe.Pointer(&src[0])), Len: n}}
			for i := 0; i < b.N; i++ {
				if _, err := unix.ProcessVMReadv(os.Getpid(), local, remote, 0); err != nil {
					b.Skipf("process_vm_readv: %v", err)
				}
			}
		})
	}
}
