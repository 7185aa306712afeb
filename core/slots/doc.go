// Package slots owns the slot decisions of service runtime production: the desired attempt key, the
// pure decision table of one slot, the service planner, verdicts, sweep timing and runtime specs.
//
// Everything here is a decider in the sense of docs/reconciliation.md: inputs are plain values read
// from the store, outputs are decisions. No function in this package performs I/O, reads a clock or
// starts a goroutine; the caller (core/reconciler) reads, calls, and commits each acting slot with one
// compare-and-set after [CheckCommit] confirmed the decision against fresh reads.
package slots
