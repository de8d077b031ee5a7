package config

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/status"
)

const root = "../../.."

// TestTunablesFresh: docs/TUNABLES.md is the table as it is.
func TestTunablesFresh(t *testing.T) {
	got, err := os.ReadFile(filepath.Join(root, "docs", "TUNABLES.md"))
	require.NoError(t, err)
	require.Equal(t, Markdown(), string(got), "docs/TUNABLES.md is stale: run go generate ./gobackend/internal/config")
}

// notVariables are GOSYM_ names in the tree that are neither environment
// variables nor ABI constants of cabi/gosym.h.
var notVariables = map[string]string{
	"GOSYM_SYMBOL_MISSING":    "a CUDA plane error name (internal/cuda/errors.go)",
	"GOSYM_MULTICAST_REFUSED": "a CUDA plane error name (internal/cuda/errors.go)",
}

var gosymName = regexp.MustCompile(`GOSYM_[A-Z0-9_]+`)

// abiNames are the constants cabi/gosym.h defines (its #define lines).
func abiNames(t *testing.T) map[string]bool {
	h, err := os.ReadFile(filepath.Join(root, "cabi", "gosym.h"))
	require.NoError(t, err)
	out := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^#define (GOSYM_[A-Z0-9_]+)`).FindAllSubmatch(h, -1) {
		out[string(m[1])] = true
	}
	require.Contains(t, out, "GOSYM_OK")
	return out
}

// TestEveryNameInTable: a GOSYM_ name anywhere in the code, scripts or
// tests is in the table, unless it is an ABI constant, a header guard, a
// prefix being written about (GOSYM_ERR_) or one of notVariables.
func TestEveryNameInTable(t *testing.T) {
	abi := abiNames(t)
	missing := map[string][]string{}
	seen := map[string]bool{}
	check := func(path string) {
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		if bytes.IndexByte(b, 0) >= 0 {
			return // a built binary (libgosym.so), not source
		}
		for _, n := range gosymName.FindAll(b, -1) {
			name := string(n)
			seen[name] = true
			if _, ok := Lookup(name); ok || abi[name] || notVariables[name] != "" ||
				strings.HasSuffix(name, "_") || strings.HasSuffix(name, "_H") || strings.HasSuffix(name, "_CUH") {
				continue
			}
			rel, _ := filepath.Rel(root, path)
			missing[name] = append(missing[name], rel)
		}
	}
	self, err := filepath.Abs(".")
	require.NoError(t, err)
	for _, dir := range []string{"gobackend", "cabi", "python", "scripts", "tests", "kernels"} {
		require.NoError(t, filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if n := d.Name(); n == "__pycache__" || n == "testdata" || strings.HasPrefix(n, ".") {
					return filepath.SkipDir
				}
				if abs, _ := filepath.Abs(path); abs == self {
					return filepath.SkipDir // the table itself says nothing about use
				}
				return nil
			}
			check(path)
			return nil
		}))
	}
	for _, f := range []string{"Makefile", "setup.py", "pyproject.toml"} {
		check(filepath.Join(root, f))
	}
	require.Empty(t, missing, "GOSYM_ names missing from the table in gobackend/internal/config/table.go")
	// The walk saw the tree: names read in each reader's files.
	for _, n := range []string{"GOSYM_SLOTS", "GOSYM_GPU_LL_MAX", "GOSYM_LIBRARY", "GOSYM_VENV", "GOSYM_TEST_OUT"} {
		require.True(t, seen[n], n)
	}
	// Every row is used somewhere (a row nothing reads is stale).
	for _, s := range table {
		require.True(t, seen[s.Name], "%s is in the table but nowhere in the tree", s.Name)
	}
}

