package cuda

import (
	"errors"
	"testing"

	"github.com/gosym/gosym/gobackend/internal/dtype"
	"github.com/gosym/gosym/gobackend/internal/leakcheck"
)

// TestMain fails the package when its tests leak file descriptors or
// goroutines (compile-cache files, libraries opened for probing).
func TestMain(m *testing.M) { leakcheck.Main(m, nil) }

// skipIfNoCUDA skips a test that needs CUDA when err says CUDA is absent,
// and fails it for any other error (cilium's SkipIfNotSupported): an error
// that forgot to wrap ErrNoCUDA must not silently turn into a skip.
func skipIfNoCUDA(tb testing.TB, err error) {
	tb.Helper()
	if err == nil {
		return
	}
	if errors.Is(err, ErrNoCUDA) {
		tb.Skipf("no CUDA here: %v", err)
	}
	tb.Fatalf("unexpected error (not ErrNoCUDA): %v", err)
}

// withFake runs f against the fake driver.
func withFake(t *testing.T, f func(d *Driver), missing ...string) {
	t.Helper()
	d, release, err := fakeDriver(missing...)
	if err != nil {
		t.Fatalf("fake driver: %v", err)
	}
	defer release()
	f(d)
}

func dtypeOf(v int32) dtype.DType { return dtype.DType(v) }
func redOpOf(v int32) dtype.RedOp { return dtype.RedOp(v) }
