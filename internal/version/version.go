// Package version holds the release version stamped into every Berth binary at
// link time, and the version-skew rule between berthd, agents and node plugins
// (docs/upgrades.md).
package version

import (
	"errors"
	"fmt"
	"io"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/mod/semver"
)

// Version is the release version of this build: a semantic version without a
// leading "v" ("0.3.0", "0.4.0-rc.1"). Release builds set it at link time:
//
//	go build -ldflags "-X github.com/berthhq/berth/internal/version.Version=0.3.0" ./cmd/...
//
// It is a variable only because the linker can set nothing else; nothing
// writes it at run time. An unstamped build reports [Dev].
var Version = Dev

// Dev is the version of a build the linker did not stamp. The skew rule is not
// enforced against it (docs/upgrades.md section 2).
const Dev = "0.0.0-dev"

// Line is the one line every binary prints for --version:
// "<program> <version> <go version> <os>/<arch>", e.g.
// "berthd 0.3.0 go1.26.8 linux/amd64".
func Line(program string) string {
	return fmt.Sprintf("%s %s %s %s/%s", program, Version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// Print writes [Line] and a newline to w.
func Print(w io.Writer, program string) error {
	_, err := fmt.Fprintln(w, Line(program))
	return err
}

// ErrInvalid is returned by [Parse], [Compare] and [CheckSkew] for a string
// that is not a semantic version MAJOR.MINOR.PATCH[-PRERELEASE].
var ErrInvalid = errors.New("berth: not a semantic version MAJOR.MINOR.PATCH")

// Semver is a parsed version: Major, Minor and Patch, and the pre-release
// part after "-" (empty for a release).
type Semver struct {
	Major, Minor, Patch int
	Pre                 string
}

// Parse parses "MAJOR.MINOR.PATCH[-PRE]" with an optional leading "v". Build
// metadata ("+...") is accepted and ignored. Errors wrap [ErrInvalid].
func Parse(s string) (Semver, error) {
	v := "v" + strings.TrimPrefix(s, "v")
	if !semver.IsValid(v) || strings.Count(strings.SplitN(strings.SplitN(v, "-", 2)[0], "+", 2)[0], ".") != 2 {
		return Semver{}, fmt.Errorf("version %q: %w", s, ErrInvalid)
	}
	core := strings.TrimPrefix(semver.Canonical(v), "v")
	core, _, _ = strings.Cut(core, "+")
	core, pre, _ := strings.Cut(core, "-")
	parts := strings.Split(core, ".")
	var out Semver
	for i, dst := range []*int{&out.Major, &out.Minor, &out.Patch} {
		n, err := strconv.Atoi(parts[i])
		if err != nil {
			return Semver{}, fmt.Errorf("version %q: %w", s, ErrInvalid)
		}
		*dst = n
	}
	out.Pre = pre
	return out, nil
}

// Compare returns -1, 0 or +1 as a is older than, the same as, or newer than
// b, by semantic-version precedence (a pre-release is older than its
// release). Errors wrap [ErrInvalid] and name the bad string.
func Compare(a, b string) (int, error) {
	if _, err := Parse(a); err != nil {
		return 0, err
	}
	if _, err := Parse(b); err != nil {
		return 0, err
	}
	return semver.Compare("v"+strings.TrimPrefix(a, "v"), "v"+strings.TrimPrefix(b, "v")), nil
}

// IsDev reports whether v is a build the skew rule does not judge: [Dev], or
// any version whose pre-release part is "dev" or starts with "dev.".
func IsDev(v string) bool {
	p, err := Parse(v)
	return err == nil && (p.Pre == "dev" || strings.HasPrefix(p.Pre, "dev."))
}
