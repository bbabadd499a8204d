package main

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// site is one comment marking code that keeps an invariant: where it is
// (relative to the repository root) and the declaration it sits in.
type site struct {
	file  string // slash-separated, relative to the root
	line  int
	in    string // "(*broker).publish", "type broker", "const maxEntries", ...
	text  string // the comment line, for a reader deciding whether it is right
	group string // the module directory it is in, relative to the root
}

// guardSrc is one test function named TestInvariantNN_*, as the source
// declares it.
type guardSrc struct {
	pkg  string // import path
	dir  string // directory relative to the root, what the table shows
	name string
	file string
	line int
}

// display is how the table names a guard: its directory and name, or its
// package path for a package at the root.
func (g guardSrc) display() string {
	if g.dir == "." {
		return g.pkg + "." + g.name
	}
	return g.dir + "." + g.name
}

// caseSrc is a subtest named for an invariant, as the source spells it: a
// string literal "InvariantNN_*", the way storagetest names the
// conformance cases that guard an invariant. Where it runs, and under which
// parent, only a run tells.
type caseSrc struct {
	dir  string // directory relative to the root
	name string
	file string
	line int
}

func (c caseSrc) display() string { return c.dir + "." + c.name }

// tree is what a repository's Go source says about the invariants.
type tree struct {
	sites   map[int][]site
	guards  map[int][]guardSrc
	cases   map[int][]caseSrc
	modules []module
	files   int
}

type module struct {
	dir  string // relative to the root, slash-separated; "." for the root
	path string // the module path from its go.mod
}

// markerRE is how code says it keeps an invariant: a comment line that
// begins "invariant N:" — or "invariants N, M:" for a line keeping several —
// as the project's rules spell it. The number must be followed by the colon:
// a line that merely cites an invariant, "(invariant 13)" mid-sentence, is a
// citation and not a marker.
var markerRE = regexp.MustCompile(`(?i)^invariants?\s+(\d+(?:\s*(?:,|and)\s*\d+)*)\s*:`)

var listSep = regexp.MustCompile(`\s*(?:,|and)\s*`)

// markerNumbers returns the invariants a comment line marks, or nil when it
// is not a marker. Only // comments are read: a /* */ block is not how the
// project writes a marker.
func markerNumbers(comment string) []int {
	text, ok := strings.CutPrefix(comment, "//")
	if !ok {
		return nil
	}
	m := markerRE.FindStringSubmatch(strings.TrimSpace(text))
	if m == nil {
		return nil
	}
	var ns []int
	for _, s := range listSep.Split(m[1], -1) {
		n, err := strconv.Atoi(s)
		if err == nil {
			ns = append(ns, n)
		}
	}
	return ns
}

// skipDir is what the walk never enters: what Go itself ignores (testdata,
// names starting with . or _), and bin/, where builds land.
func skipDir(rel, name string) bool {
	if rel == "." {
		return false
	}
	return name == "testdata" || name == "vendor" || name == "bin" || name == "node_modules" ||
		strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")
}

// maxFiles bounds how many Go files one scan parses (invariant 13: the tool
// refuses a tree that is not this repository rather than holding it all).
const maxFiles = 20000

