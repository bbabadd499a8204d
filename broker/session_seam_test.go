package broker

import (
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

// The session seam (rfcs/delivery-seam.md "The session behind methods"):
// the session's state is reached through methods defined in the session's
// own files, so a takeover, a SUBSCRIBE and a scrape each meet it in one
// critical section of those files rather than under a lock taken from
// fifteen. These tests read the package's own source, type-checked, and
// name every selection that goes around the seam, by file and line.

// typedSource is the package's non-test files, type-checked with every
// import stood in by an empty package: only the selections on the
// package's own types are wanted, and those resolve without the imports.
type typedSource struct {
	fset *token.FileSet
	sels map[*ast.SelectorExpr]*types.Selection
	// files by name, parsed.
	files map[string]*ast.File
	info  *types.Info
}

type emptyImporter struct{}

func (emptyImporter) Import(path string) (*types.Package, error) {
	p := types.NewPackage(path, path[strings.LastIndex(path, "/")+1:])
	p.MarkComplete()
	return p, nil
}

func loadTypedSource(t *testing.T) typedSource {
	t.Helper()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	src := typedSource{fset: token.NewFileSet(), files: map[string]*ast.File{}}
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(src.fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		src.files[name] = f
		files = append(files, f)
	}
	src.info = &types.Info{Selections: map[*ast.SelectorExpr]*types.Selection{}, Uses: map[*ast.Ident]types.Object{},
		Types: map[ast.Expr]types.TypeAndValue{}}
	conf := types.Config{Importer: emptyImporter{}, Error: func(error) {}} // the stood-in imports' errors
	if _, err := conf.Check("saguin.dev/broker", src.fset, files, src.info); err == nil {
		t.Fatal("type-checking with empty imports found no error: the stand-in is not what this test thinks")
	}
	src.sels = src.info.Selections
	return src
}

// fieldSelection is one selection of a struct field of one of the
// package's own named types.
type fieldSelection struct {
	file, typ, field string
	pos              token.Position
}

// fieldSelections lists, sorted by position, every field of a named type
// of this package selected in the package's source.
func (src typedSource) fieldSelections() []fieldSelection {
	var out []fieldSelection
	for sel, s := range src.sels {
		if s.Kind() != types.FieldVal {
			continue
		}
		recv := s.Recv()
		if p, ok := recv.(*types.Pointer); ok {
			recv = p.Elem()
		}
		named, ok := recv.(*types.Named)
		if !ok || named.Obj().Pkg() == nil || named.Obj().Pkg().Path() != "saguin.dev/broker" {
			continue
		}
		// The field selected may be promoted from an embedded type: name
		// the type that declares it.
		typ := named.Obj().Name()
		if idx := s.Index(); len(idx) > 1 {
			typ = embeddedOwner(named, idx)
		}
		pos := src.fset.Position(sel.Sel.Pos())
		out = append(out, fieldSelection{file: filepath.Base(pos.Filename), typ: typ, field: sel.Sel.Name, pos: pos})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].pos.Filename != out[j].pos.Filename {
			return out[i].pos.Filename < out[j].pos.Filename
		}
		return out[i].pos.Offset < out[j].pos.Offset
	})
	return out
}

// embeddedOwner names the type declaring the field reached by the
// embedding path idx from named.
func embeddedOwner(named *types.Named, idx []int) string {
	var t types.Type = named
	name := named.Obj().Name()
	for _, i := range idx[:len(idx)-1] {
		st, ok := t.Underlying().(*types.Struct)
		if !ok {
			return name
		}
		t = st.Field(i).Type()
		if p, ok := t.(*types.Pointer); ok {
			t = p.Elem()
		}
		if n, ok := t.(*types.Named); ok {
			name = n.Obj().Name()
		}
	}
	return name
}

// sessionFiles are the session's own files: the only ones that take
// session.mu or session.subscribing, or read or write the session's
// mutable fields.
var sessionFiles = []string{"session.go", "session_lifecycle.go", "session_state.go"}

// sessionFixed are the session's fields set when it is made and never
// changed (its id, its deliveries, the holder of its outbox, an atomic
// pointer), which any file may select.
var sessionFixed = []string{"id", "deliv", "bcast"}

func TestSessionSeam_StateStaysInTheSessionsFiles(t *testing.T) {
	src := loadTypedSource(t)
	if len(sessionFiles) > 3 {
		t.Fatalf("at most three files may hold the session's state, %d named", len(sessionFiles))
	}
	seen := 0
	for _, s := range src.fieldSelections() {
		if s.typ != "session" {
			continue
		}
		seen++
		if slices.Contains(sessionFiles, s.file) || slices.Contains(sessionFixed, s.field) {
			continue
		}
		why := "the session's state is reached through its methods (session_state.go)"
		if s.field == "mu" || s.field == "subscribing" {
			why = "only the session's own files take its locks"
		}
		t.Errorf("%s: session.%s: %s", s.pos, s.field, why)
	}
	if seen == 0 {
		t.Fatal("no selection of a session field found: the check reads nothing")
	}
}

