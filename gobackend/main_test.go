package gobackend

import (
	"fmt"
	"testing"

	"github.com/gosym/gosym/gobackend/internal/leakcheck"
	"github.com/gosym/gosym/gobackend/internal/shm"
)

func openFDs() int { return leakcheck.OpenFDs() }

// TestMain fails the package when tests leak fds, mappings, endpoints or
// goroutines: every test destroys what it creates.
func TestMain(m *testing.M) {
	leakcheck.Main(m, func() string {
		if n := shm.LiveRegions() + shm.LiveFDs() + liveEndpoints.Load(); n != 0 {
			return fmt.Sprintf("regions+memfds+endpoints %d", n)
		}
		return ""
	})
}
