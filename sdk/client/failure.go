package client

import (
	"net/url"
	"strconv"
	"time"
)

// Failure is the last failure of a workload or slot (docs/node-protocol.md section 5.3.1):
// Kind is "exit" (ExitCode), "signal" (Signal), "probe" (ProbeURL and ProbeStatus, 0 when the
// probe got no HTTP answer), "start" or "image" (Message says why). At is when the node saw it;
// Count how many failures the slot had so far, across its attempts.
type Failure struct {
	Kind        string    `json:"kind"`
	ExitCode    *int      `json:"exit_code,omitempty"`
	Signal      int       `json:"signal,omitempty"`
	ProbeURL    string    `json:"probe_url,omitempty"`
	ProbeStatus int       `json:"probe_status,omitempty"`
	Message     string    `json:"message,omitempty"`
	At          time.Time `json:"at"`
	Count       int       `json:"count"`
}

// String returns the failure in a few words: "exit 2", "signal 9", "probe /status/404 -> 404",
// "probe /healthz -> no answer", "start: <message>", "image: <message>".
func (f Failure) String() string {
	switch f.Kind {
	case "exit":
		if f.ExitCode == nil {
			return "exit"
		}
		return "exit " + strconv.Itoa(*f.ExitCode)
	case "signal":
		return "signal " + strconv.Itoa(f.Signal)
	case "probe":
		path := f.ProbeURL
		if u, err := url.Parse(f.ProbeURL); err == nil && u.Host != "" {
			path = u.RequestURI()
		}
		answer := "no answer"
		if f.ProbeStatus > 0 {
			answer = strconv.Itoa(f.ProbeStatus)
		}
		return "probe " + path + " -> " + answer
	}
	if f.Message == "" {
		return f.Kind
	}
	return f.Kind + ": " + f.Message
}