// The metric catalogue and the operations routes format views each type
// builds of itself, under its own lock or from its own atomics
// (session.view, consumer.position, queueEngine.figures and jobViews,
// outbox.queueFigures, channel.view, fanout.counts, gate.view,
// eventCounts.view): in the two view files every field selected is the
// Broker's own (their functions are its methods) or one of a plain value —
// a struct of this package with no field of a type from sync or
// sync/atomic, nor of a type of this package that has one
// (rfcs/delivery-seam.md "The session behind methods"; rfcs/metrics.md:
// one lock at a time, nothing formatted under one).
func TestSessionSeam_ViewsReadNoLockedStateOfAnotherType(t *testing.T) {
	src := loadTypedSource(t)
	keeps := src.typesKeepingLocks()
	// The detector itself: types known to keep a lock or atomics are
	// found, and the views they build are not.
	for _, name := range []string{"session", "consumer", "latestConsumer", "queueEngine", "outbox", "deliveries",
		"channel", "fanout", "gate", "eventCounts", "wireShards"} {
		if k, ok := keeps[name]; !ok || !k {
			t.Errorf("%s keeps a lock or an atomic, but the check does not see one (declared: %v)", name, ok)
		}
	}
	for _, name := range []string{"sessionView", "jobView", "readerAt", "sessionFigures", "wireTotals",
		"channelView", "fanoutCounts", "gateView", "eventFigures"} {
		if k, ok := keeps[name]; !ok || k {
			t.Errorf("%s is a plain value, but the check reads it as keeping a lock or an atomic (declared: %v)", name, ok)
		}
	}
	views := []string{"metrics_snapshot.go", "ops_views.go"}
	seen := 0
	for _, s := range src.fieldSelections() {
		if !slices.Contains(views, s.file) {
			continue
		}
		seen++
		if s.typ == "Broker" {
			continue
		}
		k, ok := keeps[s.typ]
		switch {
		case !ok:
			t.Errorf("%s: %s.%s: %s is not a type declared in the package's source", s.pos, s.typ, s.field, s.typ)
		case k:
			t.Errorf("%s: %s.%s: %s keeps a lock or atomics; read it through a view it builds of itself (%s.view or its like)",
				s.pos, s.typ, s.field, s.typ, s.typ)
		}
	}
	if seen == 0 {
		t.Fatal("no field selection found in the view files: the check reads nothing")
	}
}

// typesKeepingLocks maps every type declared in the package's source to
// whether it keeps a lock or an atomic by value: a field (embedded or not)
// whose type is written sync.X or atomic.X (the package as the file
// imports it), or is a type of this package that keeps one, seen through
// arrays and struct literals. Pointers, slices, maps and channels lead to
// another value, read through its own methods, so they are not followed.
// Read from the syntax: the type-checker's imports are empty stand-ins.
func (src typedSource) typesKeepingLocks() map[string]bool {
	type decl struct {
		spec    *ast.TypeSpec
		imports map[string]string // local name → import path
	}
	decls := map[string]decl{}
	for _, f := range src.files {
		imports := map[string]string{}
		for _, imp := range f.Imports {
			path := strings.Trim(imp.Path.Value, `"`)
			name := path[strings.LastIndex(path, "/")+1:]
			if imp.Name != nil {
				name = imp.Name.Name
			}
			imports[name] = path
		}
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.TYPE {
				continue
			}
			for _, s := range g.Specs {
				ts := s.(*ast.TypeSpec)
				decls[ts.Name.Name] = decl{spec: ts, imports: imports}
			}
		}
	}
	out := map[string]bool{}
	visiting := map[string]bool{}
	var keeps func(name string) bool
	var holds func(e ast.Expr, imports map[string]string) bool
	holds = func(e ast.Expr, imports map[string]string) bool {
		switch v := e.(type) {
		case *ast.ParenExpr:
			return holds(v.X, imports)
		case *ast.ArrayType:
			return v.Len != nil && holds(v.Elt, imports) // an array holds its elements; a slice points at them
		case *ast.StructType:
			for _, f := range v.Fields.List {
				if holds(f.Type, imports) {
					return true
				}
			}
		case *ast.SelectorExpr:
			if x, ok := v.X.(*ast.Ident); ok {
				p := imports[x.Name]
				return p == "sync" || p == "sync/atomic"
			}
		case *ast.IndexExpr:
			return holds(v.X, imports)
		case *ast.IndexListExpr:
			return holds(v.X, imports)
		case *ast.Ident:
			return keeps(v.Name) // a predeclared type is declared nowhere here: false
		}
		return false
	}
	keeps = func(name string) bool {
		if k, ok := out[name]; ok {
			return k
		}
		d, ok := decls[name]
		if !ok || visiting[name] {
			return false
		}
		visiting[name] = true
		k := holds(d.spec.Type, d.imports)
		visiting[name] = false
		out[name] = k
		return k
	}
	for name := range decls {
		keeps(name)
	}
	return out
}

