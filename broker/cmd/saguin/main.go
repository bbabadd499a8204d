// Command saguin runs the Sagüin broker.
//
//	saguin --config FILE         run on a configuration file
//	saguin --check-config FILE   validate a configuration, report every finding, exit
//
// SIGINT and SIGTERM shut down gracefully (positions stored, memory snapshots
// written); SIGKILL is the crash the durability rules are written for.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"

	"saguin.dev/broker"
	"saguin.dev/broker/config"
	"saguin.dev/broker/internal/faults"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("saguin", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "configuration file (YAML); required")
	checkPath := fs.String("check-config", "", "validate this configuration file, report every finding and exit")
	version := fs.Bool("version", false, "print the build revision and exit")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *version {
		fmt.Fprintln(stdout, buildRevision())
		return 0
	}
	if *checkPath != "" {
		cfg, err := config.Load(*checkPath)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		// What the file may say but this build does not enforce fails the
		// check too: a start would refuse it.
		if err := broker.Unserved(cfg); err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", *checkPath, err)
			return 1
		}
		fmt.Fprintf(stdout, "%s: configuration is valid\n", *checkPath)
		return 0
	}
	if *cfgPath == "" {
		fmt.Fprintln(stderr, "saguin: --config FILE is required (the configuration is never read implicitly)")
		return 2
	}
	cfg, err := config.Load(*cfgPath)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}

	// Signal handlers go in before anything is opened, so a signal during
	// start-up still shuts down through Close.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)

	// Only a build tagged saguinfaults reads the variable (broker/internal/
	// faults); in any other build this is a no-op.
	fset, err := faults.FromEnv(os.Getenv)
	if err != nil {
		fmt.Fprintf(stderr, "saguin: %v\n", err)
		return 1
	}
	if fset.Active() {
		// The chaos harness looks for this line: a control that believes
		// the broker broken must be running a broker that is.
		fmt.Fprintf(stderr, "saguin: fault injection active: %s (a deliberately broken build; never run it in production)\n",
			strings.Join(fset.Names, ","))
	}

	b, err := broker.New(cfg, broker.Options{Build: buildRevision(), SQLiteFaults: fset.SQLite, PanicTopic: fset.PanicTopic})
	if err != nil {
		fmt.Fprintf(stderr, "saguin: %v\n", err)
		return 1
	}
	if err := b.Start(); err != nil {
		fmt.Fprintf(stderr, "saguin: %v\n", err)
		_ = b.Close()
		return 1
	}
	sig := <-sigs
	fmt.Fprintf(stdout, "saguin: %s received, shutting down\n", sig)
	if err := b.Close(); err != nil {
		fmt.Fprintf(stderr, "saguin: shutdown: %v\n", err)
		return 1
	}
	return 0
}

// revision is set by the Makefile (-ldflags -X main.revision=...).
var revision string

// buildRevision is the VCS revision the binary was built from, written into
// snapshot headers so a refused snapshot names the build that wrote it.
func buildRevision() string {
	if revision != "" {
		return revision
	}
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				return s.Value[:12]
			}
		}
		if info.Main.Version != "" && info.Main.Version != "(devel)" {
			return info.Main.Version
		}
	}
	return "devel"
}
