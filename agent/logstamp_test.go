package agent

import (
	"testing"
	"time"

	"github.com/berthhq/berth/abi/node"
)

// TestFollowedBacklogHasNoReadTimeStamp: the lines of the kept output (the driver's first
// write) carry no time, since the node did not record when they were written; lines written
// while following carry the time they arrived.
func TestFollowedBacklogHasNoReadTimeStamp(t *testing.T) {
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	var got []node.LogLine
	w := &lineWriter{id: "wl_1", now: func() time.Time { return at }, skip: -1, tail: 2,
		send: func(b []node.LogLine) error { got = append(got, b...); return nil }}
	if _, err := w.Write([]byte("old 1\nold 2\nold 3\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte("new\n")); err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0].Line != "old 2" || got[1].Line != "old 3" || got[2].Line != "new" {
		t.Fatalf("lines = %+v", got)
	}
	for _, l := range got[:2] {
		if l.Time != nil {
			t.Errorf("backlog line %q stamped %v, the time it was read", l.Line, *l.Time)
		}
	}
	if got[2].Time == nil || !got[2].Time.Equal(at) {
		t.Errorf("followed line stamped %v, want %v", got[2].Time, at)
	}
}
