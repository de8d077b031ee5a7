package gpu

// Paged VMM memory: the expandable segments of torch's caching allocator
// (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True). Such a segment is a
// reserved range into which torch maps pages, each a VMM allocation of its
// own (2 MiB in the small pool, 20 MiB in the large one), exportable as a
// POSIX fd, with no legacy IPC handle. A tensor may span several pages, and
// torch may unmap a page and map another allocation at the same address.
//
// The direct path shares such memory as *runs*: the pages that cover an
// op's buffers, walked from the first (cuMemGetAddressRange reports one
// page's mapping, cuMemRetainAllocationHandle its allocation). A run is
// published to a group as a registered VMM memh is: the op that first
// meets it sends the fds of its pages over the links (one announcement,
// several fds), every peer maps them side by side in one range of its own,
// and once every rank did the run is bound: later ops on it take one host
// round and no fd.
//
// The exporter keeps its own retain on every page of a published run, so
// no allocation of it, and so no handle value, can be reused while the run
// lives. Every op on a published run checks its pages again (a retain at
// each page's address must give the page's allocation): a run with a page
// unmapped or replaced is retired (its retains released, its id sent with
// the next round, and the peers drop their mapping), and the buffers
// publish a new run. A few pages of the other runs are checked per op
// (sweepPages), so pages torch gave back (empty_cache) are released
// within a few direct ops rather than held for the group's life.
//
// A run that a captured op read is never retired: a CUDA graph replays
// the peers' reads of their mappings of it at any time, and its buffers
// may lie in pages that stay while others in the run go. Once it changes
// it is unpublished (no later op finds it) but kept, its pages retained
// and the peers' mappings open, until the group goes.

import (
	"encoding/binary"
	"fmt"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/gosym/gosym/gobackend/internal/comm"
	"github.com/gosym/gosym/gobackend/internal/cuda"
)

// pageRunBit marks run ids: they share the peers' mapping cache and the
// retired lists with memh ids, which never have it.
const pageRunBit = 1 << 63

// maxRunFDs bounds the fds one rank receives to bind fresh runs (a run
// of more pages than maxRunFDs/(world-1) stages), so that an fd
// exchange stays well inside a process's descriptor limit.
const maxRunFDs = 256

// maxRuns bounds the runs a group publishes; past it new runs stage
// until the sweep retires old ones.
const maxRuns = 1024

// sweepPages is how many pages of other runs an op checks (whole runs,
// at least one).
const sweepPages = 2

// pageRec is one page of a run: its allocation (the run's own retain) and
// the size of its mapping.
type pageRec struct {
	h    cuda.AllocHandle
	size uintptr
}

// pageRun is a run of pages this rank published to the group.
type pageRun struct {
	id         uint64
	base, size uintptr
	pages      []pageRec
	bound      bool // every rank maps it
	captured   bool // a captured op read it: kept, never retired
}

// sizes are the run's page sizes, as its binding announces them.
func (r *pageRun) sizes() []uintptr {
	out := make([]uintptr, len(r.pages))
	for i, p := range r.pages {
		out[i] = p.size
	}
	return out
}

// walked is pages walked from an address, by address, over [base, end).
type walked struct {
	base, end uintptr
	at        map[uintptr]pageRec
}

func walkedFrom(base uintptr, pages []pageRec) walked {
	w := walked{base: base, end: base, at: make(map[uintptr]pageRec, len(pages))}
	for _, p := range pages {
		w.at[w.end] = p
		w.end += p.size
	}
	return w
}

// agrees says whether the walked pages match the run's wherever the two
// overlap.
func (r *pageRun) agrees(w walked) bool {
	b := r.base
	for _, p := range r.pages {
		if b+p.size > w.base && b < w.end {
			if q, ok := w.at[b]; !ok || q != p {
				return false
			}
		}
		b += p.size
	}
	return true
}

