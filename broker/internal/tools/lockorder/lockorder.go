// Package lockorder checks a package's mutex nesting against a declared lock
// order, by a walk of the package's own call graph. broker's doc.go
// declares the order; broker/lockorder_test.go runs this walk on the
// broker package and fails on what it finds.
//
// What it finds. A lock is a sync.Mutex or sync.RWMutex named by where it
// lives: "T.f" for field f of a struct type T of the package (c.sess.mu
// on a *session is session.mu, whichever variable reaches it). Every
// function (and every function literal, as a function of its own) is
// walked in source order with the set of locks it may hold: Lock and RLock
// add one, Unlock and RUnlock remove it, a deferred Unlock keeps it to the
// function's end; the two arms of an if, each case of a switch or select
// and a loop's body are walked apart and joined by union (a lock held on
// any path counts as held), and a path that returns, panics, breaks,
// continues or jumps is not joined. Each function's summary is every lock
// it may take, itself or through the static calls it makes, found to a
// fixed point, with one witness path for each. A finding is a lock taken,
// directly or down such a path, while the function holds one that the order
// does not put above it: a lower or equal rank (equal includes the same
// lock twice, and two of one rank, which the order declares never nest), or
// either lock missing from the order.
//
// Which calls are followed, conservatively:
//   - static calls to the package's functions and methods;
//   - a call through an interface: every method of the package's own types
//     that implements that interface method (a class-hierarchy
//     over-approximation: an ackTarget call is followed into every
//     target's acked);
//   - a function literal or method value passed as an argument is taken to
//     run during that call, with the caller's locks held — unless the
//     callee is a function of the package that calls that parameter only
//     from a go statement, or is time.AfterFunc, context.AfterFunc or
//     sync.WaitGroup.Go; then it runs later, holding nothing of the
//     caller's, and is walked only as a function of its own;
//   - a deferred call is taken as made where the defer statement stands;
//   - a *sync.Mutex parameter is resolved at each call site to the lock
//     the caller passes (pumpRun.stopUnder(&c.mu) takes consumer.mu);
//   - a local variable bound to a function literal or to a lock's method
//     value (unlock := mu.RUnlock) is called as what it is bound to;
//   - a callee that unlocks a lock it did not take lets go of its
//     caller's (clientConn.flushOwn): what it takes after that is not
//     counted against that lock. The caller's own walk still counts the
//     lock as held after such a call, which can only add findings.
//
// A callee's exit state is not carried back the other way either: a lock a
// function returns holding is not held in its caller's walk, which could
// hide a finding. Result.Leaks lists every function that may return
// holding a lock it took, so a caller of the checker can hold that list
// to the few it has read.
//
// Not followed: calls through a function value held in a variable or a
// field, and calls into other packages (the substrate's locks, a storage
// provider's). A TryLock or TryRLock makes its lock held but is never
// itself a finding: it cannot wait, so it cannot be one side of a
// deadlock.
package lockorder

