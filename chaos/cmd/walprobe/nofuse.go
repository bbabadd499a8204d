//go:build linux && (386 || arm || mips || mipsle)

package main

import (
	"fmt"
	"os"
)

// The probe needs faultfs, which needs go-fuse, and go-fuse does not
// compile for 32-bit Linux (as the harness's disk_nofuse.go says).
func main() {
	fmt.Fprintln(os.Stderr, "walprobe: needs faultfs, which this build target does not have")
	os.Exit(2)
}
