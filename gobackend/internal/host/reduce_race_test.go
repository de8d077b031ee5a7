//go:build race

package host

// raceEnabled trims the largest sizes from TestReduceTable under the race
// detector, which sees nothing of the C kernels and slows the Go reference
// twentyfold; the full table runs in every build without -race.
const raceEnabled = true
