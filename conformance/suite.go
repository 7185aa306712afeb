package conformance

import (
	"context"
	"testing"
)

// Case is one named check of a suite defined outside this package, such as
// the node-protocol suite of conformance/node. Run reports through its T.
type Case struct {
	Name string
	Run  func(t T)
}

// RunCases runs cases as subtests of t, in order (for `go test`).
func RunCases(t *testing.T, cases []Case) {
	t.Helper()
	runTesting(t, toTestCases(cases))
}

// CheckCases runs cases one after another outside `go test` and returns the
// report of suite against target (a binary path or a server URL).
func CheckCases(ctx context.Context, suite, target string, cases []Case) *Report {
	return runReport(ctx, suite, target, toTestCases(cases))
}

func toTestCases(cases []Case) []testCase {
	out := make([]testCase, len(cases))
	for i, c := range cases {
		out[i] = testCase{name: c.Name, run: c.Run}
	}
	return out
}
