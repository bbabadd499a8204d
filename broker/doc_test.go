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

// The map in doc.go is held to the code: a goroutine started, a mutex
// added, a marker of an invariant written or a file renamed without the map
// following fails here.

// docSource is the package's non-test files, parsed, and doc.go's package
// comment as go doc shows it.
type docSource struct {
	fset  *token.FileSet
	files map[string]*ast.File
	doc   string
}

func loadDocSource(t *testing.T) docSource {
	t.Helper()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	src := docSource{fset: token.NewFileSet(), files: map[string]*ast.File{}}
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(src.fset, name, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		src.files[name] = f
	}
	d := src.files["doc.go"]
	if d == nil || d.Doc == nil {
		t.Fatal("doc.go has no package comment")
	}
	src.doc = d.Doc.Text()
	return src
}

// section is the text under "# title" up to the next heading.
func (s docSource) section(t *testing.T, title string) string {
	t.Helper()
	_, rest, ok := strings.Cut(s.doc, "\n# "+title+"\n")
	if !ok {
		t.Fatalf("doc.go has no section %q", title)
	}
	if i := strings.Index(rest, "\n# "); i >= 0 {
		rest = rest[:i]
	}
	return rest
}

func mentions(text, name string) bool {
	return regexp.MustCompile(`(^|[^A-Za-z0-9_.])` + regexp.QuoteMeta(name) + `($|[^A-Za-z0-9_])`).MatchString(text)
}

// funcName is how the map names a function: Type.method or its name.
func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	t := fd.Recv.List[0].Type
	if st, ok := t.(*ast.StarExpr); ok {
		t = st.X
	}
	if ix, ok := t.(*ast.IndexExpr); ok {
		t = ix.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name + "." + fd.Name.Name
	}
	return fd.Name.Name
}

func TestDocMapNamesFilesThatExist(t *testing.T) {
	src := loadDocSource(t)
	seen := map[string]bool{}
	for _, m := range regexp.MustCompile(`\b[a-z0-9_]+\.go\b`).FindAllString(src.doc, -1) {
		if seen[m] {
			continue
		}
		seen[m] = true
		if _, err := os.Stat(m); err != nil {
			t.Errorf("doc.go names %s, which is not a file of the package", m)
		}
	}
	if len(seen) < 20 {
		t.Fatalf("doc.go names only %d files: the map is not being read", len(seen))
	}
}

// Every Type.name the map writes, for a type of this package, is a method
// or a field of it: a rename does not leave the map pointing nowhere.
func TestDocMapNamesMethodsThatExist(t *testing.T) {
	src := loadDocSource(t)
	members := map[string]map[string]bool{}
	add := func(typ, name string) {
		if members[typ] == nil {
			members[typ] = map[string]bool{}
		}
		members[typ][name] = true
	}
	for _, f := range src.files {
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if typ, name, ok := strings.Cut(funcName(d), "."); ok {
					add(typ, name)
				}
			case *ast.GenDecl:
				for _, sp := range d.Specs {
					ts, ok := sp.(*ast.TypeSpec)
					if !ok {
						continue
					}
					add(ts.Name.Name, "")
					st, ok := ts.Type.(*ast.StructType)
					if !ok {
						continue
					}
					for _, fl := range st.Fields.List {
						for _, n := range fl.Names {
							add(ts.Name.Name, n.Name)
						}
					}
				}
			}
		}
	}
	checked := 0
	for _, m := range regexp.MustCompile(`\b([A-Za-z_][A-Za-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)\b`).FindAllStringSubmatch(src.doc, -1) {
		typ, name := m[1], m[2]
		if members[typ] == nil || name == "go" {
			continue // another package's (mqtt.Client, time.AfterFunc) or a file name
		}
		checked++
		if !members[typ][name] {
			t.Errorf("doc.go names %s.%s: %s has no method or field %s", typ, name, typ, name)
		}
	}
	if checked < 50 {
		t.Fatalf("only %d Type.name references checked: the map is not being read", checked)
	}
}

// Every go statement in the package is in a function the goroutine table
// names.
func TestDocMapGoroutineTableNamesEveryGoStatement(t *testing.T) {
	src := loadDocSource(t)
	table := src.section(t, "Goroutines")
	starters := map[string]string{}
	for name, f := range src.files {
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				if g, ok := n.(*ast.GoStmt); ok {
					starters[funcName(fd)] = name + ":" + strconv.Itoa(src.fset.Position(g.Pos()).Line)
				}
				return true
			})
		}
	}
	if len(starters) == 0 {
		t.Fatal("no go statement found")
	}
	for fn, at := range starters {
		if !mentions(table, fn) {
			t.Errorf("%s starts a goroutine (%s); doc.go's goroutine table does not name %s", fn, at, fn)
		}
	}
}

