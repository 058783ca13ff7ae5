// Package replay applies an op log to an engine through its public API and checks every
// query that carries an expected answer. It backs `kvindex replay` and the conformance
// tests. Parsing happens before Run and is never timed.
package replay