// scan parses every Go file under root: the markers in non-test files and
// the guard functions in test files. Every file is parsed, whatever its
// build constraints, because code kept on one platform is still code that
// keeps an invariant.
func scan(root string) (*tree, error) {
	t := &tree{sites: map[int][]site{}, guards: map[int][]guardSrc{}, cases: map[int][]caseSrc{}}
	var goFiles []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		if d.IsDir() {
			if skipDir(rel, d.Name()) {
				return filepath.SkipDir
			}
			return nil
		}
		switch {
		case d.Name() == "go.mod":
			p, err := modulePath(path)
			if err != nil {
				return err
			}
			t.modules = append(t.modules, module{dir: filepath.ToSlash(filepath.Dir(rel)), path: p})
		case strings.HasSuffix(d.Name(), ".go"):
			if len(goFiles) >= maxFiles {
				return fmt.Errorf("more than %d Go files under %s", maxFiles, root)
			}
			goFiles = append(goFiles, rel)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(t.modules) == 0 {
		return nil, fmt.Errorf("no go.mod under %s", root)
	}
	// Longest directory first, so a file belongs to its nearest module.
	sort.Slice(t.modules, func(i, j int) bool { return len(t.modules[i].dir) > len(t.modules[j].dir) })
	fset := token.NewFileSet()
	for _, rel := range goFiles {
		f, err := parser.ParseFile(fset, filepath.Join(root, rel), nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return nil, fmt.Errorf("parse: %w", err)
		}
		t.files++
		rel = filepath.ToSlash(rel)
		mod, ok := t.moduleOf(rel)
		if !ok {
			continue // a Go file outside every module is built by nobody
		}
		t.addCases(fset, f, rel)
		if strings.HasSuffix(rel, "_test.go") {
			t.addGuards(fset, f, rel, mod)
		} else {
			t.addSites(fset, f, rel, mod)
		}
	}
	for n := range t.sites {
		sort.Slice(t.sites[n], func(i, j int) bool {
			a, b := t.sites[n][i], t.sites[n][j]
			return a.file < b.file || a.file == b.file && a.line < b.line
		})
	}
	for n := range t.guards {
		sort.Slice(t.guards[n], func(i, j int) bool {
			a, b := t.guards[n][i], t.guards[n][j]
			return a.dir+"."+a.name < b.dir+"."+b.name
		})
	}
	return t, nil
}

// displayPkg names a package by its directory under the root, as the
// table names guards, or by its path when no module here holds it.
func (t *tree) displayPkg(pkg string) string {
	for _, m := range t.modules { // longest directory first
		if pkg == m.path {
			return m.dir
		}
		if rest, ok := strings.CutPrefix(pkg, m.path+"/"); ok {
			if m.dir == "." {
				return rest
			}
			return m.dir + "/" + rest
		}
	}
	return pkg
}

// modulePath reads the module line of a go.mod.
func modulePath(gomod string) (string, error) {
	f, err := os.Open(gomod)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if p, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module "); ok {
			return strings.Trim(strings.TrimSpace(p), `"`), nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("%s: %w", gomod, err)
	}
	return "", fmt.Errorf("%s: no module line", gomod)
}

func (t *tree) moduleOf(rel string) (module, bool) {
	for _, m := range t.modules {
		if m.dir == "." || strings.HasPrefix(rel, m.dir+"/") {
			return m, true
		}
	}
	return module{}, false
}

// importPath is the package path of the directory dir (relative to the
// root) in module m.
func importPath(m module, dir string) string {
	if dir == m.dir {
		return m.path
	}
	if m.dir == "." {
		return m.path + "/" + dir
	}
	return m.path + "/" + strings.TrimPrefix(dir, m.dir+"/")
}

var guardFunc = regexp.MustCompile(`^TestInvariant(\d\d)_\w+$`)

func (t *tree) addGuards(fset *token.FileSet, f *ast.File, rel string, mod module) {
	dir := filepath.ToSlash(filepath.Dir(rel))
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Recv != nil {
			continue
		}
		m := guardFunc.FindStringSubmatch(fd.Name.Name)
		if m == nil {
			continue
		}
		n, _ := strconv.Atoi(m[1])
		t.guards[n] = append(t.guards[n], guardSrc{
			pkg: importPath(mod, dir), dir: dir, name: fd.Name.Name,
			file: rel, line: fset.Position(fd.Pos()).Line,
		})
	}
}

var caseName = regexp.MustCompile(`^Invariant(\d\d)_\w+$`)

