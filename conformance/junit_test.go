package conformance

import (
	"bytes"
	"encoding/xml"
	"strings"
	"testing"
)

// TestJUnitFailureMessageCarriesDidWantGot: the message attribute of a JUnit
// failure, which CI systems show in their summaries, says what the suite did,
// what it wanted and what it got, not only the first line.
func TestJUnitFailureMessageCarriesDidWantGot(t *testing.T) {
	r := &Report{Suite: "provider", Plugin: "p", Results: []Result{{
		Name:     "create",
		Status:   Failed,
		Messages: []string{failure("Create a bucket", "success", "error boom (code internal)"), "log: extra"},
	}}}
	var buf bytes.Buffer
	if err := r.WriteJUnit(&buf); err != nil {
		t.Fatal(err)
	}
	var s struct {
		Cases []struct {
			Failure struct {
				Message string `xml:"message,attr"`
				Text    string `xml:",chardata"`
			} `xml:"failure"`
		} `xml:"testcase"`
	}
	if err := xml.Unmarshal(buf.Bytes(), &s); err != nil {
		t.Fatalf("decode %s: %v", buf.String(), err)
	}
	if len(s.Cases) != 1 {
		t.Fatalf("cases = %d, want 1", len(s.Cases))
	}
	msg := s.Cases[0].Failure.Message
	for _, want := range []string{"did: Create a bucket", "want: success", "got: error boom (code internal)"} {
		if !strings.Contains(msg, want) {
			t.Errorf("failure message %q lacks %q", msg, want)
		}
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("failure message %q spans lines", msg)
	}
	if !strings.Contains(s.Cases[0].Failure.Text, "log: extra") {
		t.Errorf("failure text %q lacks the case's other messages", s.Cases[0].Failure.Text)
	}
}
