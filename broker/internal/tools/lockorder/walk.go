package lockorder

import (
	"go/ast"
	"go/token"
	"go/types"
	"sort"
	"strings"
)

// state is the set of locks a function may hold at a point of its body.
type state map[string]token.Pos

func (s state) copy() state {
	out := make(state, len(s))
	for k, v := range s {
		out[k] = v
	}
	return out
}

// released is the mark of a lock the function let go of without having
// taken it: its caller's (clientConn.flushOwn is called holding
// connWriter.mu and unlocks it). The mark stays for the rest of the path.
func released(lock string) string { return "released " + lock }

func isReleased(key string) (string, bool) { return strings.CutPrefix(key, "released ") }

func (s state) snapshot() []heldLock {
	out := make([]heldLock, 0, len(s))
	for k, v := range s {
		out = append(out, heldLock{k, v})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// join is the union of the states of the paths that reach a point (nil:
// none does).
func join(states ...state) state {
	var out state
	for _, s := range states {
		if s == nil {
			continue
		}
		if out == nil {
			out = state{}
		}
		for k, v := range s {
			if _, ok := out[k]; !ok {
				out[k] = v
			}
		}
	}
	return out
}

type walker struct {
	c        *checker
	f        *fn
	deferred map[string]bool // locks a deferred Unlock releases
	// bound are the local variables the function assigns a function
	// literal or a lock's method value to (latest_consumer.go's wait,
	// qos2_broadcast.go's unlock): calling one is calling what it holds.
	bound map[types.Object]ast.Expr
}

// exit notes the locks a path may leave the function holding that it
// took and no deferred Unlock releases: the function hands them to its
// caller, which the walk does not follow (Result.Leaks names them).
func (w *walker) exit(s state) {
	for lock, pos := range s {
		if _, rel := isReleased(lock); rel || w.deferred[lock] {
			continue
		}
		w.c.leaks[w.f.name+" returns holding "+lock+" (taken at "+w.c.pos(pos)+")"] = true
	}
}

// block walks stmts from s; the result is nil when no path leaves the end.
func (w *walker) block(stmts []ast.Stmt, s state) state {
	for _, st := range stmts {
		if s == nil {
			return nil
		}
		s = w.stmt(st, s)
	}
	return s
}

func (w *walker) stmt(st ast.Stmt, s state) state {
	switch st := st.(type) {
	case nil:
		return s
	case *ast.BlockStmt:
		return w.block(st.List, s)
	case *ast.ExprStmt:
		w.expr(st.X, s)
		if call, ok := ast.Unparen(st.X).(*ast.CallExpr); ok {
			if id, ok := ast.Unparen(call.Fun).(*ast.Ident); ok && id.Name == "panic" {
				if _, builtin := w.c.p.Info.Uses[id].(*types.Builtin); builtin {
					return nil
				}
			}
		}
		return s
	case *ast.AssignStmt:
		for _, e := range st.Rhs {
			w.expr(e, s)
		}
		for _, e := range st.Lhs {
			w.expr(e, s)
		}
		if len(st.Lhs) == len(st.Rhs) {
			for i, l := range st.Lhs {
				w.bind(l, st.Rhs[i])
			}
		}
		return s
	case *ast.DeclStmt:
		ast.Inspect(st, func(n ast.Node) bool {
			if e, ok := n.(ast.Expr); ok {
				w.expr(e, s)
				return false
			}
			return true
		})
		return s
	case *ast.IncDecStmt:
		w.expr(st.X, s)
		return s
	case *ast.SendStmt:
		w.expr(st.Chan, s)
		w.expr(st.Value, s)
		return s
	case *ast.ReturnStmt:
		for _, e := range st.Results {
			w.expr(e, s)
		}
		w.exit(s)
		return nil
	case *ast.BranchStmt:
		if st.Tok == token.FALLTHROUGH {
			return s
		}
		return nil // break, continue, goto: that path is not joined
	case *ast.LabeledStmt:
		return w.stmt(st.Stmt, s)
	case *ast.GoStmt:
		// The arguments are evaluated here; the call runs in a new
		// goroutine, holding nothing of this function's.
		w.args(st.Call, s, true)
		if lit, ok := ast.Unparen(st.Call.Fun).(*ast.FuncLit); ok {
			w.c.litFn(lit, w.f.name)
		} else {
			w.expr(receiverOf(st.Call.Fun), s)
		}
		return s
	case *ast.DeferStmt:
		if lock, op := w.lockCall(st.Call); op == "Unlock" || op == "RUnlock" {
			w.deferred[lock] = true // released at the function's end: held until then
			return s
		}
		w.call(st.Call, s) // taken as made here
		return s
	case *ast.IfStmt:
		s = w.stmt(st.Init, s)
		if s == nil {
			return nil
		}
		w.expr(st.Cond, s)
		then := w.block(st.Body.List, s.copy())
		els := s
		if st.Else != nil {
			els = w.stmt(st.Else, s.copy())
		}
		return join(then, els)
	case *ast.ForStmt:
		s = w.stmt(st.Init, s)
		if s == nil {
			return nil
		}
		w.expr(st.Cond, s)
		body := w.block(st.Body.List, s.copy())
		if body != nil {
			w.stmt(st.Post, body)
		}
		return join(s, body)
	case *ast.RangeStmt:
		w.expr(st.X, s)
		body := w.block(st.Body.List, s.copy())
		return join(s, body)
	case *ast.SwitchStmt:
		s = w.stmt(st.Init, s)
		if s == nil {
			return nil
		}
		w.expr(st.Tag, s)
		return w.clauses(st.Body, s)
	case *ast.TypeSwitchStmt:
		s = w.stmt(st.Init, s)
		if s == nil {
			return nil
		}
		w.stmt(st.Assign, s)
		return w.clauses(st.Body, s)
	case *ast.SelectStmt:
		var outs []state
		for _, cl := range st.Body.List {
			cc := cl.(*ast.CommClause)
			cs := w.stmt(cc.Comm, s.copy())
			if cs != nil {
				cs = w.block(cc.Body, cs)
			}
			outs = append(outs, cs)
		}
		if len(st.Body.List) == 0 {
			return nil // select {} blocks for ever
		}
		return join(outs...)
	case *ast.EmptyStmt:
		return s
	}
	return s
}

func (w *walker) clauses(body *ast.BlockStmt, s state) state {
	outs := []state{}
	hasDefault := false
	for _, cl := range body.List {
		cc := cl.(*ast.CaseClause)
		if cc.List == nil {
			hasDefault = true
		}
		for _, e := range cc.List {
			w.expr(e, s)
		}
		outs = append(outs, w.block(cc.Body, s.copy()))
	}
	if !hasDefault {
		outs = append(outs, s)
	}
	return join(outs...)
}

// expr walks the calls in e, in evaluation order (arguments first), and
// updates s with the locks they take and release.
func (w *walker) expr(e ast.Expr, s state) {
	if e == nil || s == nil {
		return
	}
	ast.Inspect(e, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.CallExpr:
			w.call(n, s)
			return false
		case *ast.FuncLit:
			w.c.litFn(n, w.f.name) // a function value: walked on its own
			return false
		}
		return true
	})
}

