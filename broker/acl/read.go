package acl

import (
	"sort"
	"strings"

	"saguin.dev/broker/config"
)

// The ACL file is read by the configuration loader's own machinery
// (config.Document): the same bounds (config.MaxFileSize; a node budget
// charged per mapping pair and list item visited, so that aliases and
// merge keys cannot make the walk unbounded; at most 500 findings kept)
// and the same YAML rules and messages as the configuration's.

// fileName and tooLarge are what the loader's messages say of this file.
const (
	fileName = "an ACL file"
	tooLarge = "give roles to patterns rather than listing every user"
)

// read reads the ACL file at path and checks it.
func read(path string, e env) (*ACL, []config.Finding) {
	d, root, ok := config.ReadDocument(path, fileName, tooLarge)
	if !ok {
		return nil, d.Findings()
	}
	return parse(d, root, e)
}

// hasControl reports the characters no name or topic of ours may hold:
// U+0000-U+001F and U+007F-U+009F (docs/configuration.md "Password files and `saguin --passwd`" refuses them in a user
// name; MQTT refuses U+0000 in any string).
func hasControl(s string) bool {
	return strings.ContainsFunc(s, func(c rune) bool { return c < 0x20 || (c >= 0x7f && c <= 0x9f) })
}

// andList renders "a, b and c", sorted.
func andList(words []string) string {
	sorted := append([]string(nil), words...)
	sort.Strings(sorted)
	if len(sorted) <= 1 {
		return strings.Join(sorted, "")
	}
	return strings.Join(sorted[:len(sorted)-1], ", ") + " and " + sorted[len(sorted)-1]
}

// orList renders "a, b or c" in the order given.
func orList(words []string) string {
	if len(words) <= 1 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
