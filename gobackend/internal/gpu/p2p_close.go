package gpu

// Tearing the channels down when the endpoint goes.

import (
	"fmt"
	"slices"
	"time"

	"github.com/gosym/gosym/gobackend/internal/dlog"
)

// p2pGrace is how long Destroy waits for a peer that consumed everything
// to leave the channel too before freeing this side's memory anyway.
const p2pGrace = 2 * time.Second

// Close waits for handshakes in flight (they fail fast once the endpoint
// is closed) and tears every channel down. Once the devices are idle, each
// side tells its peer it left and drops its mappings of the peer's memory
// (Leave); it frees its own allocations once the peer left too (so an
// importer always closes before its exporter frees when both ranks
// destroy the group), or consumed everything this side sent and did not
// leave within p2pGrace (it goes on running), or exited, or the group's
// timeout passed. A peer that exited is not told (its memory is not
// written). A device still busy after wait (a kernel no abort reached)
// keeps its channels: they stay mapped, with a warning, rather than be
// freed under a kernel that may still touch them. Errors the kernels
// recorded are logged.
func (p *P2P) Close(wait time.Duration) {
	p.mu.Lock()
	p.closed = true
	peers := p.peers
	p.mu.Unlock()
	if peers == nil { // no channel was asked for (nor, maybe, the endpoint connected)
		return
	}
	idle := map[*Device]bool{}
	dead := p.link.Dead()
	var open []int
	for r, c := range peers {
		if c == nil {
			continue
		}
		<-c.done
		if c.ch == nil {
			continue
		}
		if c.used.Load() {
			ok, asked := idle[c.g]
			if !asked {
				ok = c.g.idle(wait, fmt.Sprintf("rank %d, closing its CUDA p2p channels", p.grp.Rank))
				idle[c.g] = ok
			}
			if !ok {
				continue
			}
		}
		if dlog.On {
			if w, err := c.ch.ErrorWords(); err == nil && w[0] != 0 {
				dlog.Printf("rank %d: the CUDA p2p channel with rank %d recorded %s", p.grp.Rank, r, p2pErrorText(r, w))
			}
		}
		if err := c.ch.Leave(!slices.Contains(dead, r)); err != nil {
			dlog.Printf("rank %d: leaving the CUDA p2p channel with rank %d: %v", p.grp.Rank, r, err)
		}
		open = append(open, r)
	}
	start := time.Now()
	for pause := time.Millisecond; len(open) > 0; pause = min(2*pause, 50*time.Millisecond) {
		dead = p.link.Dead()
		waited := time.Since(start)
		left := open[:0]
		for _, r := range open {
			c := peers[r]
			gone, drained, err := c.ch.Settled()
			free := gone || err != nil || slices.Contains(dead, r) || waited > p.grp.Timeout || (drained && waited > p2pGrace)
			if !free {
				left = append(left, r)
				continue
			}
			if !gone {
				dlog.Printf("rank %d: freeing the CUDA p2p channel with rank %d before it left (drained %v, %v)", p.grp.Rank, r, drained, err)
			}
			if err := c.ch.Close(); err != nil {
				dlog.Printf("rank %d: closing the CUDA p2p channel with rank %d: %v", p.grp.Rank, r, err)
			}
			c.ch = nil
		}
		open = left
		if len(open) > 0 {
			time.Sleep(pause)
		}
	}
}
