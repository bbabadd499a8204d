//go:build linux && (386 || arm || mips || mipsle)

package harness

import (
	"errors"
	"io"
)

// errNoPowerCuts says why this build has no powercut nemesis: faultfs needs
// go-fuse, which does not compile for 32-bit Linux (chaos/faultfs). Every
// other nemesis works, and a 64-bit harness can cut the power under a
// 32-bit broker given with -binary.
var errNoPowerCuts = errors.New("the powercut nemesis needs faultfs, which this 32-bit build of the harness lacks (go-fuse does not compile for 32-bit Linux); run the harness from a 64-bit build, with -binary naming a 32-bit broker if that is what is under test")

func checkPowerCuts() error { return errNoPowerCuts }

// mountDisk is never reached: Options refuses the powercut nemesis first.
func mountDisk(_, _ string, _ io.Writer) (powerDisk, error) { return nil, errNoPowerCuts }