// walkPages retains the pages that cover [lo, lo+n), at most most of them,
// and returns the first one's address. The pages must abut. On error none
// stays retained.
func walkPages(ipc ipcMaps, lo, n uintptr, most int) (uintptr, []pageRec, error) {
	var base uintptr
	var pages []pageRec
	var err error
	for a := lo; a < lo+n && err == nil; {
		pb, ps, h, perr := ipc.pageAt(a)
		switch {
		case perr != nil:
			err = perr
		case len(pages) > 0 && pb != a || len(pages) == 0 && pb > a || ps == 0 || pb+ps <= a:
			ipc.pageRelease(h)
			err = fmt.Errorf("the page at %#x maps %#x+%d", a, pb, ps)
		case len(pages) == most:
			ipc.pageRelease(h)
			err = fmt.Errorf("the buffers span more than %d pages", most)
		default:
			if len(pages) == 0 {
				base = pb
			}
			pages = append(pages, pageRec{h, ps})
			a = pb + ps
		}
	}
	if err != nil {
		releasePages(ipc, pages)
		return 0, nil, err
	}
	return base, pages, nil
}

func releasePages(ipc ipcMaps, pages []pageRec) {
	for _, p := range pages {
		ipc.pageRelease(p.h)
	}
}

// unchanged says whether every page of r is still mapped where it was: a
// retain at its address gives its allocation, which r's own retain keeps
// from being freed and its handle value from being reused.
func unchanged(ipc ipcMaps, r *pageRun) bool {
	a := r.base
	for _, p := range r.pages {
		h, err := ipc.pageRetain(a)
		if err != nil {
			return false
		}
		ipc.pageRelease(h)
		if h != p.h {
			return false
		}
		a += p.size
	}
	return true
}

// holding is the published runs that hold [lo, lo+n).
func (g *registry) holding(lo, n uintptr) []*pageRun {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []*pageRun
	for _, r := range g.runs {
		if lo >= r.base && lo+n <= r.base+r.size {
			out = append(out, r)
		}
	}
	return out
}

// covers says whether a published run holds [lo, lo+n).
func (g *registry) covers(lo, n uintptr) bool { return len(g.holding(lo, n)) > 0 }

// published is a published run that holds [lo, lo+n) and is unchanged;
// those that hold it but changed are retired.
func (g *registry) published(ipc ipcMaps, lo, n uintptr) *pageRun {
	var found *pageRun
	var stale []*pageRun
	for _, r := range g.holding(lo, n) {
		if unchanged(ipc, r) {
			found = r
			break
		}
		stale = append(stale, r)
	}
	g.drop(ipc, stale)
	return found
}

// drop unpublishes the runs, releases their pages and retires their ids:
// the peers drop their mappings at their next round. Runs a captured op
// read are kept instead, pages and mappings, until the group goes.
func (g *registry) drop(ipc ipcMaps, runs []*pageRun) {
	if len(runs) == 0 {
		return
	}
	g.mu.Lock()
	g.runs = slices.DeleteFunc(g.runs, func(r *pageRun) bool { return slices.Contains(runs, r) })
	var retire []*pageRun
	for _, r := range runs {
		delete(g.refused, r.id)
		if r.captured {
			g.kept = append(g.kept, r)
		} else {
			retire = append(retire, r)
		}
	}
	g.mu.Unlock()
	g.runsKept.Add(int64(len(runs) - len(retire)))
	for _, r := range retire {
		releasePages(ipc, r.pages)
		g.retire(r.id)
		g.runsRetired.Add(1)
	}
}

// run is the run of paged memory that holds [lo, lo+n): a published one
// still mapped there, or a new one of the pages walked from lo (none while
// capturing: the op stages and a later one publishes). nil with an error:
// the memory is not paged VMM memory, or too many pages. Runs that
// overlap the walked pages with others are retired (a run of the same
// pages would have been found unchanged).
func (g *registry) run(ipc ipcMaps, lo, n uintptr, world int, capturing bool) (*pageRun, error) {
	if r := g.published(ipc, lo, n); r != nil {
		return r, nil
	}
	base, pages, err := walkPages(ipc, lo, n, maxRunFDs/max(1, world-1))
	if err != nil {
		return nil, err
	}
	size := uintptr(0)
	for _, p := range pages {
		size += p.size
	}
	w := walkedFrom(base, pages)
	g.mu.Lock()
	var stale []*pageRun
	for _, r := range g.runs {
		if !r.agrees(w) {
			stale = append(stale, r)
		}
	}
	var fresh *pageRun
	if !capturing && len(g.runs)-len(stale) < maxRuns {
		g.nextRun++
		fresh = &pageRun{id: pageRunBit | g.nextRun, base: base, size: size, pages: pages} // the walk's retains become its own
		g.runs = append(g.runs, fresh)
	}
	g.mu.Unlock()
	g.drop(ipc, stale)
	if fresh == nil {
		releasePages(ipc, pages)
		return nil, fmt.Errorf("no new run while a graph is captured or with %d published", maxRuns)
	}
	g.runsMade.Add(1)
	return fresh, nil
}