import (
	"fmt"
	"go/ast"
	"go/token"
	"go/types"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// Order is a lock order: each lock's rank, outermost 1. A lock may be taken
// while holding only locks of a smaller rank.
type Order map[string]int

// Finding is one nesting the order forbids.
type Finding struct {
	Func  string   // the function holding Held
	Held  string   // the lock held
	At    string   // where Held was taken (file:line)
	Taken string   // the lock taken under it
	Path  []string // from Func's call to the Lock call
	Why   string
}

func (f Finding) String() string {
	return fmt.Sprintf("%s holds %s (taken at %s) and takes %s: %s; %s",
		f.Func, f.Held, f.At, f.Taken, strings.Join(f.Path, " → "), f.Why)
}

// Nesting is one pair of locks the walk saw nested, with a witness, whether
// or not the order allows it.
type Nesting struct {
	Held, Taken string
	Witness     string
}

// Result is what Check found.
type Result struct {
	Findings []Finding
	Nestings []Nesting // every held → taken pair seen, sorted
	Locks    []string  // every lock the walk saw taken, sorted
	Funcs    int       // functions and literals walked
	Leaks    []string  // functions that may return holding a lock they took
}

type heldLock struct {
	name string
	pos  token.Pos
}

type event struct {
	take   string // a lock taken directly; "" for a call
	try    bool
	callee *fn
	subst  map[string]string // the callee's *sync.Mutex parameters → the caller's locks
	pos    token.Pos
	held   []heldLock
}

type fn struct {
	name   string
	body   *ast.BlockStmt
	ftype  *ast.FuncType
	params map[*types.Var]int // each parameter's index
	events []event
	acq    map[string]acquisition // by key(): every lock it may take
	done   bool
}

type checker struct {
	p     *Package
	order Order
	decls map[*types.Func]*fn
	lits  map[*ast.FuncLit]*fn
	all   []*fn
	named []*types.Named
	queue []*fn
	leaks map[string]bool
}

// Check walks p and judges every nesting it finds against order.
func Check(p *Package, order Order) Result {
	c := &checker{p: p, order: order, decls: map[*types.Func]*fn{}, lits: map[*ast.FuncLit]*fn{}, leaks: map[string]bool{}}
	for _, name := range p.Types.Scope().Names() {
		if tn, ok := p.Types.Scope().Lookup(name).(*types.TypeName); ok {
			if n, ok := tn.Type().(*types.Named); ok && !types.IsInterface(n) {
				c.named = append(c.named, n)
			}
		}
	}
	for _, f := range p.Files {
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			obj, _ := p.Info.Defs[fd.Name].(*types.Func)
			if obj == nil {
				continue
			}
			c.decls[obj] = c.newFn(funcName(fd), fd.Body, fd.Type)
		}
	}
	for _, f := range c.all {
		c.queue = append(c.queue, f)
	}
	for len(c.queue) > 0 {
		f := c.queue[0]
		c.queue = c.queue[1:]
		if f.done {
			continue
		}
		f.done = true
		w := &walker{c: c, f: f, deferred: map[string]bool{}, bound: map[types.Object]ast.Expr{}}
		if end := w.block(f.body.List, state{}); end != nil {
			w.exit(end)
		}
	}
	c.summarize()
	return c.judge()
}

func (c *checker) newFn(name string, body *ast.BlockStmt, ft *ast.FuncType) *fn {
	f := &fn{name: name, body: body, ftype: ft, params: map[*types.Var]int{}, acq: map[string]acquisition{}}
	i := 0
	for _, fl := range ft.Params.List {
		if len(fl.Names) == 0 {
			i++
			continue
		}
		for _, n := range fl.Names {
			if v, ok := c.p.Info.Defs[n].(*types.Var); ok {
				f.params[v] = i
			}
			i++
		}
	}
	c.all = append(c.all, f)
	return f
}

// litFn is the function a literal is, walked on its own with nothing held.
func (c *checker) litFn(lit *ast.FuncLit, parent string) *fn {
	if f := c.lits[lit]; f != nil {
		return f
	}
	f := c.newFn("a literal in "+parent+" ("+c.pos(lit.Pos())+")", lit.Body, lit.Type)
	c.lits[lit] = f
	c.queue = append(c.queue, f)
	return f
}

func (c *checker) pos(p token.Pos) string {
	ps := c.p.Fset.Position(p)
	return fmt.Sprintf("%s:%d", filepath.Base(ps.Filename), ps.Line)
}

// acquisition is one lock a function may take, with the locks of its
// caller's it has let go of by then (not held under it) and a witness path.
type acquisition struct {
	lock     string
	released []string
	path     []string
}

func (a acquisition) key() string { return a.lock + "|" + strings.Join(a.released, ",") }

// releasedAt lists the release marks of a snapshot.
func releasedAt(held []heldLock) []string {
	var out []string
	for _, h := range held {
		if l, ok := isReleased(h.name); ok {
			out = append(out, l)
		}
	}
	return out
}

// through is what a callee's acquisition is in its caller, called by e.
func (c *checker) through(e event, a acquisition) acquisition {
	rel := map[string]bool{}
	for _, r := range a.released {
		rel[substitute(r, e.subst)] = true
	}
	for _, r := range releasedAt(e.held) {
		rel[r] = true
	}
	return acquisition{
		lock:     substitute(a.lock, e.subst),
		released: sortedKeys(rel),
		path:     append([]string{"calls " + e.callee.name + " at " + c.pos(e.pos)}, a.path...),
	}
}

