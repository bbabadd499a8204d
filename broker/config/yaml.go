package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"
)

// Bounds on what a configuration may make the loader hold (invariant 13):
// files are read through a limit, and alias expansion is counted so that a
// "billion laughs" document cannot expand without end.
//
// Aliases cannot multiply the work of reading: the loader descends only
// into the keys the schema defines, and opens each aliased value once per
// place it is read. Merge keys ("<<: *common") do copy pairs per use, so
// the pairs read are counted against maxYAMLNodes; and findings stop
// being recorded at maxFindings, since a broken file can be made to
// produce one per pair.
const (
	MaxFileSize  = 4 << 20
	maxYAMLNodes = 1_000_000
	maxFindings  = 500
)

const includeTag = "!include"

// loader carries the state of one Load: the findings so far and the files
// read (for ordering findings and for naming included files).
type loader struct {
	source    string
	findings  []Finding
	warnings  []Finding
	files     map[string]int // file -> read order
	budget    int            // YAML nodes left before expansion is refused
	overspent bool
	// includes seen anywhere in the main file; the two group lists that may
	// hold them mark theirs used, and the rest are refused at the end.
	includes map[*yaml.Node]string // node -> file
	usedInc  map[*yaml.Node]bool
	// anonExplicit holds every allow_anonymous: true written, refused beside an acl_file.
	anonExplicit []val
	// dlqRetention by queue name, applied to the derived dead-letter channel.
	dlqRetention map[string]dlqRetention
	// dropped counts findings past maxFindings.
	dropped int
	// filterAt holds each channel's written filter, for collision findings.
	filterAt map[string]val
	// at is where each key read is written (Config.At): one entry per key
	// of the schema read, bounded like the reading itself (maxYAMLNodes).
	at map[string]Finding
	// wordSize is the build's int size in bits (strconv.IntSize; a test
	// sets another): what a 32-bit process can address (wordsize.go).
	wordSize int
	// other is set when the file read is not the configuration but one it
	// names (ReadDocument): the messages that speak of the file say so.
	other *otherFile
}

// otherFile is what a message says of a file read through ReadDocument.
type otherFile struct {
	name    string // "an ACL file"
	sizeFix string // what to do about a file past MaxFileSize
}

// remember records where a key read is written, its value as written when
// it is a scalar, for findings made after the reading (Config.At).
func (l *loader) remember(v val, keyLine int) {
	if l.at == nil {
		l.at = map[string]Finding{}
	}
	if _, seen := l.at[v.key]; seen {
		return
	}
	f := Finding{File: v.file, Line: keyLine, Key: v.key}
	if text, ok := v.scalarText(); ok && !v.isNull() {
		f.Value, f.HasValue = text, true
	}
	l.at[v.key] = f
}

// val is a YAML value with what a finding about it needs: where it is
// written and its dotted key.
type val struct {
	n    *yaml.Node // alias-resolved; never nil
	file string
	key  string
}

func (v val) line() int { return v.n.Line }

func (v val) isNull() bool {
	return v.n.Kind == 0 || (v.n.Kind == yaml.ScalarNode && v.n.ShortTag() == "!!null")
}

// scalarText is the value as written, for messages.
func (v val) scalarText() (string, bool) {
	if v.n.Kind == yaml.ScalarNode {
		return v.n.Value, true
	}
	return "", false
}

// record keeps a finding unless maxFindings are already kept.
func (l *loader) record(f Finding) {
	if f.Key == "" {
		f.Key = "(top level)"
	}
	if len(l.findings) >= maxFindings {
		l.dropped++
		return
	}
	l.findings = append(l.findings, f)
}

func (l *loader) add(v val, problem string, args ...any) {
	text, has := v.scalarText()
	if v.isNull() {
		has = false
	}
	l.record(Finding{
		File: v.file, Line: v.line(), Key: v.key, Value: text, HasValue: has,
		Problem: fmt.Sprintf(problem, args...),
	})
}

// addKey reports a finding about a key without repeating its value.
func (l *loader) addKey(file string, line int, key, problem string, args ...any) {
	l.record(Finding{File: file, Line: line, Key: key, Problem: fmt.Sprintf(problem, args...)})
}

func (l *loader) warn(file string, line int, key, problem string, args ...any) {
	l.warnings = append(l.warnings, Finding{File: file, Line: line, Key: key, Problem: fmt.Sprintf(problem, args...)})
}

// documentName is how a message names the kind of file being read.
func (l *loader) documentName() string {
	if l.other != nil {
		return l.other.name
	}
	return "a configuration"
}

