//go:build race

package sqlite

// raceDetector: the race detector slows SQLite's transpiled C about tenfold.
const raceDetector = true
