package slots

import (
	"fmt"
	"testing"
	"time"
)

func TestSweeperTiming(t *testing.T) {
	t.Parallel()
	sec := func(n float64) time.Time { return t0.Add(time.Duration(n * float64(time.Second))) }
	type ev struct {
		kind string // hint, start, finish, force, wake
		at   float64
		want bool // start: started; finish: follow-up owed; force: not joined
	}
	tests := []struct {
		name   string
		events []ev
		next   float64 // seconds after t0 the next sweep is due (-1: none, one is running)
	}{
		{"first sweep at once", nil, 0},
		{"period after the last sweep", []ev{{"start", 0, true}, {"finish", 2, false}}, 32},
		{"quiet hint", []ev{{"start", 0, true}, {"finish", 2, false}, {"hint", 10, false}}, 11},
		{"each hint restarts the quiet wait", []ev{{"start", 0, true}, {"finish", 2, false}, {"hint", 10, false}, {"hint", 10.5, false}, {"hint", 10.9, false}}, 11.9},
		{"period caps a hint storm", []ev{{"start", 0, true}, {"finish", 2, false}, {"hint", 31.5, false}}, 32},
		{"floor after the last sweep", []ev{{"start", 0, true}, {"finish", 2, false}, {"hint", 2.1, false}}, 7},
		{"not due before the floor", []ev{{"start", 0, true}, {"finish", 2, false}, {"hint", 2.1, false}, {"start", 6.9, false}}, 7},
		{"one sweep at a time", []ev{{"start", 0, true}, {"hint", 1, false}, {"start", 5, false}}, -1},
		{"hints during a sweep earn one follow-up", []ev{{"start", 0, true}, {"hint", 1, false}, {"hint", 2, false}, {"hint", 3, false}, {"finish", 4, true}}, 9},
		{"the follow-up runs once", []ev{{"start", 0, true}, {"hint", 1, false}, {"finish", 4, true}, {"start", 9, true}, {"finish", 10, false}}, 40},
		{"no hint, no follow-up", []ev{{"start", 0, true}, {"finish", 4, false}, {"start", 33.9, false}, {"start", 34, true}}, -1},
		{"force skips the floor", []ev{{"start", 0, true}, {"finish", 2, false}, {"force", 2.5, true}, {"start", 2.5, true}}, -1},
		{"force joins a running sweep", []ev{{"start", 0, true}, {"force", 1, false}, {"finish", 2, false}}, 32},
		{"finish without a sweep", []ev{{"finish", 1, false}}, 0},
		{"a wake before the period", []ev{{"start", 0, true}, {"finish", 2, false}, {"wake", 12, false}}, 12},
		{"a wake keeps the floor", []ev{{"start", 0, true}, {"finish", 2, false}, {"wake", 3, false}}, 7},
		{"the earliest wake counts", []ev{{"start", 0, true}, {"finish", 2, false}, {"wake", 20, false}, {"wake", 15, false}, {"wake", 25, false}}, 15},
		{"a sweep covers the wake", []ev{{"start", 0, true}, {"finish", 2, false}, {"wake", 12, false}, {"start", 12, true}, {"finish", 13, false}}, 43},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := NewSweeper(SweepConfig{}, t0)
			for i, e := range tc.events {
				var got bool
				switch e.kind {
				case "hint":
					s.Hint(sec(e.at))
					continue
				case "wake":
					s.Wake(sec(e.at))
					continue
				case "start":
					got = s.Start(sec(e.at))
				case "finish":
					got = s.Finish(sec(e.at))
				case "force":
					got = s.Force(sec(e.at))
				}
				if got != e.want {
					t.Fatalf("event %d (%s at %gs): %v, want %v", i, e.kind, e.at, got, e.want)
				}
			}
			at, ok := s.Next()
			switch {
			case tc.next < 0 && ok:
				t.Fatalf("next due at %v during a sweep", at.Sub(t0))
			case tc.next >= 0 && (!ok || !at.Equal(sec(tc.next))):
				t.Fatalf("next due %v (%v), want %gs", at.Sub(t0), ok, tc.next)
			}
		})
	}
	// Custom timing.
	s := NewSweeper(SweepConfig{Quiet: 2 * time.Second, Period: 15 * time.Second, Floor: -1}, t0)
	s.Start(t0)
	s.Finish(t0)
	if at, _ := s.Next(); !at.Equal(t0.Add(15 * time.Second)) {
		t.Fatalf("custom period: %v", at.Sub(t0))
	}
	s.Hint(t0)
	if at, _ := s.Next(); !at.Equal(t0.Add(2 * time.Second)) {
		t.Fatalf("custom quiet without a floor: %v", at.Sub(t0))
	}
}

func TestNextPage(t *testing.T) {
	t.Parallel()
	var ids []string
	for i := 0; i < 19; i++ {
		ids = append(ids, fmt.Sprintf("svc_%02d", i))
	}
	var pages [][]string
	after := ""
	for i := 0; i < 10; i++ {
		page, next := NextPage(ids, after, 0)
		pages = append(pages, page)
		if next == "" {
			break
		}
		after = next
	}
	if len(pages) != 3 || len(pages[0]) != PageSize || len(pages[2]) != 3 || pages[1][0] != "svc_08" {
		t.Fatalf("pages %v", pages)
	}
	// A cursor whose service was deleted meanwhile still continues after it.
	if page, _ := NextPage([]string{"a", "c", "d"}, "b", 8); fmt.Sprint(page) != "[c d]" {
		t.Fatalf("page after a vanished cursor: %v", page)
	}
	if page, next := NextPage(nil, "", 8); len(page) != 0 || next != "" {
		t.Fatalf("empty: %v %q", page, next)
	}
	// Exactly a page: no cursor left.
	if page, next := NextPage(ids[:8], "", 8); len(page) != 8 || next != "" {
		t.Fatalf("exact page: %d %q", len(page), next)
	}
}