// TestCheck: a bad value of any engine setting is an error naming the
// variable, the value and what it accepts; unset and good values pass.
func TestCheck(t *testing.T) {
	for _, s := range table {
		if s.Reader == Engine || s.Reader == Both {
			t.Setenv(s.Name, "")
		}
	}
	require.NoError(t, Check())
	t.Setenv("GOSYM_SLOTS", "256")
	t.Setenv("GOSYM_GPU_LL_MAX", "0")
	t.Setenv("GOSYM_ENABLE_UBR", "no")
	t.Setenv("GOSYM_LIBCUDA", "/any/path")
	require.NoError(t, Check())
	require.Equal(t, 256, Slots.Get())
	require.Equal(t, 0, GPULLMax.Get())
	require.Equal(t, "no", EnableUBR.Get())

	cases := map[string][2]string{ // variable: value, accepted
		"GOSYM_SLOTS":           {"257", "a whole number from 2 to 256"},
		"GOSYM_SPIN_US":         {"0", "a whole number from 1"},
		"GOSYM_GPU_STAGE_BYTES": {"32M", "a whole number from 1"},
		"GOSYM_GPU_LL_MAX":      {"-1", "a whole number from 0"},
		"GOSYM_ENABLE_UBR":      {"maybe", "one of try, yes, no"},
		"GOSYM_DEBUG":           {"yes", "one of 0, 1"},
		"GOSYM_NVLS":            {"true", "one of 0, 1"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			t.Setenv(name, c[0])
			err := Check()
			require.Equal(t, status.InvalidArg, status.CodeOf(err))
			require.Contains(t, err.Error(), name+"=\""+c[0]+"\": want "+c[1])
		})
	}
	// Two bad values: both named.
	t.Setenv("GOSYM_SLOTS", "1")
	t.Setenv("GOSYM_THREADS", "x")
	err := Check()
	require.ErrorContains(t, err, "GOSYM_SLOTS=\"1\"")
	require.ErrorContains(t, err, "GOSYM_THREADS=\"x\"")
	// Get gives the default for a bad value (Check has refused it).
	require.Equal(t, 4, Slots.Get())
	require.Equal(t, 3, Threads.Or(3))
}

// TestDebugMeaning: GOSYM_DEBUG is on for 1 only, as in python/gosym/_settings.py.
func TestDebugMeaning(t *testing.T) {
	for v, on := range map[string]bool{"": false, "0": false, "1": true, "yes": false} {
		t.Setenv("GOSYM_DEBUG", v)
		require.Equal(t, on, Debug.On(), "%q", v)
	}
	py, err := os.ReadFile(filepath.Join(root, "python", "gosym", "_settings.py"))
	require.NoError(t, err)
	require.Contains(t, string(py), `os.environ.get("GOSYM_DEBUG", "0") == "1"`)
}

// TestAgreed: the settings every rank must share compare equal whether the
// default is set or left unset, and a difference names the variable and
// both ranks' values.
func TestAgreed(t *testing.T) {
	t.Setenv("GOSYM_GPU_LL_MAX", "")
	mine := Agreed()
	require.NoError(t, CheckAgreed(1, mine))
	t.Setenv("GOSYM_GPU_LL_MAX", "262144") // the default, written out
	require.NoError(t, CheckAgreed(1, mine))
	require.Equal(t, string(mine), string(Agreed()))

	t.Setenv("GOSYM_GPU_LL_MAX", "4096")
	theirs := Agreed()
	t.Setenv("GOSYM_GPU_LL_MAX", "")
	err := CheckAgreed(3, theirs)
	require.Equal(t, status.Mismatch, status.CodeOf(err))
	require.EqualError(t, err, "gosym: rank 3 has GOSYM_GPU_LL_MAX=4096, this rank GOSYM_GPU_LL_MAX=262144: every rank of a group must use the same")

	// A setting this rank does not need to agree on is not compared.
	t.Setenv("GOSYM_THREADS", "3")
	require.NoError(t, CheckAgreed(1, mine))
	require.NotContains(t, string(mine), "GOSYM_THREADS")

	// Another version's announcement.
	require.Equal(t, status.Peer, status.CodeOf(CheckAgreed(2, nil)))
	require.Equal(t, status.Peer, status.CodeOf(CheckAgreed(2, append(append([]byte{}, mine...), "GOSYM"+"_NEW=1\n"...))))
}

// TestTableRows: every row is complete, and the rows the engine agrees on
// are ones it reads.
func TestTableRows(t *testing.T) {
	for _, s := range Table() {
		require.NotEmpty(t, s.Doc, s.Name)
		require.NotEmpty(t, s.Accepts, s.Name)
		require.True(t, strings.HasPrefix(s.Name, "GOSYM_"), s.Name)
		if s.Agree {
			require.Equal(t, Engine, s.Reader, s.Name)
		}
	}
}
