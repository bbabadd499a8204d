// Command archway decides, once for a test run, how this host runs each
// GOARCH named on its command line, and prints one line per GOARCH:
//
//	386 native
//	arm /usr/bin/qemu-arm 10.0.2
//
// make test-32 reads it, exports SAGUIN_RUN_<GOARCH> for every process of
// the run, and says in the test output which way each set ran. Where no
// way runs a GOARCH it exits 1 naming the package to install.
package main

import (
	"fmt"
	"os"

	"saguin.dev/storage/storagetest/emulate"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: archway GOARCH...")
		os.Exit(2)
	}
	failed := false
	for _, arch := range os.Args[1:] {
		w, err := emulate.For(arch)
		if err != nil {
			fmt.Fprintf(os.Stderr, "archway: %s: %v\n", arch, err)
			failed = true
			continue
		}
		if w.Native() {
			fmt.Printf("%s native\n", arch)
		} else {
			fmt.Printf("%s %s %s\n", arch, w.Emulator, w.Version)
		}
	}
	if failed {
		os.Exit(1)
	}
}
