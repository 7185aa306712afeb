// Package conformance is the suite that validates a provider plugin, a
// runtime driver or a node-network plugin against its contract in abi/
// (docs/plugins.md sections 6 and 7.7).
//
// A vendor calls [RunProvider], [RunRuntimeDriver] or [RunNetwork] from `go
// test`; the CLI `berth conformance plugin PATH` calls [CheckProvider],
// [CheckRuntimeDriver] or [CheckNetwork] on a built binary and prints (or
// writes as JUnit) the [Report]. Each case is a named subtest; on a binary
// the first is "launch", and when the binary does not start every other
// case is skipped with one line. Cases that need a capability the plugin
// does not advertise are skipped naming it ([Result.Capability]), unless the
// configuration requires it (RequireCapabilities, the CLI's
// --require-capability), which makes them fail; cases that need a
// subprocess when the plugin is given as a factory are skipped and say why.
// A provider whose state lives outside its state directory gets a reset
// before every case (ProviderConfig.Reset, the CLI's --reset-command). A
// failure says what the suite did, what it expected and what it got.
package conformance

import (
	"context"
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// T is what a case needs of its test: *testing.T satisfies it, and so does
// the runner of [CheckProvider]. Fatalf and Skipf end the case's goroutine.
type T interface {
	Helper()
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Skipf(format string, args ...any)
	Cleanup(func())
	TempDir() string
	Context() context.Context
}

var _ T = (*testing.T)(nil)

// testCase is one named check.
type testCase struct {
	name string
	run  func(t T)
}

// Status is the outcome of one case.
type Status string

// Case outcomes.
const (
	Passed  Status = "passed"
	Failed  Status = "failed"
	Skipped Status = "skipped"
)

// Result is the outcome of one case: its messages are the failures (or the
// reason it was skipped) and logs, in order.
type Result struct {
	Name     string
	Status   Status
	Messages []string
	Duration time.Duration
	// Capability names the capability the case needs and the plugin does
	// not advertise ("durable_state", [ProviderCapabilities]) when the case
	// was skipped for it, or failed because it was required; "" otherwise.
	Capability string
}

// Report is the outcome of a whole run.
type Report struct {
	Suite   string // "provider", "runtime" or "network"
	Plugin  string // the binary's path
	Results []Result
}

// Failed returns the names of the failed cases, sorted.
func (r *Report) Failed() []string { return r.names(Failed) }

// Skipped returns the names of the skipped cases, sorted.
func (r *Report) Skipped() []string { return r.names(Skipped) }

// SkippedForCapability maps each case skipped because the plugin does not
// advertise a capability to that capability's name.
func (r *Report) SkippedForCapability() map[string]string {
	out := map[string]string{}
	for _, c := range r.Results {
		if c.Status == Skipped && c.Capability != "" {
			out[c.Name] = c.Capability
		}
	}
	return out
}

// OK reports whether no case failed.
func (r *Report) OK() bool { return len(r.Failed()) == 0 }

func (r *Report) names(s Status) []string {
	var out []string
	for _, c := range r.Results {
		if c.Status == s {
			out = append(out, c.Name)
		}
	}
	sort.Strings(out)
	return out
}

// WriteText writes one line per case ("PASS name (12ms)") followed by its
// messages, a summary line, and, when cases were skipped because the plugin
// does not advertise a capability, one more line naming each case and the
// capability ("skipped for want of a capability: durable_state (needs
// durable_state)").
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	for _, c := range r.Results {
		word := map[Status]string{Passed: "PASS", Failed: "FAIL", Skipped: "SKIP"}[c.Status]
		fmt.Fprintf(&b, "%s %s (%s)\n", word, c.Name, c.Duration.Round(time.Millisecond))
		for _, m := range c.Messages {
			fmt.Fprintf(&b, "    %s\n", strings.ReplaceAll(m, "\n", "\n    "))
		}
	}
	fmt.Fprintf(&b, "%s conformance of %s: %d passed, %d failed, %d skipped\n", r.Suite, r.Plugin,
		len(r.names(Passed)), len(r.Failed()), len(r.Skipped()))
	var caps []string
	for _, c := range r.Results {
		if c.Status == Skipped && c.Capability != "" {
			caps = append(caps, fmt.Sprintf("%s (needs %s)", c.Name, c.Capability))
		}
	}
	if len(caps) > 0 {
		fmt.Fprintf(&b, "skipped for want of a capability the plugin does not advertise: %s; --require-capability NAME makes such a skip a failure\n",
			strings.Join(caps, ", "))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteJUnit writes the report as a JUnit XML test suite, as CI systems read it.
func (r *Report) WriteJUnit(w io.Writer) error {
	type failure struct {
		Message string `xml:"message,attr"`
		Text    string `xml:",chardata"`
	}
	type skipped struct {
		Message string `xml:"message,attr"`
	}
	type tc struct {
		Name      string   `xml:"name,attr"`
		Classname string   `xml:"classname,attr"`
		Time      string   `xml:"time,attr"`
		Failure   *failure `xml:"failure,omitempty"`
		Skipped   *skipped `xml:"skipped,omitempty"`
	}
	type suite struct {
		XMLName  xml.Name `xml:"testsuite"`
		Name     string   `xml:"name,attr"`
		Tests    int      `xml:"tests,attr"`
		Failures int      `xml:"failures,attr"`
		Skipped  int      `xml:"skipped,attr"`
		Cases    []tc     `xml:"testcase"`
	}
	s := suite{Name: "berth-conformance-" + r.Suite, Tests: len(r.Results), Failures: len(r.Failed()), Skipped: len(r.Skipped())}
	for _, c := range r.Results {
		x := tc{Name: c.Name, Classname: s.Name, Time: fmt.Sprintf("%.3f", c.Duration.Seconds())}
		msg := strings.Join(c.Messages, "\n")
		switch c.Status {
		case Failed:
			x.Failure = &failure{Message: junitMessage(c.Messages), Text: msg}
		case Skipped:
			x.Skipped = &skipped{Message: msg}
		}
		s.Cases = append(s.Cases, x)
	}
	if _, err := io.WriteString(w, xml.Header); err != nil {
		return err
	}
	enc := xml.NewEncoder(w)
	enc.Indent("", "  ")
	if err := enc.Encode(s); err != nil {
		return fmt.Errorf("write junit: %w", err)
	}
	_, err := io.WriteString(w, "\n")
	return err
}

// junitMessage is the one-line summary of a failed case: its first message
// (the did, want and got of its first failure) with each line's spacing
// collapsed and the lines joined by "; ", as CI systems show the message
// attribute on one line.
func junitMessage(messages []string) string {
	if len(messages) == 0 {
		return ""
	}
	var lines []string
	for _, l := range strings.Split(messages[0], "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			lines = append(lines, strings.Join(f, " "))
		}
	}
	return strings.Join(lines, "; ")
}

// runTesting runs cases as subtests of t and returns their results.
func runTesting(t *testing.T, cases []testCase) []Result {
	t.Helper()
	out := make([]Result, 0, len(cases))
	for _, c := range cases {
		var res Result
		t.Run(c.name, func(st *testing.T) {
			rt := &recT{T: st}
			start := time.Now()
			// Deferred: Fatalf and Skipf end the subtest's goroutine.
			defer func() { res = rt.result(c.name, time.Since(start)) }()
			c.run(rt)
		})
		out = append(out, res)
	}
	return out
}

// runReport runs cases one after another outside `go test` and collects a report.
func runReport(ctx context.Context, suite, plugin string, cases []testCase) *Report {
	r := &Report{Suite: suite, Plugin: plugin}
	for _, c := range cases {
		ct := &caseT{ctx: ctx}
		start := time.Now()
		done := make(chan struct{})
		go func() {
			defer close(done)
			defer ct.cleanup()
			c.run(ct)
		}()
		<-done
		r.Results = append(r.Results, Result{Name: c.name, Status: ct.status(), Messages: ct.messages(), Duration: time.Since(start), Capability: ct.capabilityName()})
	}
	return r
}

// caseT is the T of runReport.
type caseT struct {
	ctx context.Context

	mu       sync.Mutex
	msgs     []string
	failed   bool
	skipped  bool
	cleanups []func()
	dirs     []string
	capab    string // the capability the case needed and the plugin lacks
}

func (c *caseT) markCapability(name string) {
	c.mu.Lock()
	c.capab = name
	c.mu.Unlock()
}

func (c *caseT) capabilityName() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.capab
}

