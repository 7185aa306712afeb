package conformance

import (
	"fmt"
	"strings"

	abierrors "github.com/berthhq/berth/abi/errors"
)

// failure formats one failed check the same way everywhere: what the suite
// did, what it expected, what it got, each once (docs/plugins.md section
// 6.2).
func failure(did, want, got string) string {
	return fmt.Sprintf("did:  %s\nwant: %s\ngot:  %s", did, want, got)
}

// gotErr describes an error a call returned: its text with repeated parts
// said once (a plugin's message often repeats what the host's wrapping says:
// "read x: not_found: read x: not_found: resource not found"), and its code.
func gotErr(err error) string {
	if err == nil {
		return "success"
	}
	var parts []string
	seen := map[string]bool{}
	for _, p := range strings.Split(err.Error(), ": ") {
		if !seen[p] {
			seen[p] = true
			parts = append(parts, p)
		}
	}
	s := "error " + strings.Join(parts, ": ")
	if c := abierrors.CodeOf(err); c != "" {
		s += fmt.Sprintf(" (code %s)", c)
	}
	return s
}
