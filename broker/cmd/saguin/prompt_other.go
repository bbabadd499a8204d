//go:build !linux

package main

import (
	"errors"
	"io"
	"os"
)

// terminal: only Linux's terminal settings are driven here, so any
// character device is taken for a terminal and refused by readHidden
// rather than read with echo on.
func terminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

func readHidden(*os.File, string, io.Writer) ([]byte, error) {
	return nil, errors.New("prompting with echo off is implemented for Linux only; give the password on a pipe (echo ... | saguin --passwd add FILE USER)")
}