// receiverOf is the part of a call's function expression that is evaluated
// before the call (x in x.m(...)), or nil.
func receiverOf(fun ast.Expr) ast.Expr {
	if sel, ok := ast.Unparen(fun).(*ast.SelectorExpr); ok {
		return sel.X
	}
	return nil
}

var lockOps = map[string]bool{"Lock": true, "RLock": true, "Unlock": true, "RUnlock": true, "TryLock": true, "TryRLock": true}

// lockMethod reports whether sel selects a method of sync.Mutex or
// sync.RWMutex, and which lock it is on.
func (w *walker) lockMethod(sel *ast.SelectorExpr) (lock, op string) {
	selection := w.c.p.Info.Selections[sel]
	if selection == nil {
		return "", ""
	}
	m, ok := selection.Obj().(*types.Func)
	if !ok || m.Pkg() == nil || m.Pkg().Path() != "sync" || !lockOps[m.Name()] {
		return "", ""
	}
	recv := m.Type().(*types.Signature).Recv()
	if recv == nil {
		return "", ""
	}
	rn, ok := deref(recv.Type()).(*types.Named)
	if !ok || (rn.Obj().Name() != "Mutex" && rn.Obj().Name() != "RWMutex") {
		return "", ""
	}
	if idx := selection.Index(); len(idx) > 1 {
		// promoted from an embedded mutex: the field that embeds it
		return w.fieldPath(selection.Recv(), idx[:len(idx)-1]), m.Name()
	}
	return w.lockID(sel.X), m.Name()
}

