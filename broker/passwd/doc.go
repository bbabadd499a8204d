// Package passwd reads, checks, verifies and writes password files in
// Mosquitto's format: the MQTT password files of docs/configuration.md "Password files and `saguin --passwd`" and the
// operator credential files of docs/operations.md "Operators". rfcs/passwords.md records
// the decisions this package takes where the specification is silent.
//
// A file is one user a line, "user:hash", and an operator file may add a
// third field, "user:hash:/metrics,/v1/operations", naming the routes the
// user reaches. Two hash types are read: "$6$" (salted SHA-512) and "$7$"
// (PBKDF2-HMAC-SHA512, what mosquitto_passwd 2.0 writes); new entries are
// written "$7$" with DefaultIterations. Anything that would silently lock a
// user out — an argon2id hash, a plain-text password, the same user twice,
// a line with no ':' — is a load error naming the file and the line.
//
// The two halves:
//
//   - Load reads a file into a Table, the immutable value the broker
//     authenticates against; it returns a whole new Table or an error,
//     never part of one, so a re-read (SIGUSR1) swaps Tables or keeps the
//     old one. Table.Authenticate does the same work for every name, known
//     or not, so its timing does not tell which names exist.
//   - ReadFile reads a file into a File, which keeps every line as it was
//     written so that saguin --passwd can add, change or delete one user
//     and write the rest back byte for byte (File.Write: atomic, the
//     file's mode and owner kept).
//
// Routes: OperatorRoutes is the one list of the operations listener's
// routes a scope may name, and RouteReaches answers whether a scope's
// route reaches a request path, by path segment.
package passwd