// sweep checks whole published runs other than skip, round robin, until
// sweepPages pages were checked, and retires those that changed.
func (g *registry) sweep(ipc ipcMaps, skip *pageRun) {
	g.mu.Lock()
	runs := slices.Clone(g.runs)
	start := g.sweepAt
	g.mu.Unlock()
	var stale []*pageRun
	checked := 0
	for i := 0; i < len(runs) && checked < sweepPages; i++ {
		r := runs[(start+i)%len(runs)]
		g.sweepAt = (start + i + 1) % len(runs)
		if r == skip {
			continue
		}
		checked += len(r.pages)
		if !unchanged(ipc, r) {
			stale = append(stale, r)
		}
	}
	g.drop(ipc, stale)
}

// bindRun records that every rank maps run r.
func (g *registry) bindRun(r *pageRun) {
	g.mu.Lock()
	r.bound = true
	g.mu.Unlock()
}

// captureRun records that a captured op reads run r.
func (g *registry) captureRun(r *pageRun) {
	g.mu.Lock()
	r.captured = true
	g.mu.Unlock()
}

// runBound says whether run r is bound.
func (g *registry) runBound(r *pageRun) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return r.bound
}

// closeRuns releases every run's pages, kept ones too (the group goes;
// its peers close their mappings themselves).
func (g *registry) closeRuns(ipc ipcMaps) {
	g.mu.Lock()
	runs := slices.Concat(g.runs, g.kept)
	g.runs, g.kept = nil, nil
	g.mu.Unlock()
	for _, r := range runs {
		releasePages(ipc, r.pages)
	}
}

// exportRun is the fds of run r's pages (the caller closes them) and the
// body that announces their sizes; on error none stays open.
func exportRun(ipc ipcMaps, r *pageRun) ([]int, []byte, error) {
	fds := make([]int, 0, len(r.pages))
	for _, p := range r.pages {
		fd, err := ipc.pageExport(p.h)
		if err != nil {
			closeFDs(fds)
			return nil, nil, err
		}
		fds = append(fds, fd)
	}
	return fds, sizesBody(r.sizes()), nil
}

// sizesBody announces the sizes of the allocations whose fds go with it.
func sizesBody(sizes []uintptr) []byte {
	var b []byte
	for _, s := range sizes {
		b = binary.LittleEndian.AppendUint64(b, uint64(s))
	}
	return b
}

// announcedSizes reads what sizesBody wrote for m's fds, which must add up
// to total bytes.
func announcedSizes(m *comm.FDMsg, total uintptr) ([]uintptr, error) {
	if len(m.FDs) == 0 || len(m.Body) != 8*len(m.FDs) {
		return nil, fmt.Errorf("%d fds and %d bytes of sizes", len(m.FDs), len(m.Body))
	}
	sizes := make([]uintptr, len(m.FDs))
	sum := uintptr(0)
	for i := range sizes {
		sizes[i] = uintptr(binary.LittleEndian.Uint64(m.Body[8*i:]))
		sum += sizes[i]
		if sizes[i] == 0 || sum < sizes[i] {
			return nil, fmt.Errorf("announced sizes %v", sizes[:i+1])
		}
	}
	if sum != total {
		return nil, fmt.Errorf("announced sizes add up to %d bytes, the record says %d", sum, total)
	}
	return sizes, nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
