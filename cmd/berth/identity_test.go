package main

import (
	"testing"
	"time"
)

func TestParseLifetime(t *testing.T) {
	for in, want := range map[string]time.Duration{"": 0, "90d": 90 * 24 * time.Hour, "1y": 365 * 24 * time.Hour, "12h": 12 * time.Hour} {
		if got, err := parseLifetime(in); err != nil || got != want {
			t.Errorf("parseLifetime(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"0d", "-1d", "xd", "1.5y", "soon", "-3h"} {
		if _, err := parseLifetime(bad); err == nil {
			t.Errorf("parseLifetime(%q) accepted", bad)
		}
	}
}

func TestActorMatches(t *testing.T) {
	for _, c := range []struct {
		id, want string
		ok       bool
	}{
		{"user:bob", "user:bob", true}, {"user:bob", "bob", true}, {"token:ci", "ci", true},
		{"token:ci", "user:ci", false}, {"user:bob", "bo", false}, {"nod_X", "nod_X", true},
	} {
		if got := actorMatches(c.id, c.want); got != c.ok {
			t.Errorf("actorMatches(%q, %q) = %v", c.id, c.want, got)
		}
	}
}
