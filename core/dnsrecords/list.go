package dnsrecords

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/berthhq/berth/core/store"
)

// WriteState is how far the DNS server has caught up with a record (docs/dns.md section 6.3).
type WriteState string

// The write states of a record.
const (
	// StateWritten: the server holds the record's current generation.
	StateWritten WriteState = "written"
	// StatePending: a write of the current generation is queued or being retried.
	StatePending WriteState = "pending"
	// StateFailed: the write of the current generation failed for good; LastError says why, and
	// the next change of the record (or asking again) writes again.
	StateFailed WriteState = "failed"
)

// State is the write state of r: written when the server holds its generation, failed when
// that generation's write failed for good, pending otherwise.
func (r *Record) State() WriteState {
	switch {
	case r.Written >= r.Generation:
		return StateWritten
	case r.Failed >= r.Generation:
		return StateFailed
	}
	return StatePending
}

// Reader lists the records of a store for the API's GET /api/v1/dns-records (docs/dns.md
// section 6.3). It needs no DNS plugin: records written while a DNS configuration was in force
// stay readable after it is removed. The zero value is not usable; see [NewReader].
type Reader struct{ st *store.Store }

// NewReader returns the record reader of st.
func NewReader(st *store.Store) Reader { return Reader{st: st} }

// List returns the records of the collection sorted by name and type; fqdn, when not empty,
// keeps those of that one name (case and a trailing dot do not matter). It reads from the
// store's read view (one pass over the collection held in memory; a reload only for documents
// written since the last read), so it suits listings, not a hot path. Errors: store errors.
func (r Reader) List(ctx context.Context, fqdn string) ([]Record, error) {
	var recs []Record
	if err := r.st.View().Find(ctx, r.st.Collection(Collection), nil, &recs); err != nil {
		return nil, fmt.Errorf("dnsrecords: list: %w", err)
	}
	if fqdn != "" {
		want := dnsFQDN(fqdn)
		recs = slices.DeleteFunc(recs, func(rec Record) bool { return !strings.EqualFold(rec.FQDN, want) })
	}
	slices.SortFunc(recs, func(a, b Record) int { return cmp.Or(strings.Compare(a.FQDN, b.FQDN), strings.Compare(a.Type, b.Type)) })
	return recs, nil
}