// taken is what event e takes: the lock itself, or its callee's locks.
func (c *checker) taken(e event) []acquisition {
	if e.take != "" {
		if e.try {
			return nil
		}
		return []acquisition{{lock: e.take, released: releasedAt(e.held), path: []string{"takes " + e.take + " at " + c.pos(e.pos)}}}
	}
	var out []acquisition
	for _, k := range sortedKeys(e.callee.acq) {
		out = append(out, c.through(e, e.callee.acq[k]))
	}
	return out
}

// summarize finds each function's locks, its own and its callees', to a
// fixed point (recursion included).
func (c *checker) summarize() {
	for changed := true; changed; {
		changed = false
		for _, f := range c.all {
			for _, e := range f.events {
				for _, a := range c.taken(e) {
					if _, ok := f.acq[a.key()]; ok {
						continue
					}
					f.acq[a.key()] = a
					changed = true
				}
			}
		}
	}
}

func substitute(lock string, subst map[string]string) string {
	if strings.HasPrefix(lock, "param ") {
		if s, ok := subst[lock]; ok {
			return s
		}
		return "a lock passed as " + strings.TrimPrefix(lock, "param ")
	}
	return lock
}

func (c *checker) judge() Result {
	var res Result
	seen := map[[3]string]bool{}
	nest := map[[2]string]string{}
	locks := map[string]bool{}
	for _, f := range c.all {
		for _, e := range f.events {
			if e.take != "" {
				locks[e.take] = true
			}
			for _, a := range c.taken(e) {
				for _, h := range e.held {
					if _, rel := isReleased(h.name); rel || slices.Contains(a.released, h.name) {
						continue
					}
					if _, ok := nest[[2]string{h.name, a.lock}]; !ok {
						nest[[2]string{h.name, a.lock}] = f.name + ": " + strings.Join(a.path, " → ")
					}
					why := c.forbids(h.name, a.lock)
					if why == "" || seen[[3]string{f.name, h.name, a.lock}] {
						continue
					}
					seen[[3]string{f.name, h.name, a.lock}] = true
					res.Findings = append(res.Findings, Finding{Func: f.name, Held: h.name, At: c.pos(h.pos), Taken: a.lock, Path: a.path, Why: why})
				}
			}
		}
	}
	for k, w := range nest {
		res.Nestings = append(res.Nestings, Nesting{Held: k[0], Taken: k[1], Witness: w})
	}
	sort.Slice(res.Nestings, func(i, j int) bool {
		a, b := res.Nestings[i], res.Nestings[j]
		if a.Held != b.Held {
			return a.Held < b.Held
		}
		return a.Taken < b.Taken
	})
	sort.Slice(res.Findings, func(i, j int) bool { return res.Findings[i].String() < res.Findings[j].String() })
	res.Locks = sortedKeys(locks)
	res.Funcs = len(c.all)
	res.Leaks = sortedKeys(c.leaks)
	return res
}

// forbids says why the order forbids taking taken while holding held, or
// "" when it allows it.
func (c *checker) forbids(held, taken string) string {
	rh, okh := c.order[held]
	rt, okt := c.order[taken]
	switch {
	case !okt:
		return taken + " is not in the lock order"
	case !okh:
		return held + " is not in the lock order"
	case held == taken:
		return "the same lock twice (two of its instances, or a self-deadlock)"
	case rt == rh:
		return fmt.Sprintf("both are of rank %d, which never nest", rh)
	case rt < rh:
		return fmt.Sprintf("%s (rank %d) is above %s (rank %d) in the order", taken, rt, held, rh)
	}
	return ""
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// funcName is Type.method or the function's name.
func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	t := fd.Recv.List[0].Type
	if st, ok := t.(*ast.StarExpr); ok {
		t = st.X
	}
	switch x := t.(type) {
	case *ast.IndexExpr:
		t = x.X
	case *ast.IndexListExpr:
		t = x.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name + "." + fd.Name.Name
	}
	return fd.Name.Name
}
