package version

import (
	"errors"
	"strings"
	"testing"
)

func TestCompare(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"0.3.0", "0.3.0", 0},
		{"0.3.0", "v0.3.0", 0},
		{"0.2.9", "0.3.0", -1},
		{"0.10.0", "0.9.0", 1},
		{"1.0.0-rc.1", "1.0.0", -1},
		{"1.0.0+build.5", "1.0.0", 0},
	} {
		got, err := Compare(tc.a, tc.b)
		if err != nil || got != tc.want {
			t.Errorf("Compare(%q, %q) = %d, %v; want %d", tc.a, tc.b, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "test", "1.2", "1", "1.2.3.4", "01.2.3", "v", "1.2.x"} {
		if _, err := Compare(bad, "1.0.0"); !errors.Is(err, ErrInvalid) {
			t.Errorf("Compare(%q) error = %v; want ErrInvalid", bad, err)
		}
	}
}

func TestCheckSkew(t *testing.T) {
	for _, tc := range []struct {
		core, peer string
		want       error
	}{
		{"0.4.0", "0.4.0", nil},
		{"0.4.0", "0.3.7", nil},     // one minor behind
		{"0.4.2", "0.4.5", nil},     // patches mix both ways
		{"0.4.0", "0.2.9", ErrSkew}, // two minors behind
		{"0.4.0", "0.5.0", ErrSkew}, // agent ahead of the core
		{"1.0.0", "0.9.0", ErrSkew}, // another major
		{"0.4.0", "bogus", ErrInvalid},
		{Dev, "0.1.0", nil},
		{"0.4.0", "0.9.0-dev", nil},
	} {
		err := CheckSkew(tc.core, tc.peer)
		if (tc.want == nil) != (err == nil) || (tc.want != nil && !errors.Is(err, tc.want)) {
			t.Errorf("CheckSkew(%q, %q) = %v; want %v", tc.core, tc.peer, err, tc.want)
		}
	}
}

func TestLine(t *testing.T) {
	got := Line("berthd")
	if !strings.HasPrefix(got, "berthd "+Version+" go") || !strings.Contains(got, "/") {
		t.Errorf("Line = %q", got)
	}
}
