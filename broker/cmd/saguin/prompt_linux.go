package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"

	"saguin.dev/broker/passwd"
)

// terminal says whether f is a terminal (it has terminal attributes).
func terminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// readHidden reads one line from the terminal tty with echo off. Echo is
// turned off before the prompt is written, so nothing typed after the
// prompt appears — not even by a fast typist or a paste. Echo is restored
// on return, and also when the prompt is interrupted (Ctrl-C, SIGTERM,
// SIGHUP): the process then ends with exit 130, leaving the terminal as it
// found it rather than silent.
func readHidden(tty *os.File, prompt string, out io.Writer) ([]byte, error) {
	fd := int(tty.Fd())
	was, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		return nil, fmt.Errorf("reading the terminal's settings: %w", err)
	}
	quiet := *was
	quiet.Lflag &^= unix.ECHO | unix.ECHONL
	quiet.Lflag |= unix.ICANON | unix.ISIG // a line at a time; Ctrl-C still interrupts
	if err := unix.IoctlSetTermios(fd, unix.TCSETS, &quiet); err != nil {
		return nil, fmt.Errorf("turning echo off: %w", err)
	}
	restore := func() { _ = unix.IoctlSetTermios(fd, unix.TCSETS, was) }

	interrupted := make(chan os.Signal, 1)
	signal.Notify(interrupted, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() { // owned by this call: ends when it returns, or ends the process
		defer close(exited)
		select {
		case <-interrupted:
			restore()
			fmt.Fprintln(out)
			os.Exit(130)
		case <-done:
		}
	}()
	defer func() {
		signal.Stop(interrupted)
		close(done)
		<-exited
		restore()
	}()

	fmt.Fprint(out, prompt)
	line, err := readTerminalLine(tty)
	fmt.Fprintln(out) // the Enter the terminal did not echo
	return line, err
}

// readTerminalLine reads up to the end of a line: in canonical mode each
// read returns at most one line. At most passwd.MaxPassword bytes are
// kept.
func readTerminalLine(tty *os.File) ([]byte, error) {
	var line []byte
	buf := make([]byte, 4096)
	for {
		n, err := tty.Read(buf)
		line = append(line, buf[:n]...)
		if len(line) > passwd.MaxPassword+2 {
			return nil, fmt.Errorf("the password is longer than %d bytes, the most MQTT carries; nothing written", passwd.MaxPassword)
		}
		if n > 0 && line[len(line)-1] == '\n' {
			line = line[:len(line)-1]
			if len(line) > 0 && line[len(line)-1] == '\r' {
				line = line[:len(line)-1]
			}
			return line, nil
		}
		if errors.Is(err, io.EOF) || (err == nil && n == 0) {
			return nil, errors.New("no password given (end of input); nothing written")
		}
		if err != nil {
			return nil, fmt.Errorf("reading the password: %w", err)
		}
	}
}
