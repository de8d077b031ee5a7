// Package dlog is gosym's debug log: lines on stderr while GOSYM_DEBUG is
// on, nothing otherwise (read once, like every setting).
package dlog

import (
	"fmt"
	"os"

	"github.com/gosym/gosym/gobackend/internal/config"
)

// On says whether GOSYM_DEBUG is on.
var On = config.Debug.On()

// Printf writes one line, prefixed "gosym: ", while On.
func Printf(format string, args ...any) {
	if On {
		fmt.Fprintf(os.Stderr, "gosym: "+format+"\n", args...)
	}
}
