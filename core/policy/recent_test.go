package policy

import (
	"errors"
	"fmt"
	"testing"
)

// TestRecordedInputs: the engine keeps the newest RecentInputs distinct
// inputs by digest, drops the oldest beyond, and answers
// ErrInputNotRecorded for any other.
func TestRecordedInputs(t *testing.T) {
	e := &Engine{}
	for i := range RecentInputs + 1 {
		e.recent.put(fmt.Sprintf("d%d", i), []byte(fmt.Sprintf(`{"n":%d}`, i)))
	}
	e.recent.put("d1", []byte(`{"n":"again"}`)) // a repeated digest changes nothing
	if _, err := e.RecordedInput("d0"); !errors.Is(err, ErrInputNotRecorded) {
		t.Errorf("the oldest input: %v; want ErrInputNotRecorded", err)
	}
	if raw, err := e.RecordedInput("d1"); err != nil || string(raw) != `{"n":1}` {
		t.Errorf("d1 = %s, %v", raw, err)
	}
	last := fmt.Sprintf("d%d", RecentInputs)
	if raw, err := e.RecordedInput(last); err != nil || string(raw) != fmt.Sprintf(`{"n":%d}`, RecentInputs) {
		t.Errorf("%s = %s, %v", last, raw, err)
	}
	if _, err := e.RecordedInput("unknown"); !errors.Is(err, ErrInputNotRecorded) {
		t.Errorf("an unknown digest: %v; want ErrInputNotRecorded", err)
	}
}