// lockOp is what a mutex operation does to s.
func (w *walker) lockOp(lock, op string) func(token.Pos, state) {
	return func(pos token.Pos, s state) {
		switch op {
		case "Lock", "RLock":
			w.take(lock, false, pos, s)
		case "TryLock", "TryRLock":
			w.take(lock, true, pos, s)
		case "Unlock", "RUnlock":
			if _, ok := s[lock]; ok {
				delete(s, lock)
			} else {
				s[released(lock)] = pos
			}
		}
	}
}

// bind notes a local variable assigned a function literal or a lock's
// method value.
func (w *walker) bind(lhs, rhs ast.Expr) {
	id, ok := ast.Unparen(lhs).(*ast.Ident)
	if !ok {
		return
	}
	obj := w.c.p.Info.Defs[id]
	if obj == nil {
		obj = w.c.p.Info.Uses[id]
	}
	if v, ok := obj.(*types.Var); !ok || v.Parent() == w.c.p.Types.Scope() {
		return
	}
	switch x := ast.Unparen(rhs).(type) {
	case *ast.FuncLit:
		w.bound[obj] = x
	case *ast.SelectorExpr:
		if _, op := w.lockMethod(x); op != "" {
			w.bound[obj] = x
			return
		}
		delete(w.bound, obj)
	default:
		delete(w.bound, obj)
	}
}

// lockCall reports whether call is a mutex operation.
func (w *walker) lockCall(call *ast.CallExpr) (lock, op string) {
	if sel, ok := ast.Unparen(call.Fun).(*ast.SelectorExpr); ok {
		return w.lockMethod(sel)
	}
	return "", ""
}

// fieldPath names the field reached from t by the embedded-field indexes.
func (w *walker) fieldPath(t types.Type, idx []int) string {
	owner := typeName(t)
	name := "?"
	for _, i := range idx {
		st, ok := deref(t).Underlying().(*types.Struct)
		if !ok {
			return "a lock of " + owner
		}
		owner = typeName(t)
		name = st.Field(i).Name()
		t = st.Field(i).Type()
	}
	return owner + "." + name
}

// lockID names the mutex e denotes: Type.field, or a parameter of this
// function (resolved at each call), or a variable.
func (w *walker) lockID(e ast.Expr) string {
	e = ast.Unparen(e)
	if u, ok := e.(*ast.UnaryExpr); ok && u.Op == token.AND {
		e = ast.Unparen(u.X)
	}
	if st, ok := e.(*ast.StarExpr); ok {
		e = ast.Unparen(st.X)
	}
	switch x := e.(type) {
	case *ast.SelectorExpr:
		if selection := w.c.p.Info.Selections[x]; selection != nil && selection.Kind() == types.FieldVal {
			return w.fieldPath(selection.Recv(), selection.Index())
		}
		if obj, ok := w.c.p.Info.Uses[x.Sel].(*types.Var); ok {
			return "variable " + obj.Pkg().Name() + "." + obj.Name()
		}
	case *ast.Ident:
		obj, _ := w.c.p.Info.Uses[x].(*types.Var)
		if obj == nil {
			break
		}
		if _, ok := w.f.params[obj]; ok {
			return "param " + obj.Name()
		}
		if obj.Parent() == w.c.p.Types.Scope() {
			return "variable " + obj.Name()
		}
		return "local variable " + obj.Name() + " of " + w.f.name
	}
	return "a lock at " + w.c.pos(e.Pos())
}