// Every mutex of the package is placed in the lock order.
func TestDocMapLockOrderNamesEveryMutex(t *testing.T) {
	src := loadDocSource(t)
	order := src.section(t, "Locks")
	n := 0
	for name, f := range src.files {
		ast.Inspect(f, func(node ast.Node) bool {
			ts, ok := node.(*ast.TypeSpec)
			if !ok {
				return true
			}
			st, ok := ts.Type.(*ast.StructType)
			if !ok {
				return true
			}
			for _, fl := range st.Fields.List {
				sel, ok := fl.Type.(*ast.SelectorExpr)
				if !ok {
					continue
				}
				if pkg, ok := sel.X.(*ast.Ident); !ok || pkg.Name != "sync" || (sel.Sel.Name != "Mutex" && sel.Sel.Name != "RWMutex") {
					continue
				}
				for _, fn := range fl.Names {
					n++
					lock := ts.Name.Name + "." + fn.Name
					if !mentions(order, lock) {
						t.Errorf("%s (%s) is a mutex doc.go's lock order does not place", lock, name)
					}
				}
			}
			return true
		})
	}
	if n < 20 {
		t.Fatalf("found only %d mutexes: the walk is broken", n)
	}
}

// invariantMarker is the rule make invariants reads a marker by
// (broker/internal/tools/invariants): a comment line beginning
// "invariant N:" or "invariants N, M:".
var invariantMarker = regexp.MustCompile(`(?i)^invariants?\s+(\d+(?:\s*(?:,|and)\s*\d+)*)\s*:`)

// Every function of this package marked as keeping an invariant is named
// under that invariant in the map.
func TestDocMapNamesTheCodeKeepingEachInvariant(t *testing.T) {
	src := loadDocSource(t)
	entries := map[int]string{}
	cur := 0
	for _, line := range strings.Split(src.section(t, "Invariants"), "\n") {
		if m := regexp.MustCompile(`^\s*(\d+)\.\s`).FindStringSubmatch(line); m != nil {
			cur, _ = strconv.Atoi(m[1])
		}
		if cur > 0 {
			entries[cur] += line + "\n"
		}
	}
	for n := 1; n <= 18; n++ {
		if entries[n] == "" {
			t.Errorf("doc.go has no entry for invariant %d", n)
		}
	}
	sites := 0
	for name, f := range src.files {
		if name == "doc.go" {
			continue
		}
		for _, cg := range f.Comments {
			for _, c := range cg.List {
				text, ok := strings.CutPrefix(c.Text, "//")
				if !ok {
					continue
				}
				m := invariantMarker.FindStringSubmatch(strings.TrimSpace(text))
				if m == nil {
					continue
				}
				keeper := keeperOf(f, c.Pos())
				if keeper == "" {
					t.Errorf("%s: a marker outside any declaration", src.fset.Position(c.Pos()))
					continue
				}
				for _, num := range regexp.MustCompile(`\d+`).FindAllString(m[1], -1) {
					k, _ := strconv.Atoi(num)
					sites++
					if !mentions(entries[k], keeper) {
						t.Errorf("%s keeps invariant %d (%s); doc.go's entry for it does not name %s",
							keeper, k, src.fset.Position(c.Pos()), keeper)
					}
				}
			}
		}
	}
	if sites < 40 {
		t.Fatalf("found only %d markers: the walk is broken", sites)
	}
}

// keeperOf names the declaration a comment at pos sits in, as the map
// names it: a function, a constant or variable, a type, or "<name> field"
// for a struct field.
func keeperOf(f *ast.File, pos token.Pos) string {
	within := func(n ast.Node, doc *ast.CommentGroup) bool {
		start := n.Pos()
		if doc != nil {
			start = doc.Pos()
		}
		return start <= pos && pos <= n.End()
	}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if within(d, d.Doc) {
				return funcName(d)
			}
		case *ast.GenDecl:
			if !within(d, d.Doc) {
				continue
			}
			var names []string
			for _, sp := range d.Specs {
				switch sp := sp.(type) {
				case *ast.ValueSpec:
					start, end := sp.Pos(), sp.End()
					if sp.Doc != nil {
						start = sp.Doc.Pos()
					}
					if sp.Comment != nil {
						end = sp.Comment.End()
					}
					if start <= pos && pos <= end {
						return sp.Names[0].Name
					}
					for _, n := range sp.Names {
						names = append(names, n.Name)
					}
				case *ast.TypeSpec:
					if st, ok := sp.Type.(*ast.StructType); ok {
						for _, fl := range st.Fields.List {
							end := fl.End()
							if fl.Comment != nil {
								end = fl.Comment.End()
							}
							start := fl.Pos()
							if fl.Doc != nil {
								start = fl.Doc.Pos()
							}
							if start <= pos && pos <= end && len(fl.Names) > 0 {
								return fl.Names[0].Name + " field"
							}
						}
					}
					names = append(names, sp.Name.Name)
				}
			}
			if len(names) > 0 { // the first declared, as make invariants names a block
				return names[0]
			}
		}
	}
	return ""
}
