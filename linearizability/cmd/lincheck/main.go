// Command lincheck checks a JSON-lines history (see the module README) against
// Sagüin's porcupine models and, when it fails, writes porcupine's HTML
// visualisation of the failing partitions.
//
//	lincheck [-model append|queue|latest] [-html out.html] [-dense=true]
//	         [-resolution=true] [-timeout 0] history.jsonl
//
// Exit status: 0 passed; 1 a violation; 2 bad input; 3 inconclusive (the
// search ran out of -timeout).
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/anishathalye/porcupine"

	"saguin.dev/linearizability"
)

const (
	exitOK           = 0
	exitViolation    = 1
	exitBadInput     = 2
	exitInconclusive = 3
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("lincheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	model := fs.String("model", "", "model to check: append, queue or latest (default: every model whose operations appear)")
	htmlPath := fs.String("html", "", "where to write the visualisation on failure (default: <history>.html)")
	dense := fs.Bool("dense", true, "append reads on one connection must step by one offset (false where retention, partitioning or No Local skip records)")
	resolution := fs.Bool("resolution", true, "every acknowledged queue job must end acked or dead-lettered (needs a history that ends with a drain)")
	timeout := fs.Duration("timeout", 0, "bound on the linearizability search (0 = none); running out exits 3")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: lincheck [flags] history.jsonl")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return exitBadInput
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return exitBadInput
	}
	path := fs.Arg(0)
	f, err := os.Open(path)
	if err != nil {
		fmt.Fprintf(stderr, "lincheck: %v\n", err)
		return exitBadInput
	}
	ops, err := linearizability.Read(f)
	f.Close()
	if err != nil {
		fmt.Fprintf(stderr, "lincheck: %s: %v\n", path, err)
		return exitBadInput
	}
	kinds := linearizability.Present(ops)
	if *model != "" {
		k := linearizability.Kind(*model)
		if _, err := linearizability.Model(k); err != nil {
			fmt.Fprintf(stderr, "lincheck: %v\n", err)
			return exitBadInput
		}
		kinds = []linearizability.Kind{k}
	}
	if len(kinds) == 0 {
		fmt.Fprintf(stderr, "lincheck: %s: no operations of any model\n", path)
		return exitBadInput
	}
	out := *htmlPath
	if out == "" {
		out = strings.TrimSuffix(path, ".jsonl") + ".html"
	}
	opt := linearizability.Options{Timeout: *timeout, Dense: *dense, Resolution: *resolution}
	code := exitOK
	var failed []*linearizability.Report
	for _, k := range kinds {
		rep, err := linearizability.Check(ops, k, opt)
		if err != nil {
			// Check fails only on the history's content (ErrBadHistory).
			fmt.Fprintf(stderr, "lincheck: %s: %v\n", path, err)
			return exitBadInput
		}
		if rep.Operations == 0 {
			// Only reachable with -model: a check of nothing must not
			// pass, or a harness recording the wrong ops would go green.
			fmt.Fprintf(stderr, "lincheck: %s: no %s operations to check\n", path, k)
			return exitBadInput
		}
		fmt.Fprintf(stdout, "%s: %s, %d operations in %d partitions, %d violations\n",
			k, rep.Result, rep.Operations, rep.Partitions, len(rep.Violations))
		for _, p := range rep.Failed {
			fmt.Fprintf(stdout, "  not linearizable: %s\n", p)
		}
		for _, v := range rep.Violations {
			fmt.Fprintf(stdout, "  %s\n", v)
		}
		switch {
		case rep.Result == porcupine.Illegal || len(rep.Violations) > 0:
			code = exitViolation
			if rep.HasVisualization() {
				failed = append(failed, rep)
			}
		case rep.Result == porcupine.Unknown && code == exitOK:
			code = exitInconclusive
		}
	}
	for i, rep := range failed {
		p := out
		if len(failed) > 1 || i > 0 {
			p = strings.TrimSuffix(out, ".html") + "." + string(rep.Kind) + ".html"
		}
		if err := writeHTML(p, rep); err != nil {
			fmt.Fprintf(stderr, "lincheck: %v\n", err)
			continue
		}
		fmt.Fprintf(stdout, "visualisation of %s written to %s\n", rep.Kind, p)
	}
	return code
}

func writeHTML(path string, rep *linearizability.Report) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("create visualisation: %w", err)
	}
	if err := rep.WriteHTML(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write visualisation %s: %w", path, err)
	}
	return nil
}