// readYAML reads and parses one file into its document's root node, bounded
// by MaxFileSize. A file holding more than one document is refused, since
// the second would be silently ignored.
func (l *loader) readYAML(path, key string, line int, from string) (*yaml.Node, bool) {
	f, err := os.Open(path)
	if err != nil {
		l.addKey(from, line, key, "cannot open %s: %v", path, unwrapPath(err))
		return nil, false
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		l.addKey(from, line, key, "cannot read %s: %v", path, unwrapPath(err))
		return nil, false
	}
	if len(data) > MaxFileSize {
		what, fix := "a configuration file", "split it with !include"
		if l.other != nil {
			what, fix = l.other.name, l.other.sizeFix
		}
		l.addKey(from, line, key, "%s is larger than %s, the most %s may be; %s", path, FormatBytes(MaxFileSize), what, fix)
		return nil, false
	}
	return l.decodeYAML(path, data)
}

// decodeYAML parses one file's bytes into its document's root node.
func (l *loader) decodeYAML(path string, data []byte) (*yaml.Node, bool) {
	if _, seen := l.files[path]; !seen {
		l.files[path] = len(l.files)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Line: 1}, true
		}
		l.record(Finding{File: path, Line: yamlErrorLine(err), Key: "(yaml)",
			Problem: "the file is not valid YAML: " + yamlErrorText(err)})
		return nil, false
	}
	var second yaml.Node
	if err := dec.Decode(&second); err == nil {
		l.record(Finding{File: path, Line: second.Line, Key: "(yaml)",
			Problem: "the file holds a second YAML document (after ---); " + l.documentName() + " is one document"})
	}
	if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
		return doc.Content[0], true
	}
	return &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Line: 1}, true
}

func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// yamlErrorLine digs the line out of a yaml.v3 error ("yaml: line 7: ...").
// The library prints its scanner's lines counted from 1 and its parser's
// counted from 0, so a parser error (an unclosed [ or {, a block mapping
// missing a key) would be placed on the line above the one to fix; its
// problems are told apart by their text, the only form the error has.
func yamlErrorLine(err error) int {
	var line int
	msg := err.Error()
	if i := strings.Index(msg, "line "); i >= 0 {
		fmt.Sscanf(msg[i+5:], "%d", &line)
	}
	if yamlParserProblems[yamlErrorText(err)] {
		line++ // no line at all is the parser's line 0: the first
	}
	return line
}

// yamlParserProblems are the problems yaml.v3 v3.0.1's parser (not its
// scanner) reports with a line: the ones whose line it counts from 0.
var yamlParserProblems = map[string]bool{
	"did not find expected ',' or ']'":       true,
	"did not find expected ',' or '}'":       true,
	"did not find expected '-' indicator":    true,
	"did not find expected <document start>": true,
	"did not find expected key":              true,
	"did not find expected node content":     true,
	"found duplicate %YAML directive":        true,
	"found duplicate %TAG directive":         true,
	"found incompatible YAML document":       true,
	"found undefined tag handle":             true,
}

func yamlErrorText(err error) string {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	if i := strings.Index(msg, ": "); strings.HasPrefix(msg, "line ") && i >= 0 {
		msg = msg[i+2:]
	}
	return msg
}

// resolve follows aliases, charging the expansion budget.
func (l *loader) resolve(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode && i < 64; i++ {
		n = n.Alias
	}
	if n == nil {
		return &yaml.Node{}
	}
	return n
}

func (l *loader) spend(n int, v val) bool {
	if l.overspent {
		return false
	}
	l.budget -= n
	if l.budget < 0 {
		l.overspent = true
		// Kept even past maxFindings: it explains the others.
		what := "the configuration"
		if l.other != nil {
			what = "the file"
		}
		l.findings = append(l.findings, Finding{File: v.file, Line: v.line(), Key: v.key,
			Problem: fmt.Sprintf("%s expands to more than %d values through aliases and merge keys (<<); write it out plainly", what, maxYAMLNodes)})
		return false
	}
	return true
}

// mapping is a YAML mapping being read key by key. Keys read are marked;
// finish refuses the rest as unknown.
type mapping struct {
	l       *loader
	v       val
	keys    []string // in written order, merged keys after explicit ones
	vals    map[string]val
	keyLine map[string]int
	used    map[string]bool
}

