// Package config is gosym's one table of settings: every GOSYM_* environment
// variable, what it defaults to, what it accepts, whether every rank of a
// group must share it, and who reads it. The engine reads its settings only
// through the typed values below; Check validates them all when a group is
// created, so a bad value is an error that names the variable and what it
// accepts instead of a silent default; Agreed and CheckAgreed carry the
// settings every rank must share through the exchange at connect, so that a
// difference is named there instead of turning into a hang. docs/TUNABLES.md
// is generated from the table (go generate ./gobackend/internal/config).
package config

//go:generate go run ./cmd/tunables -o ../../../docs/TUNABLES.md

import (
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/gosym/gosym/gobackend/internal/status"
)

// Reader says which part of gosym reads a variable.
type Reader string

// The readers: only Engine settings are validated and agreed by the engine.
const (
	Engine Reader = "engine" // the Go engine (libgosym.so)
	Python Reader = "python" // python/gosym, in python/gosym/_settings.py
	Both   Reader = "engine, python"
	Build  Reader = "build" // the Makefile, setup.py and scripts/
	Tests  Reader = "tests" // the test suites only
)

// Setting is one row of the table.
type Setting struct {
	Name    string
	Default string // as a user would write it, or how it is derived
	Accepts string // what a value may be, as an error names it
	Agree   bool   // every rank of a group must use the same value
	Reader  Reader
	Doc     string
	// parse gives the canonical form of a set value, false for a value
	// outside Accepts; nil accepts anything (paths, build and test switches).
	parse func(string) (string, bool)
}

// table is every setting, in the order docs/TUNABLES.md lists them.
var table []*Setting

// Table returns a copy of the table, in its order.
func Table() []Setting {
	out := make([]Setting, len(table))
	for i, s := range table {
		out[i] = *s
	}
	return out
}

// Lookup returns the row of name.
func Lookup(name string) (Setting, bool) {
	i := slices.IndexFunc(table, func(s *Setting) bool { return s.Name == name })
	if i < 0 {
		return Setting{}, false
	}
	return *table[i], true
}

func add(s *Setting) *Setting {
	if _, dup := Lookup(s.Name); dup {
		panic("config: " + s.Name + " is in the table twice")
	}
	table = append(table, s)
	return s
}

// raw is the variable's value; "" counts as unset.
func (s *Setting) raw() string { return os.Getenv(s.Name) }

// value is the canonical form of the variable's value ("" when unset or
// when the row accepts anything), or the error Check reports.
func (s *Setting) value() (string, error) {
	v := s.raw()
	if v == "" || s.parse == nil {
		return v, nil
	}
	c, ok := s.parse(v)
	if !ok {
		return "", status.Errorf(status.InvalidArg, "gosym: %s=%q: want %s", s.Name, v, s.Accepts)
	}
	return c, nil
}

// Int is a whole-number setting from least to most.
type Int struct {
	*Setting
	def, least, most int
}

func intRow(name string, def, least, most int, defText string, agree bool, doc string) Int {
	accepts := fmt.Sprintf("a whole number from %d", least)
	if most < math.MaxInt {
		accepts = fmt.Sprintf("a whole number from %d to %d", least, most)
	}
	if defText == "" {
		defText = strconv.Itoa(def)
	}
	s := Int{def: def, least: least, most: most}
	s.Setting = add(&Setting{Name: name, Default: defText, Accepts: accepts, Agree: agree, Reader: Engine, Doc: doc,
		parse: func(v string) (string, bool) {
			n, err := strconv.Atoi(v)
			return strconv.Itoa(n), err == nil && n >= least && n <= most
		}})
	return s
}

// pyIntRow is intRow for a whole number that python/gosym reads and checks
// itself (python/gosym/_settings.py); the engine never reads it.
func pyIntRow(name string, def, least int, doc string) Int {
	s := intRow(name, def, least, math.MaxInt, "", false, doc)
	s.Reader = Python
	return s
}

// Get is the variable's value, or the default when it is unset. A bad value
// also gives the default here: Check has already refused it when the group
// was created.
func (s Int) Get() int { return s.Or(s.def) }

// Or is Get for a setting whose default the caller derives (the table says
// how).
func (s Int) Or(def int) int {
	v, err := s.value()
	if err != nil || v == "" {
		return def
	}
	n, _ := strconv.Atoi(v)
	return n
}

// Enum is a setting that takes one of a few words.
type Enum struct {
	*Setting
	def string
}

func enumRow(name, def string, values []string, agree bool, reader Reader, doc string) Enum {
	accepts := "one of " + strings.Join(values, ", ")
	return Enum{def: def, Setting: add(&Setting{Name: name, Default: def, Accepts: accepts, Agree: agree, Reader: reader, Doc: doc,
		parse: func(v string) (string, bool) { return v, slices.Contains(values, v) }})}
}

// Get is the variable's value, or the default when it is unset or bad (see
// Int.Get).
func (s Enum) Get() string {
	v, err := s.value()
	if err != nil || v == "" {
		return s.def
	}
	return v
}

