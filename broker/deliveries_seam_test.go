package broker

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The delivery seam holds only while nothing goes around it
// (rfcs/delivery-seam.md): the session's packet identifiers are taken,
// released and acknowledged in deliveries.go alone, and only it writes a
// delivery to a connection. This reads the package's own source and names
// every call that goes around it, by file and line.
func TestDeliverySeam_NothingGoesAroundIt(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	// What a selector chain may be, and the only files that may use it
	// ("": none).
	rules := []struct {
		chain, only, why string
	}{
		{"NextPacketID", "", "the substrate's identifiers are another space; deliveries.reserve takes the session's"},
		{"Inflight.Set", "", "the substrate's table holds the client's own QoS 2 exchanges only"},
		{"Inflight.Delete", "qos2.go", "only the client's own QoS 2 exchanges are deleted there (qos2.go)"},
		{"Net.Conn.Write", "deliveries.go", "a delivery is written through the session's deliveries"},
		{"deliv.table", "deliveries.go", "the ack table is the deliveries' own"},
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, name, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			chain := selectorChain(sel)
			for _, r := range rules {
				if (chain == r.chain || strings.HasSuffix(chain, "."+r.chain)) && name != r.only {
					t.Errorf("%s: %s: %s", fset.Position(sel.Pos()), chain, r.why)
				}
			}
			return true
		})
	}
}

// selectorChain spells a selector expression a.b.c as written, calls and
// indexes left out ("x.y().z" is "x.y.z").
func selectorChain(e ast.Expr) string {
	switch v := e.(type) {
	case *ast.Ident:
		return v.Name
	case *ast.SelectorExpr:
		return selectorChain(v.X) + "." + v.Sel.Name
	case *ast.CallExpr:
		return selectorChain(v.Fun)
	case *ast.IndexExpr:
		return selectorChain(v.X)
	case *ast.ParenExpr:
		return selectorChain(v.X)
	}
	return "?"
}