// A seek moves a consumer through consumer.seekTo, under the consumer's
// lock in consumer.go: seek.go assigns no field of a consumer.
func TestSessionSeam_SeekAssignsNoConsumerField(t *testing.T) {
	src := loadTypedSource(t)
	f := src.files["seek.go"]
	if f == nil {
		t.Fatal("seek.go not read")
	}
	assigned := func(e ast.Expr) {
		for {
			switch v := e.(type) {
			case *ast.IndexExpr:
				e = v.X
				continue
			case *ast.ParenExpr:
				e = v.X
				continue
			case *ast.SelectorExpr:
				if s, ok := src.sels[v]; ok && s.Kind() == types.FieldVal {
					recv := s.Recv()
					if p, ok := recv.(*types.Pointer); ok {
						recv = p.Elem()
					}
					if n, ok := recv.(*types.Named); ok && n.Obj().Name() == "consumer" {
						t.Errorf("%s: seek.go assigns consumer.%s: move it with consumer.seekTo", src.fset.Position(v.Pos()), v.Sel.Name)
					}
				}
				e = v.X
				continue
			}
			return
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch v := n.(type) {
		case *ast.AssignStmt:
			for _, l := range v.Lhs {
				assigned(l)
			}
		case *ast.IncDecStmt:
			assigned(v.X)
		}
		return true
	})
}

// Every route's exchange carries its cookie back to the route (consumerAck,
// latestAck, queueAck with its job, outboxAck with the outbox's entry
// seq): the deliveries' table is the only one keyed by packet id. The
// channel pumps, the queue, and the broadcast outbox with its sender, its
// stored window and its restore (fanout.go, fanout_send.go, bcastlog*.go)
// keep none of their own; the broadcast outbox's entries keep the id they
// went out under as data, for the stored window a restart resends under
// (rfcs/delivery-seam.md "The session behind methods"). A key is judged by
// its type, so a named type over uint16 is caught too.
func TestSessionSeam_NoPacketIDTableOnAnyRoute(t *testing.T) {
	src := loadTypedSource(t)
	byPacketID := func(key ast.Expr) bool {
		if tv, ok := src.info.Types[key]; ok && tv.Type != nil {
			b, ok := tv.Type.Underlying().(*types.Basic)
			return ok && b.Kind() == types.Uint16
		}
		k, ok := key.(*ast.Ident)
		return ok && k.Name == "uint16"
	}
	maps := 0
	for _, name := range []string{"consumer.go", "latest_consumer.go", "queue.go",
		"fanout.go", "fanout_send.go", "bcastlog.go", "bcastlog_full.go", "bcastlog_restore.go"} {
		f := src.files[name]
		if f == nil {
			t.Fatalf("%s not read", name)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			m, ok := n.(*ast.MapType)
			if !ok {
				return true
			}
			maps++
			if byPacketID(m.Key) {
				t.Errorf("%s: a table keyed by packet id: let the exchange carry its cookie (deliveries.go)", src.fset.Position(m.Pos()))
			}
			return true
		})
	}
	if maps == 0 {
		t.Fatal("no map type found in the files read: the check reads nothing")
	}
}

// claimSession reads as its phases (takeFromOldConnection, endsAtConnect,
// endClaimedSession, giveSessionTo, storeClaimedSession): its own body
// stays short enough to see them all at once. (subscribe is held to its
// phases the same way: TestSessionSeam_SubscribeIsItsPhases;
// rfcs/delivery-seam.md "The session behind methods".)
func TestSessionSeam_ClaimSessionIsItsPhases(t *testing.T) {
	src := loadTypedSource(t)
	const maxLines = 50
	found := false
	for _, f := range src.files {
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Name.Name != "claimSession" || fd.Body == nil {
				continue
			}
			found = true
			from, to := src.fset.Position(fd.Body.Lbrace), src.fset.Position(fd.Body.Rbrace)
			if n := to.Line - from.Line - 1; n > maxLines {
				t.Errorf("%s: claimSession is %d lines (at most %d): split what it does into named phases", from, n, maxLines)
			}
		}
	}
	if !found {
		t.Fatal("claimSession not found")
	}
}

