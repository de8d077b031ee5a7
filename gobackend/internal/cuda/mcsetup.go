package cuda

import (
	"errors"
	"fmt"
	"syscall"
)

// McPeers is what the multicast setup needs from the group: a way to hand
// one file descriptor from the root to every other rank, and an agreement
// barrier. Both are collective: every rank calls them, in the same order.
type McPeers interface {
	// ShareFD sends fd (meaningful on root only; -1: the root has nothing
	// to share) to every other rank over the group's authenticated links.
	// On the other ranks it returns the fd received (the caller's to
	// close), or -1 if the root shared none; on the root it returns -1.
	ShareFD(root, fd int) (int, error)
	// Agree waits for every rank to reach step and returns the ranks that
	// reached it with ok false (sorted; empty when all succeeded). An
	// error means the group itself failed (a link, a timeout).
	Agree(step string, ok bool) (failed []int, err error)
}

// McSpec says what to bind: Size bytes at MemOffset of this rank's buffer
// Mem (both multiples of the multicast granularity, the same on every
// rank), on device Dev in context Ctx, with Root creating the object.
type McSpec struct {
	Ctx               Context
	Dev               Device
	Rank, World, Root int
	Mem               AllocHandle
	MemOffset         uintptr
	Size              uintptr
}

// McBinding is this rank's part of a multicast object bound over the
// group's buffers. Addr is the multicast address of the bound range: a
// multimem access at Addr+o reaches offset MemOffset+o of every rank's
// buffer. Close it before the buffers are released.
type McBinding struct {
	Addr uintptr

	d    *Driver
	mc   *Multicast
	spec McSpec
	// What to undo, in the order of the setup.
	h     AllocHandle
	held  bool
	bound bool
	va    uintptr
	mapd  bool
}

// SetupMulticast binds one multicast object over every rank's buffer.
// Every rank of the group calls it with the same Root, World and Size;
// prepare (may be nil) runs first, for local work that must succeed too
// (loading the NVLS kernels). The steps, with the group agreeing after
// each phase so that nothing is created unless every rank can go on and
// no rank binds before every device was added:
//
//  1. every rank: the gate (EnableMulticast with env), prepare, the
//     granularity check; agree;
//  2. the root creates the object and exports it as a POSIX fd, shares it;
//     the others import it; every rank adds its device; agree;
//  3. every rank binds its memory, reserves an address range, maps the
//     object there and enables access; agree.
//
// Any failure on any rank makes every rank release what it made (Close)
// and return an error wrapping ErrNotSupported that names the ranks and
// the step: all ranks fall back together. A failure of the group itself
// (McPeers) is returned as it is. No multicast function is reached on any
// rank unless the gate said yes on every rank.
func SetupMulticast(d *Driver, env func(string) string, spec McSpec, peers McPeers,
	prepare func() error) (*McBinding, error) {
	b := &McBinding{d: d, spec: spec}
	agree := func(step string, local error) error {
		failed, err := peers.Agree(step, local == nil)
		if err == nil && len(failed) == 0 {
			return nil
		}
		if cerr := b.Close(); cerr != nil && err == nil {
			local = errors.Join(local, cerr)
		}
		if err != nil {
			return err
		}
		why := fmt.Sprintf("ranks %v failed at %s", failed, step)
		if local != nil {
			why += fmt.Sprintf("; rank %d: %v", spec.Rank, local)
		}
		return fmt.Errorf("%w: multicast setup: %s", ErrNotSupported, why)
	}

	var gran uintptr
	prop := MulticastProp{NumDevices: uint32(spec.World), Size: spec.Size, HandleTypes: HandleTypePosixFD}
	local := spec.check()
	if local == nil {
		b.mc, local = d.EnableMulticast(env, spec.Dev)
	}
	if local == nil && prepare != nil {
		local = prepare()
	}
	if local == nil {
		gran, local = b.mc.Granularity(spec.Ctx, prop, false)
	}
	if local == nil && (gran == 0 || spec.Size%gran != 0 || spec.MemOffset%gran != 0) {
		local = fmt.Errorf("offset %d and size %d are not multiples of the multicast granularity %d",
			spec.MemOffset, spec.Size, gran)
	}
	if err := agree("the gate", local); err != nil {
		return nil, err
	}

	fd := -1
	if spec.Rank == spec.Root {
		if b.h, local = b.mc.Create(spec.Ctx, prop); local == nil {
			b.held = true
			fd, local = d.MemExportFD(spec.Ctx, b.h)
		}
	}
	share := fd
	if local != nil {
		share = -1
	}
	got, err := peers.ShareFD(spec.Root, share)
	if fd >= 0 {
		syscall.Close(fd)
	}
	if err != nil {
		b.Close()
		return nil, err
	}
	if spec.Rank != spec.Root {
		if got < 0 {
			local = fmt.Errorf("rank %d shared no multicast object", spec.Root)
		} else {
			b.h, local = d.MemImportFD(spec.Ctx, got)
			b.held = local == nil
			syscall.Close(got)
		}
	}
	if local == nil {
		local = b.mc.AddDevice(spec.Ctx, b.h, spec.Dev)
	}
	if err := agree("create, share, add device", local); err != nil {
		return nil, err
	}

	if local = b.mc.BindMem(spec.Ctx, b.h, 0, spec.Mem, spec.MemOffset, spec.Size); local == nil {
		b.bound = true
		b.va, local = d.MemAddressReserve(spec.Ctx, spec.Size, gran)
	}
	if local == nil {
		if local = d.MemMap(spec.Ctx, b.va, spec.Size, b.h); local == nil {
			b.mapd = true
			local = d.MemSetAccess(spec.Ctx, b.va, spec.Size, []Device{spec.Dev})
		}
	}
	if err := agree("bind and map", local); err != nil {
		return nil, err
	}
	b.Addr = b.va
	return b, nil
}

func (s McSpec) check() error {
	if s.World < 1 || s.World > MaxRanks || s.Rank < 0 || s.Rank >= s.World || s.Root < 0 || s.Root >= s.World {
		return fmt.Errorf("rank %d, root %d of a group of %d", s.Rank, s.Root, s.World)
	}
	if s.Size == 0 {
		return fmt.Errorf("nothing to bind")
	}
	return nil
}

// Close releases this rank's part in the order the driver needs: the
// multicast mapping and its address range, the binding, then the object,
// so that the caller can release the buffers afterwards (unbinding after
// the memory went fails on some drivers: pytorch#162429). It releases
// everything it can even when a step fails, and may be called again.
func (b *McBinding) Close() error {
	d, s := b.d, b.spec
	var errs []error
	if b.mapd {
		errs = append(errs, d.MemUnmap(s.Ctx, b.va, s.Size))
		b.mapd = false
	}
	if b.va != 0 {
		errs = append(errs, d.MemAddressFree(s.Ctx, b.va, s.Size))
		b.va = 0
	}
	if b.bound {
		errs = append(errs, b.mc.Unbind(s.Ctx, b.h, s.Dev, 0, s.Size))
		b.bound = false
	}
	if b.held {
		errs = append(errs, d.MemRelease(s.Ctx, b.h))
		b.held = false
	}
	b.Addr = 0
	return errors.Join(errs...)
}
