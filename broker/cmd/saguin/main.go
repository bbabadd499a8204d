// Command saguin runs the Sagüin broker.
//
//	saguin --config FILE         run on a configuration file
//	saguin --check-config FILE   validate a configuration, report every finding, exit
//	saguin --acl FILE [USER [CLIENT-ID]] [--json]
//	                             explain what a user may do under FILE's acl_file
//	saguin --version             print the name, version and revision
//	saguin --passwd list|add|delete|scope FILE ...   edit a password file (passwd.go)
//	saguin --help                print the usage
//
// SIGINT and SIGTERM shut down gracefully (positions stored, memory snapshots
// written, the pid file removed); SIGUSR1 re-reads broker.log_level, the ws
// doors' origins, the password files (the operators' too), the ACL and the
// TLS doors' certificate files (the operations doors' too); SIGHUP
// is caught and ignored (there is no configuration reload). SIGKILL is the
// crash the durability rules are written for. rfcs/process.md says why.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"text/tabwriter"

	"saguin.dev/bridge"
	"saguin.dev/broker"
	"saguin.dev/broker/config"
	"saguin.dev/broker/internal/faults"
	"saguin.dev/broker/internal/logging"
)

// version is this build's release version: no release has been made yet.
// The build string is version+revision (docs/operations.md "A start").
const version = "0.1.0-dev"

// revision is set by the Makefile (-ldflags -X main.revision=...).
var revision string

// stdin is where the list forms (--route and --acl with no operand) read; a test
// replaces it.
var stdin io.Reader = os.Stdin

const usageLine = "usage: saguin --config FILE | --check-config FILE | --route FILE [TOPIC|FILTER] [--json] | --acl FILE [USER [CLIENT-ID]] [--json] | --passwd ... | --version | --help"