// mapOf opens v as a mapping; null reads as an empty mapping (an empty
// block means defaults). Anything else is a finding and ok=false.
func (l *loader) mapOf(v val) (*mapping, bool) {
	m := &mapping{l: l, v: v, vals: map[string]val{}, keyLine: map[string]int{}, used: map[string]bool{}}
	if l.misplacedInclude(v) {
		return m, false
	}
	if v.isNull() {
		return m, true
	}
	if v.n.Kind != yaml.MappingNode {
		l.add(v, "this is a block of keys (a YAML mapping), not %s", kindName(v.n))
		return m, false
	}
	if !l.spend(len(v.n.Content)/2, v) {
		return m, true
	}
	var merges []*yaml.Node
	for i := 0; i+1 < len(v.n.Content); i += 2 {
		kn, vn := v.n.Content[i], v.n.Content[i+1]
		if kn.Kind == yaml.ScalarNode && kn.ShortTag() == "!!merge" {
			merges = append(merges, l.resolve(vn))
			continue
		}
		kn = l.resolve(kn)
		if kn.Kind != yaml.ScalarNode {
			l.addKey(v.file, kn.Line, v.key, "a key is a plain name, not %s", kindName(kn))
			continue
		}
		name := kn.Value
		if prev, dup := m.keyLine[name]; dup {
			l.addKey(v.file, kn.Line, join(v.key, name), "written twice (lines %d and %d); keep one", prev, kn.Line)
			continue
		}
		m.keys = append(m.keys, name)
		m.keyLine[name] = kn.Line
		m.vals[name] = val{n: l.resolve(vn), file: v.file, key: join(v.key, name)}
	}
	// YAML merge keys ("<<: *defaults"): explicit keys win, then earlier merges.
	for _, mn := range merges {
		sources := []*yaml.Node{mn}
		if mn.Kind == yaml.SequenceNode {
			sources = sources[:0]
			for _, s := range mn.Content {
				sources = append(sources, l.resolve(s))
			}
		}
		for _, src := range sources {
			if src.Kind != yaml.MappingNode {
				l.addKey(v.file, src.Line, join(v.key, "<<"), "a merge (<<) takes a mapping or a list of mappings")
				continue
			}
			if !l.spend(len(src.Content)/2, v) {
				return m, true
			}
			for i := 0; i+1 < len(src.Content); i += 2 {
				kn := l.resolve(src.Content[i])
				if kn.Kind != yaml.ScalarNode {
					continue
				}
				if _, have := m.vals[kn.Value]; have {
					continue
				}
				m.keys = append(m.keys, kn.Value)
				m.keyLine[kn.Value] = kn.Line
				m.vals[kn.Value] = val{n: l.resolve(src.Content[i+1]), file: v.file, key: join(v.key, kn.Value)}
			}
		}
	}
	return m, true
}

func join(prefix, key string) string {
	if prefix == "" {
		return key
	}
	return prefix + "." + key
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a block of keys"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.ShortTag() == "!!null" {
			return "empty"
		}
		return fmt.Sprintf("the single value %q", n.Value)
	}
	return "something else"
}

// get returns the value of key and marks it read, remembering where it is
// written (Config.At).
func (m *mapping) get(key string) (val, bool) {
	v, ok := m.vals[key]
	if ok {
		m.used[key] = true
		m.l.remember(v, m.keyLine[key])
	}
	return v, ok
}

// has reports whether key is written, without marking it.
func (m *mapping) has(key string) bool {
	_, ok := m.vals[key]
	return ok
}

// refuse marks key read and reports it with the given problem, when written.
func (m *mapping) refuse(key, problem string, args ...any) {
	if v, ok := m.get(key); ok {
		m.l.add(v, problem, args...)
	}
}

// missing reports a required key absent from this block.
func (m *mapping) missing(key, problem string, args ...any) {
	m.l.addKey(m.v.file, m.v.line(), join(m.v.key, key), "missing; "+problem, args...)
}

// finish refuses every key not read, suggesting a near known one.
func (m *mapping) finish(known ...string) {
	isKnown := map[string]bool{}
	for _, k := range known {
		isKnown[k] = true
	}
	for _, k := range m.keys {
		// A known key left unread was skipped on purpose (its block already
		// has a finding that makes it moot); only unknown keys are refused.
		if m.used[k] || isKnown[k] {
			continue
		}
		if len(m.l.findings) >= maxFindings {
			m.l.dropped++ // not worth a hint nobody will see
			continue
		}
		v := m.vals[k]
		hint := ""
		if s := nearest(k, known); s != "" {
			hint = fmt.Sprintf("; did you mean %s?", s)
		}
		where := m.v.key
		if where == "" {
			where = "the top level"
		}
		m.l.addKey(v.file, m.keyLine[k], v.key, "unknown key%s (%s takes %s)", hint, where, list(known))
	}
}

func list(words []string) string {
	if len(words) == 0 {
		return "no keys"
	}
	sorted := append([]string(nil), words...)
	sort.Strings(sorted)
	if len(sorted) == 1 {
		return sorted[0]
	}
	return strings.Join(sorted[:len(sorted)-1], ", ") + " and " + sorted[len(sorted)-1]
}