func deref(t types.Type) types.Type {
	if p, ok := t.Underlying().(*types.Pointer); ok {
		return p.Elem()
	}
	return t
}

func typeName(t types.Type) string {
	t = deref(t)
	if n, ok := t.(*types.Named); ok {
		return n.Origin().Obj().Name()
	}
	return t.String()
}

// call walks one call: its receiver and arguments first, then the call.
func (w *walker) call(call *ast.CallExpr, s state) {
	if lock, op := w.lockCall(call); op != "" {
		w.expr(receiverOf(call.Fun), s)
		w.lockOp(lock, op)(call.Pos(), s)
		return
	}
	fun := ast.Unparen(call.Fun)
	if id, ok := fun.(*ast.Ident); ok {
		if obj := w.c.p.Info.Uses[id]; obj != nil && w.bound[obj] != nil {
			switch x := w.bound[obj].(type) {
			case *ast.FuncLit:
				w.args(call, s, false)
				w.event(w.c.litFn(x, w.f.name), call, s)
				return
			case *ast.SelectorExpr:
				w.lockOp(w.lockMethod(x))(call.Pos(), s)
				return
			}
		}
	}
	if ix, ok := fun.(*ast.IndexExpr); ok { // an instantiated generic function
		fun = ix.X
	} else if ix, ok := fun.(*ast.IndexListExpr); ok {
		fun = ix.X
	}
	if lit, ok := fun.(*ast.FuncLit); ok { // called where it is written
		w.args(call, s, false)
		w.event(w.c.litFn(lit, w.f.name), call, s)
		return
	}
	w.expr(receiverOf(fun), s)
	async := w.args(call, s, false)
	_ = async
	for _, callee := range w.callees(fun) {
		w.event(callee, call, s)
	}
}

// args walks a call's arguments. A function literal or method value
// passed is taken as called during the call, with s held, unless the
// callee runs it later (see the package comment); inGo: the call is a go
// statement's, so nothing passed runs under s.
func (w *walker) args(call *ast.CallExpr, s state, inGo bool) bool {
	later := inGo || w.runsArgsLater(call)
	for i, a := range call.Args {
		a = ast.Unparen(a)
		var target *fn
		switch x := a.(type) {
		case *ast.FuncLit:
			target = w.c.litFn(x, w.f.name)
		case *ast.SelectorExpr:
			if lock, op := w.lockMethod(x); op != "" {
				// a lock's method passed as a function value (health.go's
				// takeBy(b.mu.TryLock)): taken, at most by trying, during the call
				w.expr(x.X, s)
				if !later {
					w.take(lock, op == "TryLock" || op == "TryRLock", x.Pos(), s)
				}
				continue
			}
			w.expr(x.X, s)
			if sel := w.c.p.Info.Selections[x]; sel != nil && sel.Kind() == types.MethodVal {
				if fs := w.callees(x); len(fs) == 1 {
					target = fs[0]
				}
			}
		case *ast.Ident:
			if obj, ok := w.c.p.Info.Uses[x].(*types.Func); ok {
				target = w.c.decls[obj.Origin()]
			}
		default:
			w.expr(a, s)
			continue
		}
		if target == nil || later || !w.callsParamNow(call, i) {
			continue
		}
		w.event(target, call, s)
	}
	return later
}

// runsArgsLater: the callee is one that starts what it is given later, in
// another goroutine, never during the call.
func (w *walker) runsArgsLater(call *ast.CallExpr) bool {
	var obj types.Object
	switch x := ast.Unparen(call.Fun).(type) {
	case *ast.SelectorExpr:
		if sel := w.c.p.Info.Selections[x]; sel != nil {
			obj = sel.Obj()
		} else {
			obj = w.c.p.Info.Uses[x.Sel]
		}
	case *ast.Ident:
		obj = w.c.p.Info.Uses[x]
	}
	f, ok := obj.(*types.Func)
	if !ok {
		return false
	}
	switch f.FullName() {
	case "time.AfterFunc", "context.AfterFunc", "(*sync.WaitGroup).Go":
		return true
	}
	return false
}

