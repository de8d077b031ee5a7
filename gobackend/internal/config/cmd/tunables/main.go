// Command tunables writes docs/TUNABLES.md from the settings table (run by
// go generate ./gobackend/internal/config).
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/gosym/gosym/gobackend/internal/config"
)

func main() {
	out := flag.String("o", "", "file to write (default: stdout)")
	flag.Parse()
	if *out == "" {
		fmt.Print(config.Markdown())
		return
	}
	if err := os.WriteFile(*out, []byte(config.Markdown()), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "tunables:", err)
		os.Exit(1)
	}
}
