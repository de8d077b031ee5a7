package gobackend

import (
	"fmt"
	"testing"

	"github.com/gosym/gosym/gobackend/internal/host"
	"github.com/gosym/gosym/gobackend/internal/leakcheck"
)

func openFDs() int { return leakcheck.OpenFDs() }

// TestMain fails the package when tests leak fds, mappings, endpoints or
// goroutines: every test destroys what it creates.
func TestMain(m *testing.M) {
	leakcheck.Main(m, func() string {
		if n := host.LiveRegions() + host.LiveFDs() + liveEndpoints.Load(); n != 0 {
			return fmt.Sprintf("regions+memfds+endpoints %d", n)
		}
		return ""
	})
}
