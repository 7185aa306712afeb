package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/berthhq/berth/sdk/client"
)

// printJSON writes v as indented JSON and a newline.
func printJSON(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode output: %w", err)
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// newTable returns a tabwriter for aligned columns; the caller flushes it.
func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
}

// row writes cells as one tab-separated line.
func row(w io.Writer, cells ...any) {
	parts := make([]string, len(cells))
	for i, c := range cells {
		parts[i] = fmt.Sprint(c)
	}
	fmt.Fprintln(w, strings.Join(parts, "\t"))
}

// age formats d the short way tables show it: 45s, 12m, 3h, 5d.
func age(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d/time.Hour))
	default:
		return fmt.Sprintf("%dd", int(d/(24*time.Hour)))
	}
}

// since formats the age of t, or "-" for a zero time.
func (a *app) since(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return age(a.clock().Sub(t))
}

// shortDigest shortens "sha256:<hex>" to "sha256:" and 12 hex digits.
func shortDigest(d string) string {
	algo, hex, ok := strings.Cut(d, ":")
	if !ok || len(hex) <= 12 {
		return orDash(d)
	}
	return algo + ":" + hex[:12]
}

// imageCell shows what a container service runs: the tag it follows (deploy_on_push) or the
// image's repository, and the digest it is pinned to, shortened; "-" without an image.
func imageCell(c client.Container) string {
	repo, digest := "", c.Image
	if at := strings.LastIndex(c.Image, "@"); at >= 0 {
		repo, digest = c.Image[:at], c.Image[at+1:]
	}
	if c.ImageTag != "" {
		repo = c.ImageTag
	}
	if repo == "" {
		return shortDigest(digest)
	}
	return repo + "@" + shortDigest(digest)
}

// orDash returns s, or "-" when it is empty.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// joinOrDash joins items with commas, or returns "-" for none.
func joinOrDash(items []string) string {
	return orDash(strings.Join(items, ","))
}

// humanBytes formats n as B, KiB, MiB or GiB.
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 2; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMG"[exp])
}
