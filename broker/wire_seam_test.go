package broker

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// The byte-level wire checks live in broker/internal/wire and nowhere else
// (its package comment; rfcs/wire-validation.md): the framer and the check
// judge a client's bytes before the substrate decodes them, knowing nothing
// of the broker, and the broker only acts on their verdicts. This reads the
// source of both packages and names, by file and line, whatever brings a
// check back into package broker or the broker into the checks.
func TestWireSeam_ChecksStayInInternalWire(t *testing.T) {
	fset := token.NewFileSet()
	parse := func(glob string) map[string]*ast.File {
		t.Helper()
		names, err := filepath.Glob(glob)
		if err != nil {
			t.Fatal(err)
		}
		files := map[string]*ast.File{}
		for _, name := range names {
			if strings.HasSuffix(name, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, name, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			files[name] = f
		}
		if len(files) == 0 {
			t.Fatalf("no source under %s: the walk is broken", glob)
		}
		return files
	}
	broker, wire := parse("*.go"), parse(filepath.Join("internal", "wire", "*.go"))

	// 1. The checks' old files do not come back.
	for _, gone := range []string{"admission_frame.go", "wire_check.go"} {
		if broker[gone] != nil {
			t.Errorf("%s is a file of package broker again: the wire checks belong in internal/wire", gone)
		}
	}

	// 2. Package broker declares nothing internal/wire declares (a copy of
	// the framer, of the check or of one of their helpers), whatever the
	// case of its first letter.
	declared := func(files map[string]*ast.File, each func(name string, pos token.Pos)) {
		for _, f := range files {
			for _, d := range f.Decls {
				switch d := d.(type) {
				case *ast.FuncDecl:
					if d.Recv == nil {
						each(d.Name.Name, d.Pos())
					}
				case *ast.GenDecl:
					for _, sp := range d.Specs {
						switch sp := sp.(type) {
						case *ast.TypeSpec:
							each(sp.Name.Name, sp.Pos())
						case *ast.ValueSpec:
							for _, n := range sp.Names {
								each(n.Name, n.Pos())
							}
						}
					}
				}
			}
		}
	}
	fold := func(name string) string {
		r, n := utf8.DecodeRuneInString(name)
		return string(unicode.ToLower(r)) + name[n:]
	}
	wireNames := map[string]bool{}
	declared(wire, func(name string, _ token.Pos) {
		if name != "_" {
			wireNames[fold(name)] = true
		}
	})
	if len(wireNames) < 30 {
		t.Fatalf("internal/wire declares only %d names: the walk is broken", len(wireNames))
	}
	declared(broker, func(name string, pos token.Pos) {
		if wireNames[fold(name)] {
			t.Errorf("%s: package broker declares %s, which internal/wire declares: call wire's, do not copy it",
				fset.Position(pos), name)
		}
	})

	// 3. Package broker decodes no Variable Byte Integer — the Remaining
	// Length every raw MQTT packet opens with — so it parses no client
	// bytes: a byte is masked with 127 only in internal/wire.
	for _, f := range broker {
		ast.Inspect(f, func(n ast.Node) bool {
			be, ok := n.(*ast.BinaryExpr)
			if !ok || be.Op != token.AND {
				return true
			}
			for _, side := range []ast.Expr{be.X, be.Y} {
				lit, ok := side.(*ast.BasicLit)
				if !ok || lit.Kind != token.INT {
					continue
				}
				if v, err := strconv.ParseInt(lit.Value, 0, 64); err == nil && v == 127 {
					t.Errorf("%s: a byte masked with 127 decodes a Variable Byte Integer: raw MQTT is read in internal/wire",
						fset.Position(be.Pos()))
				}
			}
			return true
		})
	}

	// 4. internal/wire stands alone: the standard library and the
	// substrate's packet constants, never the broker, the substrate's
	// server or another package of ours.
	for name, f := range wire {
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			first, _, _ := strings.Cut(path, "/")
			if path != "github.com/mochi-mqtt/server/v2/packets" && strings.Contains(first, ".") {
				t.Errorf("%s imports %s: the wire checks know nothing of the broker or the substrate's server", name, path)
			}
		}
	}
}