// nearest returns the known word within edit distance 2 of w, if any.
func nearest(w string, known []string) string {
	best, bestD := "", 3
	for _, k := range known {
		if d := editDistance(w, k); d < bestD {
			best, bestD = k, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 99
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// items opens v as a list; null is an empty list.
func (l *loader) items(v val) ([]val, bool) {
	if l.misplacedInclude(v) {
		return nil, false
	}
	if v.isNull() {
		return nil, true
	}
	if v.n.Kind != yaml.SequenceNode {
		l.add(v, "this is a list, not %s", kindName(v.n))
		return nil, false
	}
	if !l.spend(len(v.n.Content), v) {
		return nil, false
	}
	out := make([]val, len(v.n.Content))
	for i, n := range v.n.Content {
		out[i] = val{n: l.resolve(n), file: v.file, key: fmt.Sprintf("%s[%d]", v.key, i)}
	}
	return out, true
}

// collectIncludes records every !include node in a tree, so that those
// outside the two places allowed can be refused (docs/configuration.md "How values are written").
func (l *loader) collectIncludes(n *yaml.Node, file string, into map[*yaml.Node]string, depth int) {
	if n == nil || depth > 200 {
		return
	}
	if n.Tag == includeTag {
		into[n] = file
	}
	for _, c := range n.Content {
		l.collectIncludes(c, file, into, depth+1)
	}
}

// group is one entry of a channels: or providers map, wherever written.
type group struct {
	name    string
	keyLine int
	v       val
}

// groups reads a block that is either a mapping of name -> settings or a
// list whose entries are "!include <path>" or inline mappings (docs/configuration.md "How values are written"). Included files hold only the mapping and may not include again.
func (l *loader) groups(v val, what string) []group {
	var out []group
	fromMap := func(m *mapping) {
		for _, k := range m.keys {
			m.used[k] = true
			out = append(out, group{name: k, keyLine: m.keyLine[k], v: m.vals[k]})
		}
	}
	if l.misplacedInclude(v) {
		return nil
	}
	switch {
	case v.isNull():
		return nil
	case v.n.Kind == yaml.MappingNode:
		if m, ok := l.mapOf(v); ok {
			fromMap(m)
		}
		return out
	case v.n.Kind != yaml.SequenceNode:
		l.add(v, "this is a mapping of %s names to settings, or a list of !include files and inline groups", what)
		return nil
	}
	entries, _ := l.items(v)
	seenFiles := map[string]int{}
	for _, e := range entries {
		if e.n.Tag == includeTag {
			l.usedInc[e.n] = true
			path, ok := l.includePath(e, v.file)
			if !ok {
				continue
			}
			if prev, dup := seenFiles[path]; dup {
				l.add(e, "%s is included twice (lines %d and %d); include it once", path, prev, e.line())
				continue
			}
			seenFiles[path] = e.line()
			root, ok := l.readYAML(path, e.key, e.line(), e.file)
			if !ok {
				continue
			}
			nested := map[*yaml.Node]string{}
			l.collectIncludes(root, path, nested, 0)
			for n := range nested {
				l.record(Finding{File: path, Line: n.Line, Key: "!include",
					Value: n.Value, HasValue: true,
					Problem: "an included file cannot include another; list every file in the main configuration"})
			}
			if len(nested) > 0 {
				continue
			}
			iv := val{n: root, file: path, key: v.key}
			if root.Kind != yaml.MappingNode && !iv.isNull() {
				l.add(iv, "an included file holds just the mapping of %s names to settings", what)
				continue
			}
			if m, ok := l.mapOf(iv); ok {
				fromMap(m)
			}
			continue
		}
		if e.n.Kind != yaml.MappingNode {
			l.add(e, "each list entry is \"!include <path>\" or an inline mapping of %s names to settings", what)
			continue
		}
		ev := e
		ev.key = v.key
		if m, ok := l.mapOf(ev); ok {
			fromMap(m)
		}
	}
	return out
}

// includePath resolves an include against the including file's directory.
func (l *loader) includePath(e val, from string) (string, bool) {
	p := e.n.Value
	switch {
	case e.n.Kind != yaml.ScalarNode || p == "":
		l.add(e, "!include takes a file path")
		return "", false
	case strings.ContainsAny(p, "*?["):
		l.add(e, "!include takes one file, not a pattern; list each file")
		return "", false
	}
	if !filepath.IsAbs(p) {
		// docs/configuration.md "How values are written": relative to the including file, never the working directory.
		p = filepath.Join(filepath.Dir(from), p)
	}
	p = filepath.Clean(p)
	if p == filepath.Clean(l.source) {
		l.add(e, "includes the main configuration file itself")
		return "", false
	}
	return p, true
}

// misplacedInclude refuses an !include where a value is read directly
// (docs/configuration.md "How values are written": only group lists take them).
func (l *loader) misplacedInclude(v val) bool {
	if v.n.Tag != includeTag {
		return false
	}
	if l.other != nil {
		l.add(v, "!include is read in the configuration only; write %s out whole", l.other.name)
		return true
	}
	l.usedInc[v.n] = true
	l.add(v, "!include is allowed only as a list entry under channels: or broker.storage.providers")
	return true
}
