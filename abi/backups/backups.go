// Package backups holds the contract types of service backups that cross
// process boundaries: the verification figures an archive engine records and
// a restore drill compares, and a drill's result (docs/backups.md).
package backups

import (
	"fmt"
	"sort"
)

// Kind names a resource kind an [Engine] archives.
type Kind string

// The kinds of docs/backups.md section 3.
const (
	KindPostgres Kind = "postgres" // one PostgreSQL database, pg_dump custom format
	KindMongoDB  Kind = "mongodb"  // one MongoDB database, the archive of section 3.2
	KindS3       Kind = "s3"       // one S3 bucket, a tar stream of its objects
)

// Item is one verification figure: a table, a collection or an object.
type Item struct {
	// Name is "schema.table" (PostgreSQL), the collection name (MongoDB) or
	// the object key (S3).
	Name string `json:"name"`
	// Count is rows (PostgreSQL), documents (MongoDB) or bytes (S3).
	Count int64 `json:"count"`
	// Digest is a content digest: "rhash:<a>:<b>" (the exact decimal sums
	// of the server's 64-bit record hashes with seeds 0 and 1) or, for a
	// table with an unhashable column type, "rowsum:<a>:<b>" (the sums of
	// the two 64-bit halves of md5 over each row's text), computed on the
	// server (PostgreSQL); "sha256:<hex>" over the
	// documents in _id order (MongoDB), "md5:<hex>" of the object's bytes
	// (S3).
	Digest string `json:"digest"`
	// ETag is the object's ETag as the server listed it (S3 only).
	ETag string `json:"etag,omitempty"`
}

// Figures are what a backup recorded, or what a restored resource measures:
// its items sorted by name. Two figures of the same content compare equal
// with [Compare].
type Figures struct {
	Kind  Kind   `json:"kind"`
	Items []Item `json:"items"`
}

// Difference is one item whose figures differ: Want is nil for an item the
// restored resource holds that the backup did not, Got nil for one missing.
type Difference struct {
	Name string `json:"name"`
	Want *Item  `json:"want,omitempty"`
	Got  *Item  `json:"got,omitempty"`
}

// String says which item differs and how, for an operator.
func (d Difference) String() string {
	switch {
	case d.Got == nil:
		return fmt.Sprintf("%s: missing (backup had %d)", d.Name, d.Want.Count)
	case d.Want == nil:
		return fmt.Sprintf("%s: not in the backup (%d found)", d.Name, d.Got.Count)
	case d.Want.Count != d.Got.Count:
		return fmt.Sprintf("%s: count %d, backup had %d", d.Name, d.Got.Count, d.Want.Count)
	default:
		return fmt.Sprintf("%s: digest %s, backup had %s", d.Name, d.Got.Digest, d.Want.Digest)
	}
}

// Compare returns every item whose count or digest differs between want and
// got, in name order; none means the figures agree. ETags are not compared
// (a restored multipart object gets another one): the content digest is.
func Compare(want, got Figures) []Difference {
	w, g := index(want.Items), index(got.Items)
	var out []Difference
	for name, wi := range w {
		gi, ok := g[name]
		switch {
		case !ok:
			out = append(out, Difference{Name: name, Want: &wi})
		case gi.Count != wi.Count || gi.Digest != wi.Digest:
			out = append(out, Difference{Name: name, Want: &wi, Got: &gi})
		}
	}
	for name, gi := range g {
		if _, ok := w[name]; !ok {
			out = append(out, Difference{Name: name, Got: &gi})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func index(items []Item) map[string]Item {
	m := make(map[string]Item, len(items))
	for _, it := range items {
		m[it.Name] = it
	}
	return m
}

// SortItems orders items by name, the order [Figures] keeps.
func SortItems(items []Item) {
	sort.Slice(items, func(i, j int) bool { return items[i].Name < items[j].Name })
}

// DrillResult is what one restore drill found.
type DrillResult struct {
	Passed      bool         `json:"passed"`
	Scratch     string       `json:"scratch"`         // the scratch resource restored into
	Figures     Figures      `json:"figures"`         // measured on the restored scratch resource
	Differences []Difference `json:"differences"`     // empty when Passed
	Error       string       `json:"error,omitempty"` // why the restore itself failed, if it did
	Dropped     bool         `json:"dropped"`         // whether the scratch resource was dropped
	TookMS      int64        `json:"took_ms"`         // wall time of restore and verification, ms
}