// The append and latest pumps and the queue engine reach the session's
// deliveries only through their delivery sink (delivery_sink.go;
// rfcs/delivery-seam.md "The delivery sink"): consumer.go,
// latest_consumer.go, queue.go and queue_offer.go select no field of the
// deliveries, nor session.deliv, call no method of the deliveries, and name
// no *mqtt.Client — the bridge's outbound reader is a sink that is no
// mochi connection, and a pump that names one could not serve it.
func TestSessionSeam_PumpsReachDeliveriesThroughTheSink(t *testing.T) {
	src := loadTypedSource(t)
	pumps := []string{"consumer.go", "latest_consumer.go", "queue.go", "queue_offer.go"}
	for _, s := range src.fieldSelections() {
		if !slices.Contains(pumps, s.file) {
			continue
		}
		if s.typ == "deliveries" || (s.typ == "session" && s.field == "deliv") {
			t.Errorf("%s: %s.%s: a pump reaches the deliveries through its sink (delivery_sink.go)", s.pos, s.typ, s.field)
		}
	}
	seen := 0
	for sel, s := range src.sels {
		pos := src.fset.Position(sel.Sel.Pos())
		if !slices.Contains(pumps, filepath.Base(pos.Filename)) || s.Kind() != types.MethodVal {
			continue
		}
		recv := s.Recv()
		if p, ok := recv.(*types.Pointer); ok {
			recv = p.Elem()
		}
		n, ok := recv.(*types.Named)
		if !ok {
			continue
		}
		switch n.Obj().Name() {
		case "deliveries":
			t.Errorf("%s: deliveries.%s: a pump reaches the deliveries through its sink (delivery_sink.go)", pos, sel.Sel.Name)
		case "deliverySink":
			seen++
		}
	}
	if seen == 0 {
		t.Fatal("no call of a deliverySink method found in the pumps: the check reads nothing")
	}
	for _, name := range pumps {
		f := src.files[name]
		if f == nil {
			t.Fatalf("%s not read", name)
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok {
				continue
			}
			ast.Inspect(fd, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if !ok || sel.Sel.Name != "Client" {
					return true
				}
				id, ok := sel.X.(*ast.Ident)
				if !ok {
					return true
				}
				if pn, ok := src.info.Uses[id].(*types.PkgName); ok && pn.Imported().Path() == "github.com/mochi-mqtt/server/v2" {
					where := "in its body"
					if sel.Pos() < fd.Type.End() {
						where = "in its signature"
					}
					t.Errorf("%s: %s names *mqtt.Client %s: the connection stays inside the sink (connSink)", src.fset.Position(sel.Pos()), fd.Name.Name, where)
				}
				return true
			})
		}
	}
}

// subscribe reads as its phases, in the order a SUBSCRIBE is served
// (rfcs/delivery-seam.md "The session behind methods"): the packet's
// protocol errors and a share the ACL denies, its saguin-* instructions,
// each filter's code, the subscription limit, the session stored, the
// slices declared, the subscriptions made, the SUBACK, and then the
// retained passes and the pumps. Its own body stays short enough to see
// them all at once, and calls each.
func TestSessionSeam_SubscribeIsItsPhases(t *testing.T) {
	src := loadTypedSource(t)
	const maxLines = 40
	phases := []string{"refuseMalformedSubscribe", "refuseDeniedShare", "readSubscribeInstructions", "admitFilters",
		"withinSubscriptionLimit", "storeSubscriptions", "declareSlices", "addSubscriptions", "writeSuback", "startDeliveries"}
	found := false
	for _, f := range src.files {
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Name.Name != "subscribe" || fd.Recv == nil || fd.Body == nil {
				continue
			}
			found = true
			from, to := src.fset.Position(fd.Body.Lbrace), src.fset.Position(fd.Body.Rbrace)
			if n := to.Line - from.Line - 1; n > maxLines {
				t.Errorf("%s: subscribe is %d lines (at most %d): split what it does into named phases", from, n, maxLines)
			}
			// The phases it calls, in the order called.
			var called []string
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				if c, ok := n.(*ast.CallExpr); ok {
					if sel, ok := c.Fun.(*ast.SelectorExpr); ok && slices.Contains(phases, sel.Sel.Name) {
						called = append(called, sel.Sel.Name)
					}
				}
				return true
			})
			if !slices.Equal(called, phases) {
				t.Errorf("%s: subscribe calls %v; want its phases, each once, in order: %v", from, called, phases)
			}
		}
	}
	if !found {
		t.Fatal("Broker.subscribe not found")
	}
}
