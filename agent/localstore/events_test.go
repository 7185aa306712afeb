package localstore

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
)

// TestEventBufferBounded: the buffer keeps the newest max events, counts the
// dropped ones, and ignores a repeated id (docs/node-protocol.md section 6.5).
func TestEventBufferBounded(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), FileName))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := range 15 {
		if err := s.BufferEvent(ctx, fmt.Sprintf("evt_%02d", i), []byte("{}"), 10); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.BufferEvent(ctx, "evt_14", []byte("{}"), 10); err != nil {
		t.Fatal(err)
	}
	got, err := s.PendingEvents(ctx, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 10 || got[0].ID != "evt_05" || got[9].ID != "evt_14" {
		t.Fatalf("buffer holds %d events from %v", len(got), got)
	}
	if n, _ := s.DroppedEvents(ctx); n != 5 {
		t.Fatalf("dropped %d, want 5", n)
	}
	if err := s.ReportedDroppedEvents(ctx, 3); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.DroppedEvents(ctx); n != 2 {
		t.Fatalf("dropped after reporting 3: %d, want 2", n)
	}
	if err := s.DeleteEvent(ctx, got[0].Pos); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.PendingEvents(ctx, 100); len(got) != 9 {
		t.Fatalf("after delete: %d", len(got))
	}
}