// addCases records every string literal that is a subtest name for an
// invariant, once per directory.
func (t *tree) addCases(fset *token.FileSet, f *ast.File, rel string) {
	dir := filepath.ToSlash(filepath.Dir(rel))
	ast.Inspect(f, func(n ast.Node) bool {
		lit, ok := n.(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING {
			return true
		}
		v, err := strconv.Unquote(lit.Value)
		if err != nil {
			return true
		}
		m := caseName.FindStringSubmatch(v)
		if m == nil {
			return true
		}
		num, _ := strconv.Atoi(m[1])
		for _, c := range t.cases[num] {
			if c.dir == dir && c.name == v {
				return true
			}
		}
		t.cases[num] = append(t.cases[num], caseSrc{dir: dir, name: v, file: rel, line: fset.Position(lit.Pos()).Line})
		return true
	})
}

func (t *tree) addSites(fset *token.FileSet, f *ast.File, rel string, mod module) {
	for _, g := range f.Comments {
		for i, c := range g.List {
			ns := markerNumbers(c.Text)
			if ns == nil {
				continue
			}
			s := site{
				file: rel, line: fset.Position(c.Pos()).Line,
				in: enclosing(fset, f, c.Pos()), text: markerText(g.List[i:]),
				group: mod.dir,
			}
			for _, n := range ns {
				t.sites[n] = append(t.sites[n], s)
			}
		}
	}
}

// maxMarkerText bounds the text kept of one marker (invariant 13).
const maxMarkerText = 400

// markerText is a marker's sentence: its line and the comment lines that
// continue it, up to an empty comment line or the next marker.
func markerText(list []*ast.Comment) string {
	var b strings.Builder
	for i, c := range list {
		text, ok := strings.CutPrefix(c.Text, "//")
		text = strings.TrimSpace(text)
		if !ok || text == "" || i > 0 && markerNumbers(c.Text) != nil {
			break
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(text)
		if b.Len() > maxMarkerText {
			return cutText(b.String(), maxMarkerText)
		}
	}
	return b.String()
}

// cutText shortens s to at most n bytes, at a space where there is one and
// never inside a character.
func cutText(s string, n int) string {
	cut := strings.LastIndexByte(s[:n], ' ')
	if cut <= 0 {
		for cut = n; cut > 0 && !utf8.RuneStart(s[cut]); cut-- {
		}
	}
	return s[:cut] + " …"
}

// enclosing names the declaration a comment at pos belongs to: the function
// it is inside or documents, or the type, constant or variable it sits in —
// what a reader looks for, since a file:line goes stale with the next edit.
func enclosing(fset *token.FileSet, f *ast.File, pos token.Pos) string {
	line := fset.Position(pos).Line
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			// A comment trailing the function's last line is the function's.
			if !within(pos, d.Doc, d.Pos(), d.End()) && fset.Position(d.End()).Line != line {
				continue
			}
			name := funcName(d)
			if inFuncLit(d.Body, pos) {
				name += " (in a func literal)"
			}
			return name
		case *ast.GenDecl:
			if !within(pos, d.Doc, d.Pos(), d.End()) && fset.Position(d.End()).Line != line {
				continue
			}
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					if within(pos, s.Doc, s.Pos(), commentEnd(s.End(), s.Comment)) {
						return "type " + s.Name.Name + fieldOf(s, pos)
					}
				case *ast.ValueSpec:
					if within(pos, s.Doc, s.Pos(), commentEnd(s.End(), s.Comment)) {
						return d.Tok.String() + " " + identList(s.Names)
					}
				}
			}
			// The declaration's own doc comment, or a comment between its
			// specs: name the first spec.
			return genName(d)
		}
	}
	return "(package level)"
}

// within reports whether pos lies in the node from its doc comment (when it
// has one) to end.
func within(pos token.Pos, doc *ast.CommentGroup, start, end token.Pos) bool {
	if doc != nil && doc.Pos() < start {
		start = doc.Pos()
	}
	return start <= pos && pos <= end
}

func commentEnd(end token.Pos, c *ast.CommentGroup) token.Pos {
	if c != nil && c.End() > end {
		return c.End()
	}
	return end
}

func funcName(d *ast.FuncDecl) string {
	if d.Recv == nil || len(d.Recv.List) == 0 {
		return d.Name.Name
	}
	return "(" + recvType(d.Recv.List[0].Type) + ")." + d.Name.Name
}

func recvType(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.StarExpr:
		return "*" + recvType(e.X)
	case *ast.Ident:
		return e.Name
	case *ast.IndexExpr: // a generic receiver, T[K]
		return recvType(e.X)
	case *ast.IndexListExpr:
		return recvType(e.X)
	case *ast.ParenExpr:
		return recvType(e.X)
	}
	return "?"
}

func inFuncLit(body *ast.BlockStmt, pos token.Pos) bool {
	if body == nil {
		return false
	}
	found := false
	ast.Inspect(body, func(n ast.Node) bool {
		if found || n == nil {
			return false
		}
		if n.Pos() > pos || n.End() < pos {
			return false
		}
		if _, ok := n.(*ast.FuncLit); ok {
			found = true
			return false
		}
		return true
	})
	return found
}

// fieldOf names the struct field a comment sits on or above, if any.
func fieldOf(s *ast.TypeSpec, pos token.Pos) string {
	st, ok := s.Type.(*ast.StructType)
	if !ok || st.Fields == nil {
		return ""
	}
	for _, fld := range st.Fields.List {
		if within(pos, fld.Doc, fld.Pos(), commentEnd(fld.End(), fld.Comment)) {
			if len(fld.Names) == 0 {
				return " (embedded field)"
			}
			return " (field " + identList(fld.Names) + ")"
		}
	}
	return ""
}

func identList(ids []*ast.Ident) string {
	names := make([]string, len(ids))
	for i, id := range ids {
		names[i] = id.Name
	}
	return strings.Join(names, ", ")
}

func genName(d *ast.GenDecl) string {
	if len(d.Specs) == 0 {
		return d.Tok.String()
	}
	switch s := d.Specs[0].(type) {
	case *ast.TypeSpec:
		return "type " + s.Name.Name
	case *ast.ValueSpec:
		return d.Tok.String() + " " + identList(s.Names)
	case *ast.ImportSpec:
		return "import"
	}
	return d.Tok.String()
}