// On is Get() == "1", for the switches that take 0 or 1.
func (s Enum) On() bool { return s.Get() == "1" }

// Text is a setting that takes any text (a path).
type Text struct{ *Setting }

func textRow(name, defText string, reader Reader, doc string) Text {
	return Text{add(&Setting{Name: name, Default: defText, Accepts: "any text", Reader: reader, Doc: doc})}
}

// Get is the variable's value ("" when unset).
func (s Text) Get() string { return s.raw() }

// Check validates every setting the engine reads; the error names each bad
// variable with what it accepts. Group creation calls it.
func Check() error {
	var bad []string
	for _, s := range table {
		if s.Reader != Engine && s.Reader != Both {
			continue
		}
		if _, err := s.value(); err != nil {
			bad = append(bad, err.Error())
		}
	}
	if len(bad) == 0 {
		return nil
	}
	return status.Errorf(status.InvalidArg, "%s", strings.Join(bad, "; "))
}

// Agreed encodes this rank's values of the settings every rank must share,
// for the exchange at connect: "NAME=value" lines in table order, the value
// canonical, or the table's default where it is unset (so that a rank that
// sets the default and one that leaves it unset agree).
func Agreed() []byte {
	var b strings.Builder
	for _, s := range table {
		if !s.Agree {
			continue
		}
		v, err := s.value()
		switch {
		case err != nil:
			v = "(bad value " + strconv.Quote(s.raw()) + ")"
		case v == "":
			v = s.Default
		}
		fmt.Fprintf(&b, "%s=%s\n", s.Name, v)
	}
	return []byte(b.String())
}

// CheckAgreed compares rank r's Agreed with this rank's and names the first
// setting that differs, with both values.
func CheckAgreed(r int, theirs []byte) error {
	mine, got := parseAgreed(Agreed()), parseAgreed(theirs)
	for _, kv := range mine {
		i := slices.IndexFunc(got, func(g [2]string) bool { return g[0] == kv[0] })
		if i < 0 {
			return status.Errorf(status.Peer, "gosym: rank %d does not announce %s (another gosym version?)", r, kv[0])
		}
		if got[i][1] != kv[1] {
			return status.Errorf(status.Mismatch, "gosym: rank %d has %s=%s, this rank %s=%s: every rank of a group must use the same",
				r, kv[0], got[i][1], kv[0], kv[1])
		}
	}
	if len(got) != len(mine) {
		return status.Errorf(status.Peer, "gosym: rank %d announces %d shared settings, this rank %d (another gosym version?)", r, len(got), len(mine))
	}
	return nil
}

func parseAgreed(b []byte) [][2]string {
	var out [][2]string
	for _, line := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			out = append(out, [2]string{k, v})
		}
	}
	return out
}

// Markdown is the text of docs/TUNABLES.md.
func Markdown() string {
	var b strings.Builder
	b.WriteString("<!-- Code generated by gobackend/internal/config; DO NOT EDIT. -->\n")
	b.WriteString("<!-- Refresh with: go generate ./gobackend/internal/config -->\n\n")
	b.WriteString("# Tunables\n\n")
	b.WriteString("Every `GOSYM_*` environment variable, from the table in `gobackend/internal/config`.\n")
	b.WriteString("The engine validates the variables it reads when a group is created: a value outside\n")
	b.WriteString("*Accepts* is an error naming the variable, never a silent default. Those marked\n")
	b.WriteString("*every rank* are compared at connect, and a difference names the variable and both\n")
	b.WriteString("ranks' values. An empty value counts as unset. Sizes are in bytes.\n")
	section := func(title string, keep func(*Setting) bool) {
		fmt.Fprintf(&b, "\n## %s\n\n| Variable | Default | Accepts | Every rank | Read by | What it does |\n|---|---|---|---|---|---|\n", title)
		for _, s := range table {
			if !keep(s) {
				continue
			}
			agree := ""
			if s.Agree {
				agree = "yes"
			}
			def := s.Default
			if def == "" {
				def = "unset"
			}
			fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s | %s |\n", s.Name, def, s.Accepts, agree, s.Reader, strings.ReplaceAll(s.Doc, "|", `\|`))
		}
	}
	section("Group and host data plane", func(s *Setting) bool {
		return (s.Reader == Engine || s.Reader == Both) && !strings.HasPrefix(s.Name, "GOSYM_GPU_") && !cudaPlane[s.Name]
	})
	section("CUDA data plane", func(s *Setting) bool { return strings.HasPrefix(s.Name, "GOSYM_GPU_") || cudaPlane[s.Name] })
	section("Python, build and tests", func(s *Setting) bool { return s.Reader != Engine && s.Reader != Both })
	return b.String()
}

// cudaPlane are the CUDA data plane's settings without the GPU prefix.
var cudaPlane = map[string]bool{"GOSYM_NVLS": true, "GOSYM_LIBCUDA": true, "GOSYM_NVRTC": true, "GOSYM_KERNEL_CACHE": true}
