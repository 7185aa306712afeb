package slots

import (
	"net/url"
	"strconv"
)

// Failure kinds a node reports (docs/node-protocol.md section 5.3.1).
const (
	FailureExit   = "exit"
	FailureSignal = "signal"
	FailureProbe  = "probe"
	FailureStart  = "start"
	FailureImage  = "image"
	// FailureOOM: the kernel's OOM killer ended the run over its memory limit.
	FailureOOM = "oom"
)

// Reasons of a verdict that name a slot's failure (docs/reconciliation.md section 7). The
// crash-loop and unhealthy reasons carry their detail after ": ", as [CrashLoopReason] and
// [UnhealthyReason] build them.
const (
	ReasonCrashLoop        Reason = "crash-loop"        // waiting: the run keeps exiting; "crash-loop: exit 2", "crash-loop: signal 9", "crash-loop: oom"
	ReasonUnhealthy        Reason = "unhealthy"         // waiting: the run is up and its readiness probe fails; "unhealthy: probe /status/404 -> 404"
	ReasonStartFailed      Reason = "start-failed"      // waiting: the node cannot start the run (port, directory, network, driver)
	ReasonImageUnavailable Reason = "image-unavailable" // waiting: the node cannot fetch or unpack the run's bundle or image
)

// Failure is what a decision knows of a slot's failure: the node's report, reduced to what a
// verdict names.
type Failure struct {
	// Kind is one of the Failure* kinds; others are shown as they are.
	Kind string
	// ExitCode is the exit code of an exit, nil when the node did not know it.
	ExitCode *int
	// Signal is the signal of a signal failure.
	Signal int
	// ProbeURL is the URL a probe failure probed; ProbeStatus the HTTP status it answered (0:
	// no answer).
	ProbeURL    string
	ProbeStatus int
}

// CrashLoopReason returns the waiting reason of a slot whose runs keep failing with f:
// "crash-loop: exit <code>", "crash-loop: signal <n>", "crash-loop: oom" for runs the OOM killer
// ended over their memory limit, "crash-loop" for an exit of unknown code,
// start-failed, image-unavailable, and failure-backoff for f nil or any other kind.
func CrashLoopReason(f *Failure) Reason {
	if f == nil {
		return ReasonFailureBackoff
	}
	switch f.Kind {
	case FailureExit:
		if f.ExitCode == nil {
			return ReasonCrashLoop
		}
		return ReasonCrashLoop + Reason(": exit "+strconv.Itoa(*f.ExitCode))
	case FailureSignal:
		return ReasonCrashLoop + Reason(": signal "+strconv.Itoa(f.Signal))
	case FailureOOM:
		return ReasonCrashLoop + ": oom"
	case FailureStart:
		return ReasonStartFailed
	case FailureImage:
		return ReasonImageUnavailable
	}
	return ReasonFailureBackoff
}

// UnhealthyReason returns "unhealthy: probe <path> -> <status>" for a probe failure f, with
// "no answer" for a probe that got no HTTP answer; the path keeps its query.
func UnhealthyReason(f Failure) Reason {
	path := f.ProbeURL
	if u, err := url.Parse(f.ProbeURL); err == nil && u.Host != "" {
		path = u.EscapedPath()
		if path == "" {
			path = "/"
		}
		if u.RawQuery != "" {
			path += "?" + u.RawQuery
		}
	}
	answer := "no answer"
	if f.ProbeStatus > 0 {
		answer = strconv.Itoa(f.ProbeStatus)
	}
	return ReasonUnhealthy + Reason(": probe "+path+" -> "+answer)
}
