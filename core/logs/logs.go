// Package logs owns the workload log segments nodes ship to berthd: their bytes in the blob
// store, their index in the store, reading them back, and retention (docs/logs.md section 6).
//
// Layout (DESIGN.md section 4: no read by anything but _id):
//   - a segment's bytes are the blob "logs/sha256/<hex>", named by their content address;
//   - collection log_segments holds one document per segment, _id "sha256:<hex>": whether the
//     core has a segment is one read by _id;
//   - collection log_workloads holds one document per workload, _id the workload id, listing its
//     segments in sequence order: a workload's log is found by one read by _id.
//
// A segment is stored in idempotent steps: blob, segment document, then its entry in the
// workload's list (a compare-and-set on that one document). A step that failed is done again by
// the node's next attempt, which finds the earlier steps done.
package logs

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/blobs"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/internal/logseg"
)

// Collections this package owns.
const (
	SegmentsCollection  = "log_segments"
	WorkloadsCollection = "log_workloads"
)

// blobPrefix is where segment bytes live in the blob store.
const blobPrefix = "logs/sha256/"

// casAttempts bounds the compare-and-set retries on one workload's document.
const casAttempts = 16

// Errors of this package, checked with errors.Is.
var (
	// ErrBadSegment: Put of bytes that do not match the segment's declared size or digest,
	// or of a segment whose description is not usable. Nothing is stored.
	ErrBadSegment = errors.New("berth: log segment does not match its description")
	// ErrNotFound: Workload of a workload no shipped segment names.
	ErrNotFound = errors.New("berth: no shipped log for this workload")
)

// Owner is what a shipped segment belongs to; the session fills it from the workload's record.
type Owner struct {
	ProjectID string
	Project   string
	Service   string
	Replica   string
	NodeID    string
}

// SegmentRef is one segment in a workload's list.
type SegmentRef struct {
	SHA256    string    `bson:"sha256" json:"sha256"` // hex content address
	FirstSeq  int64     `bson:"first_seq" json:"first_seq"`
	LastSeq   int64     `bson:"last_seq" json:"last_seq"`
	FirstTime time.Time `bson:"first_time" json:"first_time"`
	LastTime  time.Time `bson:"last_time" json:"last_time"`
	Records   int64     `bson:"records" json:"records"`
	RawBytes  int64     `bson:"raw_bytes" json:"raw_bytes"` // bytes of records before compression
	Bytes     int64     `bson:"bytes" json:"bytes"`
	StoredAt  time.Time `bson:"stored_at" json:"stored_at"`
}

// Workload is the per-workload document: who owns the log and its segments in sequence order.
type Workload struct {
	ID        string       `bson:"_id"`
	Revision  int64        `bson:"revision"`
	ProjectID string       `bson:"project_id"`
	Project   string       `bson:"project,omitempty"`
	Service   string       `bson:"service,omitempty"`
	Replica   string       `bson:"replica,omitempty"`
	NodeID    string       `bson:"node_id,omitempty"`
	Segments  []SegmentRef `bson:"segments"`
	Bytes     int64        `bson:"bytes"` // sum of Segments' Bytes
}

// segmentDoc is one document of log_segments.
type segmentDoc struct {
	ID         string    `bson:"_id"` // "sha256:<hex>"
	WorkloadID string    `bson:"workload_id"`
	ProjectID  string    `bson:"project_id"`
	FirstSeq   int64     `bson:"first_seq"`
	LastSeq    int64     `bson:"last_seq"`
	FirstTime  time.Time `bson:"first_time"`
	LastTime   time.Time `bson:"last_time"`
	Records    int64     `bson:"records"`
	RawBytes   int64     `bson:"raw_bytes"`
	Bytes      int64     `bson:"bytes"`
	StoredAt   time.Time `bson:"stored_at"`
}

func (d segmentDoc) ref() SegmentRef {
	return SegmentRef{SHA256: d.ID[len("sha256:"):], FirstSeq: d.FirstSeq, LastSeq: d.LastSeq, FirstTime: d.FirstTime,
		LastTime: d.LastTime, Records: d.Records, RawBytes: d.RawBytes, Bytes: d.Bytes, StoredAt: d.StoredAt}
}

