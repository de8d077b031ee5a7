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

// Warnf writes one line, prefixed "gosym: warning: ", whatever GOSYM_DEBUG
// says: for what a user must hear of (memory left mapped under a kernel
// that never ended).
func Warnf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "gosym: warning: "+format+"\n", args...)
}
