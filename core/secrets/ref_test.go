package secrets

import (
	"errors"
	"testing"
)

// TestRefValidateRegistry: as "registry" takes a registry host as its key (and only then);
// the other modes keep environment-variable keys.
func TestRefValidateRegistry(t *testing.T) {
	for _, tc := range []struct {
		key string
		ref Ref
		ok  bool
	}{
		{"ghcr.io", Ref{Secret: "ghcr", As: AsRegistry}, true},
		{"registry.example:5000", Ref{Secret: "pull", As: AsRegistry}, true},
		{"docker.io", Ref{Secret: "hub", As: AsRegistry, Version: 2}, true},
		{"GHCR", Ref{Secret: "ghcr", As: AsRegistry}, false},
		{"ghcr.io/acme", Ref{Secret: "ghcr", As: AsRegistry}, false},
		{"ghcr.io", Ref{Secret: "ghcr"}, false},
		{"DB_URL", Ref{Secret: "db", As: AsFile}, true},
		{"DB_URL", Ref{Secret: "db", As: "stdin"}, false},
	} {
		err := tc.ref.Validate(tc.key)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrInvalid)) {
			t.Errorf("Validate(%q, %+v) = %v; want ok %v", tc.key, tc.ref, err, tc.ok)
		}
	}
}
