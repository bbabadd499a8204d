package config

import (
	"fmt"

	"gopkg.in/yaml.v3"
)

// Document is a YAML file a configuration names (the ACL file, docs/configuration.md "The ACL file"), read by the loader's own machinery, so that its findings read
// as the configuration's do: the same bounds (MaxFileSize, the node budget
// that stops alias and merge expansion, at most 500 findings), the same
// YAML rules (one document, anchors, aliases and merge keys, no tag but
// the standard ones, a key written twice refused) and the same messages.
// The reader of the file walks its own schema through Block, Items and
// Text, and adds its own findings with Add and AddKey.
type Document struct {
	l    *loader
	path string
}

// Node is one value of a Document, with where it is written and its
// dotted key.
type Node struct{ v val }

// ReadDocument reads the file at path through MaxFileSize; name says what
// the file is in messages ("an ACL file"), sizeFix what to do about one
// past the bound. ok is false when there is nothing to walk (the file
// cannot be read, or is not YAML): the findings say why.
func ReadDocument(path, name, sizeFix string) (doc *Document, root Node, ok bool) {
	d := newDocument(path, name, sizeFix)
	n, ok := d.l.readYAML(path, "(file)", 0, path)
	return d, d.node(n), ok
}

// ParseDocument is ReadDocument on bytes already read (the fuzz targets').
func ParseDocument(path string, data []byte, name string) (doc *Document, root Node, ok bool) {
	d := newDocument(path, name, "")
	n, ok := d.l.decodeYAML(path, data)
	return d, d.node(n), ok
}

func newDocument(path, name, sizeFix string) *Document {
	return &Document{path: path, l: &loader{
		source: path, files: map[string]int{}, budget: maxYAMLNodes,
		includes: map[*yaml.Node]string{}, usedInc: map[*yaml.Node]bool{},
		other: &otherFile{name: name, sizeFix: sizeFix},
	}}
}

func (d *Document) node(n *yaml.Node) Node {
	if n == nil {
		n = &yaml.Node{}
	}
	return Node{val{n: n, file: d.path}}
}

// Findings are the document's findings so far, in line order, with a
// count of those past the bound.
func (d *Document) Findings() []Finding {
	out := append([]Finding(nil), d.l.findings...)
	sortFindings(out, d.l.files)
	if d.l.dropped > 0 {
		out = append(out, Finding{File: d.path, Key: "(more)",
			Problem: fmt.Sprintf("%d further findings not shown; fix these first", d.l.dropped)})
	}
	return out
}

// HasFindings reports whether any finding was made.
func (d *Document) HasFindings() bool { return len(d.l.findings) > 0 || d.l.dropped > 0 }

// Add is a finding about n, repeating its value when it is a scalar.
func (d *Document) Add(n Node, problem string, args ...any) { d.l.add(n.v, problem, args...) }

// AddKey is a finding about a key, without a value.
func (d *Document) AddKey(line int, key, problem string, args ...any) {
	d.l.addKey(d.path, line, key, problem, args...)
}

// Spend charges count values read against the document's budget; false
// (with one finding saying why) once it is spent. The walk charges the
// pairs and items it opens; a reader charges what it derives from a
// value, such as a filter's brace expansions, so that aliases cannot
// multiply that past the bound either.
func (d *Document) Spend(count int, n Node) bool { return d.l.spend(count, n.v) }

// Items opens n as a list; empty is a list of none.
func (d *Document) Items(n Node) ([]Node, bool) {
	vs, ok := d.l.items(n.v)
	out := make([]Node, len(vs))
	for i, v := range vs {
		out[i] = Node{v}
	}
	return out, ok
}

// Text reads a plain value: not a block, a list or empty, no tag of its
// own, no control character; want says what to write instead.
func (d *Document) Text(n Node, want string) (string, bool) { return d.l.str(n.v, want) }

// Block is a mapping of a Document read key by key; Finish refuses the
// keys never asked for.
type Block struct{ m *mapping }

// Block opens n as a mapping; empty reads as a mapping with no keys.
func (d *Document) Block(n Node) (*Block, bool) {
	m, ok := d.l.mapOf(n.v)
	return &Block{m}, ok
}

// Keys are the keys written, in file order (merged ones after).
func (b *Block) Keys() []string { return b.m.keys }

// Has reports whether key is written, without asking for it.
func (b *Block) Has(key string) bool { return b.m.has(key) }

// Get returns key's value and marks it asked for.
func (b *Block) Get(key string) (Node, bool) {
	v, ok := b.m.get(key)
	return Node{v}, ok
}

// KeyLine is the line key is written on.
func (b *Block) KeyLine(key string) int { return b.m.keyLine[key] }

// Finish refuses every key not asked for and not among known, suggesting
// a near known one.
func (b *Block) Finish(known ...string) { b.m.finish(known...) }

// YAML is the node (aliases followed).
func (n Node) YAML() *yaml.Node { return n.v.n }

// Key is the node's dotted key, like "roles.ops[2].allow".
func (n Node) Key() string { return n.v.key }

// Line is the line the node is written on.
func (n Node) Line() int { return n.v.line() }

// IsNull reports an empty value.
func (n Node) IsNull() bool { return n.v.isNull() }

// WithKey is the node under another dotted key, for a reader whose keys
// are names needing quotes ("users[\"*.example.com\"]").
func (n Node) WithKey(key string) Node {
	n.v.key = key
	return n
}

// Path is the file the document was read from.
func (d *Document) Path() string { return d.path }