func (c *caseT) Helper() {}

func (c *caseT) Context() context.Context { return c.ctx }

func (c *caseT) add(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.msgs = append(c.msgs, fmt.Sprintf(format, args...))
}

func (c *caseT) Logf(format string, args ...any) { c.add(format, args...) }

func (c *caseT) Errorf(format string, args ...any) {
	c.add(format, args...)
	c.mu.Lock()
	c.failed = true
	c.mu.Unlock()
}

func (c *caseT) Fatalf(format string, args ...any) {
	c.Errorf(format, args...)
	runtime.Goexit()
}

func (c *caseT) Skipf(format string, args ...any) {
	c.add(format, args...)
	c.mu.Lock()
	c.skipped = true
	c.mu.Unlock()
	runtime.Goexit()
}

func (c *caseT) Cleanup(f func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cleanups = append(c.cleanups, f)
}

func (c *caseT) TempDir() string {
	d, err := os.MkdirTemp("", "berth-conformance-")
	if err != nil {
		c.Fatalf("temp dir: %v", err)
	}
	c.mu.Lock()
	c.dirs = append(c.dirs, d)
	c.mu.Unlock()
	return d
}

func (c *caseT) cleanup() {
	c.mu.Lock()
	fs, dirs := c.cleanups, c.dirs
	c.cleanups, c.dirs = nil, nil
	c.mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
	for _, d := range dirs {
		_ = os.RemoveAll(d)
	}
}

func (c *caseT) status() Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.failed:
		return Failed
	case c.skipped:
		return Skipped
	}
	return Passed
}

func (c *caseT) messages() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.msgs...)
}