const usageText = usageLine + `

Sagüin, a single-node MQTT 5 and 3.1.1 broker with durable channels.

  --config FILE         run the broker on FILE (required to run; no file is
                        ever read implicitly)
  --check-config FILE   check FILE and every file it names without starting
                        anything; print every finding as file:line: key
                        "value": fix, and the warnings; exit 0 when it is
                        valid, 1 when not. Not together with --config.
  --route FILE [TOPIC|FILTER]
                        where a topic lands (its channel and the filter that
                        claims it), or how a subscription filter is served
                        by each channel it reaches (replayed, current,
                        excluded, live-shared, live, worker, refused-0xNN),
                        then the routing table, most exact filter first.
                        With no operand, one topic or filter per line is
                        read from stdin and four tab-separated columns
                        printed per row ("-" where nothing applies).
  --acl FILE [USER [CLIENT-ID]]
                        explain what USER may do under FILE's acl_file: the
                        pattern that applies and those it shadows, whether
                        CLIENT-ID may use the name, each grant of its roles,
                        its publish limits; tab-separated rows of user, role,
                        kind, subject, verbs, rate, bytes. Without USER, one
                        name per line on stdin. Starts nothing.
  --json                with --route or --acl: one JSON object per row (--route,
                        null for "-") or per name (--acl) instead
  --passwd list FILE | add FILE USER [PASSWORD] | delete FILE USER |
           scope FILE USER ROUTES|all
                        edit a Mosquitto-format password file and exit;
                        add asks twice for the password (echo off) when it
                        is not given, or reads one line from a pipe. Reads
                        no configuration, so not with --config.
  --version             print the name, version and revision, and exit
  --help                print this help, and exit

Signals:
  SIGINT, SIGTERM   shut down gracefully: positions stored, memory snapshots
                    written, the pid file removed
  SIGUSR1           re-read broker.log_level and the ws doors' origins from
                    the configuration file, every password file (MQTT and
                    operator) and the ACL file (all or nothing), and every
                    TLS door's certificate, key and client CA files (MQTT
                    and operations doors)
  SIGHUP            ignored (logged): there is no configuration reload

A flag is written with one dash or two. There are no subcommands.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("saguin", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // the usage is ours, on the stream the case asks for
	cfgPath := fs.String("config", "", "")
	checkPath := fs.String("check-config", "", "")
	showVersion := fs.Bool("version", false, "")
	routePath := fs.String("route", "", "")
	aclConfig := fs.String("acl", "", "")
	asJSON := fs.Bool("json", false, "")
	editPasswords := fs.Bool("passwd", false, "")
	usageError := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "saguin: "+format+"\n%s\n", append(a, usageLine)...)
		return 2
	}
	operands, err := parseInterleaved(fs, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, usageText)
			return 0
		}
		return usageError("%v", err)
	}
	if *showVersion {
		fmt.Fprintf(stdout, "Sagüin — single-node MQTT 5 and 3.1.1 broker with durable channels\nversion %s, revision %s\nbuild %s\n",
			version, buildRevision(), buildString())
		return 0
	}
	if *asJSON && *routePath == "" && *aclConfig == "" {
		return usageError("--json goes with --route or --acl: it writes that command's rows as JSON lines")
	}
	if *routePath != "" && *aclConfig != "" {
		return usageError("--route and --acl are given together; give one of them")
	}
	if *editPasswords {
		return runPasswd(operands, *cfgPath != "" || *checkPath != "" || *routePath != "", os.Stdin, stdout, stderr)
	}
	if *routePath != "" {
		if *cfgPath != "" || *checkPath != "" {
			return usageError("--route reads its own configuration operand; give it without --config or --check-config")
		}
		return routeCommand(*routePath, operands, *asJSON, stdin, stdout, stderr)
	}
	if *aclConfig != "" {
		return explainACL(fs, operands, *aclConfig, *asJSON, stdin, stdout, stderr)
	}
	if len(operands) > 0 {
		return usageError("unexpected argument %q: saguin takes flags only, there are no subcommands", operands[0])
	}
	if *checkPath != "" && *cfgPath != "" {
		return usageError("--check-config and --config are given together: --check-config only checks a file and starts nothing; give one of them")
	}
	if *checkPath != "" {
		return checkConfig(*checkPath, stdout, stderr)
	}
	if *cfgPath == "" {
		// docs/operations.md "The command line": a missing --config is a message and exit 1.
		fmt.Fprintf(stderr, "saguin: --config FILE is required (the configuration is never read implicitly)\n%s\n", usageLine)
		return 1
	}
	return serve(*cfgPath, stdout, stderr)
}

// load reads a configuration with every check of this build in one pass.
func load(path string) (*config.Config, error) {
	return config.Load(path, broker.ConfigChecks()...)
}

// printInvalid writes a configuration's findings to stderr as
// docs/operations.md "Logs" says: "configuration is invalid:" and the findings.
func printInvalid(stderr io.Writer, err error) {
	fmt.Fprintf(stderr, "configuration is invalid: %v\n", err)
	var fs *config.Findings
	if errors.As(err, &fs) {
		for _, w := range fs.Warnings {
			fmt.Fprintf(stderr, "warning: %s\n", w)
		}
	}
}

// checkConfig is --check-config: every finding, the warnings, and the
// channels the file defines. It opens no socket and no storage.
func checkConfig(path string, stdout, stderr io.Writer) int {
	cfg, err := load(path)
	if err != nil {
		printInvalid(stderr, err)
		return 1
	}
	fmt.Fprintf(stdout, "%s: ok\n", path)
	for _, w := range cfg.Warnings {
		fmt.Fprintf(stdout, "warning: %s\n", w)
	}
	if len(cfg.Channels) > 0 {
		fmt.Fprintln(stdout, "channels:")
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		for _, c := range cfg.Channels { // sorted by name
			filter := c.FilterAsWritten
			if c.DeadLetterOf != "" {
				filter = "(dead letters of " + c.DeadLetterOf + ")"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\tstorage %s\n", c.Name, c.Type, filter, c.Storage)
		}
		_ = tw.Flush()
	}
	printBridges(stdout, cfg)
	return 0
}

// printBridges lists each bridge's rules and where their records land
// here: the channels (with their types) the rule's names reach, and
// broadcast where no channel claims some of them (docs/bridge.md).
func printBridges(w io.Writer, cfg *config.Config) {
	if len(cfg.Bridges) == 0 {
		return
	}
	fmt.Fprintln(w, "bridges:")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, b := range cfg.Bridges {
		for _, r := range b.Rules {
			chans, broadcast := cfg.Resolver().Reach(r.Reach())
			var lands []string
			for _, name := range chans {
				if c, ok := cfg.Channel(name); ok {
					lands = append(lands, name+" ("+c.Type+")")
				}
			}
			if broadcast {
				lands = append(lands, "broadcast")
			}
			tmpl := r.Template
			if tmpl == "" {
				tmpl = r.Filter
			}
			way := "in from"
			if r.Direction != bridge.In {
				way = r.Direction.String() + " with"
			}
			fmt.Fprintf(tw, "  %s\t%s %s\t%s -> %s\tlands in %s\n", b.Name, way, b.Peer, r.Filter, tmpl, strings.Join(lands, ", "))
		}
	}
	_ = tw.Flush()
}

// newLogger is the process's one log: log/slog key=value lines on w, at
// level (info until the configuration is read; SIGUSR1 changes it).
func newLogger(w io.Writer, level *slog.LevelVar) *slog.Logger {
	return logging.New(w, level)
}

func serve(path string, stdout, stderr io.Writer) int {
	cfg, err := load(path)
	if err != nil {
		printInvalid(stderr, err)
		return 1
	}
	level := new(slog.LevelVar)
	level.Set(logLevel(cfg.Broker.LogLevel))
	logger := newLogger(stdout, level)
	// The substrate and any library that logs through the default logger
	// land in the same stream (docs/operations.md "Logs": one stream).
	slog.SetDefault(logger)
	log := logger.With("broker", cfg.Broker.ID)

	// docs/operations.md "Signals": every handler is installed before anything is
	// opened — before any listener serves and before the pid file — so a
	// signal during start-up still ends through Close, and a HUP never
	// takes the Go default (exit without a snapshot).
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGUSR1)
	defer signal.Stop(sigs)

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

	b, err := broker.New(cfg, broker.Options{Build: buildRevision(), Version: buildString(), Logger: logger, SQLiteFaults: fset.SQLite, PanicTopic: fset.PanicTopic})
	if err != nil {
		log.Error("start failed", "error", err)
		return 1
	}
	if err := b.Start(); err != nil {
		log.Error("start failed", "error", err)
		_ = b.Close()
		return 1
	}
	for sig := range sigs {
		switch sig {
		case syscall.SIGHUP:
			log.Warn("SIGHUP ignored: there is no configuration reload; SIGUSR1 re-reads broker.log_level, the ws origins, the password files, the ACL and the TLS certificates, and a restart applies any other change")
			continue
		case syscall.SIGUSR1:
			if cfg := rereadLogLevel(path, level, log); cfg != nil {
				b.ReloadOrigins(cfg) // ws doors' same_origin, allowed_origins
			}
			_ = b.ReloadAuthority()    // every MQTT and operator password file and the ACL, all or nothing; it logs what each holds
			_ = b.ReloadCertificates() // every TLS door's files, operations doors too, all or nothing; it logs each door
			continue
		}
		log.Info("shutting down", "signal", sig.String())
		break
	}
	if err := b.Close(); err != nil {
		log.Error("shutdown failed", "error", err)
		return 1
	}
	return 0
}

// maxReloadFindings bounds how many findings one SIGUSR1 logs; the rest
// are counted (--check-config shows them all).
const maxReloadFindings = 20

// rereadLogLevel is SIGUSR1 (docs/operations.md "Signals" item 1): the configuration
// file is read again for broker.log_level alone. A file that no longer
// loads changes nothing — its findings are logged and the broker runs on
// at the level it had. The change is announced at the stricter of the two
// levels, so it is seen whichever way the level moved.
func rereadLogLevel(path string, level *slog.LevelVar, log *slog.Logger) *config.Config {
	cfg, err := load(path)
	if err != nil {
		var fs *config.Findings
		if !errors.As(err, &fs) {
			log.Error("SIGUSR1: the configuration file cannot be read; nothing re-read", "path", path, "error", err)
			return nil
		}
		log.Error("SIGUSR1: the configuration file has findings; nothing re-read, the log level stays",
			"path", path, "level", levelName(level.Level()), "findings", len(fs.List))
		for i, f := range fs.List {
			if i == maxReloadFindings {
				log.Error("SIGUSR1: further findings not logged; run saguin --check-config to see them all", "more", len(fs.List)-i)
				break
			}
			log.Error("configuration finding", f.Attrs()...)
		}
		return nil
	}
	was, now := level.Level(), logLevel(cfg.Broker.LogLevel)
	level.Set(now)
	log.Log(context.Background(), max(was, now), "SIGUSR1: log level re-read",
		"was", levelName(was), "now", levelName(now),
		"startup_only", "listeners, storage, channels and every other key but ws origins are read only at start; restart the broker to apply them")
	return cfg
}

func logLevel(s string) slog.Level { return logging.LevelOf(s) }

// levelName is a level as broker.log_level writes it.
func levelName(l slog.Level) string {
	switch {
	case l <= slog.LevelDebug:
		return "debug"
	case l <= slog.LevelInfo:
		return "info"
	case l <= slog.LevelWarn:
		return "warn"
	}
	return "error"
}

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

// buildString is the version and the revision (docs/operations.md "A start":
// version+revision, -dirty when built from a modified tree).
func buildString() string {
	s := version + "+" + buildRevision()
	if info, ok := debug.ReadBuildInfo(); ok && revision == "" {
		for _, kv := range info.Settings {
			if kv.Key == "vcs.modified" && kv.Value == "true" {
				s += "-dirty"
			}
		}
	}
	return s
}

// parseInterleaved parses flags that may follow operands (docs/operations.md "The command line": "operands may precede later flags"): the flag package stops at the
// first operand, so the rest is parsed again after it. "--" ends the
// flags; everything after it is an operand.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var operands []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return operands, nil
		}
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			return append(operands, rest...), nil
		}
		operands = append(operands, rest[0])
		args = rest[1:]
	}
}