// callsParamNow: a function value passed as argument i may be called
// during the call — unless the callee is the package's and calls that
// parameter only inside go statements.
func (w *walker) callsParamNow(call *ast.CallExpr, i int) bool {
	callees := w.callees(ast.Unparen(call.Fun))
	if len(callees) != 1 {
		return true
	}
	callee := callees[0]
	var param *types.Var
	for v, idx := range callee.params {
		if idx == i {
			param = v
		}
	}
	if param == nil {
		return true
	}
	now := false
	var visit func(n ast.Node, inGo bool)
	visit = func(n ast.Node, inGo bool) {
		ast.Inspect(n, func(n ast.Node) bool {
			switch x := n.(type) {
			case *ast.GoStmt:
				visit(x.Call, true)
				return false
			case *ast.Ident:
				if w.c.p.Info.Uses[x] == param && !inGo {
					now = true // called, or handed on: assumed run now
				}
			}
			return true
		})
	}
	visit(callee.body, false)
	return now
}

// callees are the package's functions a call of fun may run: the one a
// static call names, or every method of the package's types that
// implements the interface method called.
func (w *walker) callees(fun ast.Expr) []*fn {
	switch x := fun.(type) {
	case *ast.Ident:
		if obj, ok := w.c.p.Info.Uses[x].(*types.Func); ok {
			if f := w.c.decls[obj.Origin()]; f != nil {
				return []*fn{f}
			}
		}
	case *ast.SelectorExpr:
		sel := w.c.p.Info.Selections[x]
		if sel == nil {
			if obj, ok := w.c.p.Info.Uses[x.Sel].(*types.Func); ok {
				if f := w.c.decls[obj.Origin()]; f != nil {
					return []*fn{f}
				}
			}
			return nil
		}
		m, ok := sel.Obj().(*types.Func)
		if !ok || (sel.Kind() != types.MethodVal && sel.Kind() != types.MethodExpr) {
			return nil
		}
		recv := m.Type().(*types.Signature).Recv()
		if recv != nil && types.IsInterface(recv.Type()) {
			iface, _ := recv.Type().Underlying().(*types.Interface)
			return w.implementations(iface, m.Name())
		}
		if f := w.c.decls[m.Origin()]; f != nil {
			return []*fn{f}
		}
	}
	return nil
}

func (w *walker) implementations(iface *types.Interface, name string) []*fn {
	if iface == nil {
		return nil
	}
	var out []*fn
	for _, n := range w.c.named {
		for _, t := range []types.Type{n, types.NewPointer(n)} {
			if !types.Implements(t, iface) {
				continue
			}
			obj, _, _ := types.LookupFieldOrMethod(t, true, w.c.p.Types, name)
			if m, ok := obj.(*types.Func); ok {
				if f := w.c.decls[m.Origin()]; f != nil {
					out = append(out, f)
				}
			}
			break
		}
	}
	return out
}

func (w *walker) take(lock string, try bool, pos token.Pos, s state) {
	w.f.events = append(w.f.events, event{take: lock, try: try, pos: pos, held: s.snapshot()})
	if _, ok := s[lock]; !ok {
		s[lock] = pos
	}
}

// event records a call of callee at call with s held, resolving the
// callee's *sync.Mutex parameters to what this call passes.
func (w *walker) event(callee *fn, call *ast.CallExpr, s state) {
	subst := map[string]string{}
	for v, i := range callee.params {
		if i < len(call.Args) && isMutexPointer(v.Type()) {
			subst["param "+v.Name()] = w.lockID(call.Args[i])
		}
	}
	w.f.events = append(w.f.events, event{callee: callee, subst: subst, pos: call.Pos(), held: s.snapshot()})
}

func isMutexPointer(t types.Type) bool {
	p, ok := t.(*types.Pointer)
	if !ok {
		return false
	}
	n, ok := p.Elem().(*types.Named)
	return ok && n.Obj().Pkg() != nil && n.Obj().Pkg().Path() == "sync" &&
		(n.Obj().Name() == "Mutex" || n.Obj().Name() == "RWMutex")
}
