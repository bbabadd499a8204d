package config

// Nearest returns the word of known within edit distance 2 of w, or "" when
// none is that near: the "did you mean" of an unknown-key finding. It is
// exported for the readers of the files a configuration names (the ACL
// file), so that their findings suggest as this package's do.
func Nearest(w string, known []string) string { return nearest(w, known) }
