// Package rollout owns the store side of service reconciliation: runtime specs, slot sets and
// verdicts, and the sweep that produces workloads from them with the pure deciders of
// core/slots (docs/reconciliation.md).
package rollout