// Config wires an Index. Store and Blobs are required.
type Config struct {
	Store *store.Store
	Blobs blobs.Store
	// Retention returns the policy of a project; nil means [DefaultRetention] for every one.
	Retention func(projectID string) Retention
	// SweepLimit bounds the segments one [Index.Sweep] deletes; zero means 256.
	SweepLimit int
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Index is berthd's index of shipped log segments. Safe for concurrent use.
type Index struct {
	cfg Config
}

// New returns an Index; it creates its collections (idempotent).
func New(ctx context.Context, cfg Config) (*Index, error) {
	if cfg.Store == nil || cfg.Blobs == nil {
		return nil, errors.New("logs: Store and Blobs are required")
	}
	if cfg.Retention == nil {
		cfg.Retention = func(string) Retention { return DefaultRetention }
	}
	if cfg.SweepLimit <= 0 {
		cfg.SweepLimit = 256
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if err := cfg.Store.EnsureCollections(ctx, SegmentsCollection, WorkloadsCollection); err != nil {
		return nil, fmt.Errorf("logs: %w", err)
	}
	return &Index{cfg: cfg}, nil
}

func blobKey(hexSum string) string { return blobPrefix + hexSum }

func validHex(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil && s == strings.ToLower(s)
}

// Have reports whether the segment with content address info.SHA256 is stored; when it is, it
// makes sure the segment is in its workload's list, owned by owner (the last step of a
// [Index.Put] cut short). One read by _id when it is not stored.
func (x *Index) Have(ctx context.Context, owner Owner, info node.LogSegmentInfo) (bool, error) {
	if !validHex(info.SHA256) {
		return false, fmt.Errorf("%w: sha256 %q is not 64 lowercase hex digits", ErrBadSegment, info.SHA256)
	}
	var d segmentDoc
	err := x.cfg.Store.Get(ctx, SegmentsCollection, "sha256:"+info.SHA256, &d)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("logs: read segment: %w", err)
	}
	if err := x.list(ctx, d, owner); err != nil {
		return false, err
	}
	return true, nil
}

// Put stores a whole segment of owner's workload: data must be the file info describes (size
// and digest). Putting a segment stored before is success and stores nothing twice. Errors:
// [ErrBadSegment], the blob store's and the store's.
func (x *Index) Put(ctx context.Context, owner Owner, info node.LogSegmentInfo, data []byte) error {
	if !validHex(info.SHA256) || info.WorkloadID == "" || info.FirstSeq < 1 || info.LastSeq < info.FirstSeq {
		return fmt.Errorf("%w: workload, sequence range and sha256 are required", ErrBadSegment)
	}
	sum := sha256.Sum256(data)
	if hex.EncodeToString(sum[:]) != info.SHA256 || int64(len(data)) != info.Bytes {
		return fmt.Errorf("%w: %d bytes received, digest differs from %s", ErrBadSegment, len(data), info.SHA256)
	}
	// The records must parse and stay within the declared range: a reader trusts them.
	err := logseg.ReadSegment(bytes.NewReader(data), func(r logseg.Record) error {
		if r.Seq < info.FirstSeq || r.Seq > info.LastSeq {
			return fmt.Errorf("record %d outside %d-%d", r.Seq, info.FirstSeq, info.LastSeq)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%w: %w", ErrBadSegment, err)
	}
	if _, err := x.cfg.Blobs.Put(ctx, blobKey(info.SHA256), bytes.NewReader(data),
		blobs.PutOptions{Size: int64(len(data)), SHA256: info.SHA256, ContentType: "application/gzip"}); err != nil {
		return fmt.Errorf("logs: store segment bytes: %w", err)
	}
	d := segmentDoc{ID: "sha256:" + info.SHA256, WorkloadID: info.WorkloadID, ProjectID: owner.ProjectID,
		FirstSeq: info.FirstSeq, LastSeq: info.LastSeq, FirstTime: info.FirstTime.UTC(), LastTime: info.LastTime.UTC(),
		Records: info.Records, RawBytes: info.RawBytes, Bytes: info.Bytes, StoredAt: x.cfg.Now().UTC()}
	if err := x.cfg.Store.Insert(ctx, SegmentsCollection, d); err != nil {
		if !store.IsDuplicateKey(err) {
			return fmt.Errorf("logs: index segment: %w", err)
		}
		if err := x.cfg.Store.Get(ctx, SegmentsCollection, d.ID, &d); err != nil {
			return fmt.Errorf("logs: read segment: %w", err)
		}
	}
	return x.list(ctx, d, owner)
}

// list adds d to its workload's document unless it is there: one compare-and-set, retried on
// conflict a bounded number of times.
func (x *Index) list(ctx context.Context, d segmentDoc, owner Owner) error {
	st := x.cfg.Store
	for range casAttempts {
		var w Workload
		err := st.Get(ctx, WorkloadsCollection, d.WorkloadID, &w)
		if errors.Is(err, store.ErrNotFound) {
			w = Workload{ID: d.WorkloadID, Revision: 1, ProjectID: d.ProjectID, Project: owner.Project, Service: owner.Service,
				Replica: owner.Replica, NodeID: owner.NodeID, Segments: []SegmentRef{d.ref()}, Bytes: d.Bytes}
			err := st.Insert(ctx, WorkloadsCollection, w)
			if store.IsDuplicateKey(err) {
				continue
			}
			if err != nil {
				return fmt.Errorf("logs: list segment: %w", err)
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("logs: read workload log: %w", err)
		}
		if slices.ContainsFunc(w.Segments, func(r SegmentRef) bool { return r.SHA256 == d.ref().SHA256 }) {
			return nil
		}
		w.Segments = append(w.Segments, d.ref())
		slices.SortFunc(w.Segments, func(a, b SegmentRef) int { return cmpInt(a.FirstSeq, b.FirstSeq) })
		w.Bytes += d.Bytes
		expected := w.Revision
		w.Revision++
		ok, err := st.ReplaceIfRevision(ctx, st.Collection(WorkloadsCollection), w.ID, expected, w)
		if err != nil {
			return fmt.Errorf("logs: list segment: %w", err)
		}
		if ok {
			return nil
		}
	}
	return fmt.Errorf("logs: list segment of %s: %w", d.WorkloadID, store.ErrConflict)
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Workload returns the shipped log of workload id: one read by _id. Errors: [ErrNotFound].
func (x *Index) Workload(ctx context.Context, id string) (*Workload, error) {
	var w Workload
	err := x.cfg.Store.Get(ctx, WorkloadsCollection, id, &w)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return nil, fmt.Errorf("logs: read workload log: %w", err)
	}
	return &w, nil
}

// ReadSegment calls fn with each record of the shipped segment ref, in sequence order. A
// segment whose bytes retention removed meanwhile reads as empty.
func (x *Index) ReadSegment(ctx context.Context, ref SegmentRef, fn func(logseg.Record) error) error {
	rc, _, err := x.cfg.Blobs.Get(ctx, blobKey(ref.SHA256), 0, -1)
	if errors.Is(err, blobs.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("logs: read segment %s: %w", ref.SHA256, err)
	}
	defer rc.Close()
	return logseg.ReadSegment(rc, fn)
}

// Register records owner as the owner of workload id's log, unless one is recorded, and returns
// the workload's document: the session registers a log while the workload still has its record,
// so segments sealed after the workload was removed still find their owner.
func (x *Index) Register(ctx context.Context, id string, owner Owner) (*Workload, error) {
	w := Workload{ID: id, Revision: 1, ProjectID: owner.ProjectID, Project: owner.Project, Service: owner.Service,
		Replica: owner.Replica, NodeID: owner.NodeID, Segments: []SegmentRef{}}
	err := x.cfg.Store.Insert(ctx, WorkloadsCollection, w)
	if err == nil {
		return &w, nil
	}
	if !store.IsDuplicateKey(err) {
		return nil, fmt.Errorf("logs: register workload log: %w", err)
	}
	return x.Workload(ctx, id)
}
