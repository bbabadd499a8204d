package broker

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// rfcs/bounds.md is invariant 13's table: what grows with client input,
// the key or constant that bounds it, and what a client gets at the bound.
// These tests keep it from naming keys or code that do not exist.

// boundsFacts is what a row of the table is checked against.
type boundsFacts struct {
	configDoc  []string        // docs/configuration.md, by line
	configKeys map[string]bool // every string literal of broker/config's source
	members    map[string]bool // Type.member and package-level names of this package
	consts     map[string]bool // this package's constants
}

func loadBoundsFacts(t *testing.T) boundsFacts {
	t.Helper()
	doc, err := os.ReadFile("../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	f := boundsFacts{
		configDoc:  strings.Split(string(doc), "\n"),
		configKeys: map[string]bool{},
		members:    map[string]bool{},
		consts:     map[string]bool{},
	}
	names, _ := filepath.Glob("config/*.go")
	fset := token.NewFileSet()
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if s, err := strconv.Unquote(lit.Value); err == nil {
					f.configKeys[s] = true
				}
			}
			return true
		})
	}
	if !f.configKeys["session_queue_bytes"] {
		t.Fatal("broker/config's keys were not read")
	}
	// The byte-level checks live in broker/internal/wire: their names are
	// written wire.X in the table.
	files := map[string][]*ast.File{}
	for _, file := range loadDocSource(t).files {
		files[""] = append(files[""], file)
	}
	wireNames, _ := filepath.Glob("internal/wire/*.go")
	for _, name := range wireNames {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files["wire."] = append(files["wire."], file)
	}
	if len(files["wire."]) == 0 {
		t.Fatal("broker/internal/wire's files were not read")
	}
	for prefix, pkgFiles := range files {
		f.addDecls(prefix, pkgFiles)
	}
	return f
}

// addDecls records the functions, methods, types, fields, variables and
// constants the files declare, each name after prefix.
func (f boundsFacts) addDecls(prefix string, files []*ast.File) {
	for _, file := range files {
		for _, d := range file.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				f.members[prefix+funcName(d)] = true
			case *ast.GenDecl:
				for _, sp := range d.Specs {
					switch sp := sp.(type) {
					case *ast.ValueSpec:
						for _, n := range sp.Names {
							f.members[prefix+n.Name] = true
							f.consts[prefix+n.Name] = f.consts[prefix+n.Name] || d.Tok == token.CONST
						}
					case *ast.TypeSpec:
						f.members[prefix+sp.Name.Name] = true
						if st, ok := sp.Type.(*ast.StructType); ok {
							for _, fl := range st.Fields.List {
								for _, n := range fl.Names {
									f.members[prefix+sp.Name.Name+"."+n.Name] = true
								}
							}
						}
					}
				}
			}
		}
	}
}

var backticked = regexp.MustCompile("`([^`]+)`")

// documented says why key (broker.limits.x, channels.<name>.x) is not a
// configuration key, or "": docs/configuration.md documents its last part
// in the table under the heading of its nearest enclosing block, and the
// loader reads it by that name.
func (f boundsFacts) documented(key string) string {
	var parts []string
	for _, p := range strings.Split(key, ".") {
		if p != "<name>" {
			parts = append(parts, p)
		}
	}
	if len(parts) < 2 {
		return key + " is not a dotted configuration key"
	}
	leaf := parts[len(parts)-1]
	if !f.configKeys[leaf] {
		return "broker/config never reads a key " + strconv.Quote(leaf)
	}
	for n := len(parts) - 1; n >= 1; n-- {
		block := strings.Join(parts[:n], ".")
		heading := regexp.MustCompile("^#+ `" + regexp.QuoteMeta(block) + "`")
		for i, line := range f.configDoc {
			if !heading.MatchString(line) {
				continue
			}
			for _, row := range f.configDoc[i+1:] {
				if strings.HasPrefix(row, "#") {
					break
				}
				cells := strings.Split(row, "|")
				if len(cells) > 2 && strings.Contains(cells[1], "`"+leaf+"`") {
					return ""
				}
			}
			return "docs/configuration.md's " + block + " section has no row for " + leaf
		}
	}
	return "docs/configuration.md has no section for " + key
}

// checkRow lists what is wrong with one row of the table.
func (f boundsFacts) checkRow(row string) []string {
	cells := strings.Split(row, "|")
	if len(cells) != 6 {
		return []string{"not four columns: " + row}
	}
	what, keptBy, bound := strings.TrimSpace(cells[1]), cells[2], cells[3]
	var bad []string
	code := backticked.FindAllStringSubmatch(keptBy, -1)
	if len(code) == 0 {
		bad = append(bad, what+": names no code keeping it")
	}
	for _, m := range code {
		if !f.members[m[1]] {
			bad = append(bad, what+": the broker package declares no "+m[1])
		}
	}
	bounds := 0
	for _, m := range regexp.MustCompile("(fixed )?`([^`]+)`").FindAllStringSubmatch(bound, -1) {
		bounds++
		if m[1] != "" {
			if !f.consts[m[2]] {
				bad = append(bad, what+": the broker package declares no constant "+m[2])
			}
			continue
		}
		if why := f.documented(m[2]); why != "" {
			bad = append(bad, what+": "+why)
		}
	}
	if bounds == 0 {
		bad = append(bad, what+": names no key or constant bounding it")
	}
	return bad
}

func TestInvariant13_AccumulatorTableNamesRealKeys(t *testing.T) {
	facts := loadBoundsFacts(t)
	page, err := os.ReadFile("../rfcs/bounds.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := 0
	for _, line := range strings.Split(string(page), "\n") {
		if !strings.HasPrefix(line, "| ") || strings.HasPrefix(line, "| Accumulator ") {
			continue
		}
		rows++
		for _, bad := range facts.checkRow(line) {
			t.Errorf("rfcs/bounds.md: %s", bad)
		}
	}
	if rows < 15 {
		t.Fatalf("read %d rows of rfcs/bounds.md: the table is not being read", rows)
	}

	// The negative cases: the same check refuses a key nobody reads, one
	// read but documented in another section, code that is not there and
	// a constant that is not one.
	for _, c := range []struct{ row, want string }{
		{"| x | `outbox.enqueue` | `broker.limits.max_widgets` | y |", `never reads a key "max_widgets"`},
		{"| x | `outbox.enqueue` | `broker.qos2.session_queue_bytes` | y |", "broker.qos2 section has no row for session_queue_bytes"},
		{"| x | `outbox.enqueueAll` | `broker.limits.session_queue_bytes` | y |", "declares no outbox.enqueueAll"},
		{"| x | `outbox.enqueue` | fixed `outbox` | y |", "declares no constant outbox"},
		{"| x | `outbox.enqueue` | the client | y |", "names no key or constant"},
	} {
		got := strings.Join(facts.checkRow(c.row), "; ")
		if !strings.Contains(got, c.want) {
			t.Errorf("row %s: got %q, want it to say %q", c.row, got, c.want)
		}
	}
	if got := facts.checkRow("| x | `outbox.enqueue` | `broker.limits.session_queue_bytes` | y |"); len(got) != 0 {
		t.Errorf("a good row is refused: %v", got)
	}
}
