package memreg

import (
	"fmt"
	"testing"

	"github.com/gosym/gosym/gobackend/internal/leakcheck"
	"github.com/gosym/gosym/gobackend/internal/shm"
)

func goroutines() int { return leakcheck.Goroutines() }

func openFDs() int { return leakcheck.OpenFDs() }

// TestMain fails the package when tests leak fds, mappings, memfds or
// goroutines (fd servers, connection handlers): every test closes the
// domains it makes.
func TestMain(m *testing.M) {
	leakcheck.Main(m, func() string {
		var s string
		if n := shm.LiveRegions(); n != 0 {
			s += fmt.Sprintf(" mappings %d", n)
		}
		if n := shm.LiveFDs(); n != 0 {
			s += fmt.Sprintf(" memfds %d", n)
		}
		return s
	})
}
