package logs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/berthhq/berth/core/blobs"
	"github.com/berthhq/berth/core/store"
)

// Retention is how long and how much of a project's shipped logs berthd keeps
// (docs/logs.md section 8).
type Retention struct {
	// MaxAge: a segment whose last record is older than this is deleted; zero or negative
	// means no age limit.
	MaxAge time.Duration
	// MaxBytes bounds the compressed bytes of the project's shipped segments; the oldest
	// go first. Zero or negative means no size limit.
	MaxBytes int64
}

// DefaultRetention keeps 7 days and at most 10 GiB per project.
var DefaultRetention = Retention{MaxAge: 7 * 24 * time.Hour, MaxBytes: 10 << 30}

// victim is a segment the sweep chose to delete.
type victim struct {
	workload string
	ref      SegmentRef
}

// Sweep deletes, for every project, its shipped segments older than its retention's MaxAge and
// then its oldest ones beyond MaxBytes, at most Config.SweepLimit segments per call; it returns
// how many it deleted. Each segment leaves its workload's list first (a compare-and-set), then
// loses its document and its bytes, so a reader never follows a listed segment to nothing but
// a crash between the steps can leave an unlisted blob behind (deleted by no later pass). It
// reads the whole log_workloads collection: one document per workload with a shipped log, for
// a periodic pass only.
func (x *Index) Sweep(ctx context.Context) (int, error) {
	var all []Workload
	if err := x.cfg.Store.All(ctx, WorkloadsCollection, &all); err != nil {
		return 0, fmt.Errorf("logs: sweep: %w", err)
	}
	now := x.cfg.Now()
	byProject := map[string][]Workload{}
	for _, w := range all {
		byProject[w.ProjectID] = append(byProject[w.ProjectID], w)
	}
	var victims []victim
	for project, ws := range byProject {
		pol := x.cfg.Retention(project)
		var segs []victim
		var total int64
		for _, w := range ws {
			for _, r := range w.Segments {
				segs = append(segs, victim{workload: w.ID, ref: r})
				total += r.Bytes
			}
		}
		slices.SortFunc(segs, func(a, b victim) int { return a.ref.LastTime.Compare(b.ref.LastTime) })
		for _, v := range segs {
			old := pol.MaxAge > 0 && now.Sub(v.ref.LastTime) > pol.MaxAge
			big := pol.MaxBytes > 0 && total > pol.MaxBytes
			if !old && !big {
				break
			}
			victims = append(victims, v)
			total -= v.ref.Bytes
		}
	}
	deleted := 0
	for _, v := range victims {
		if deleted >= x.cfg.SweepLimit {
			break
		}
		if err := x.deleteSegment(ctx, v); err != nil {
			return deleted, err
		}
		deleted++
	}
	return deleted, nil
}

// deleteSegment takes v out of its workload's list, then deletes its document and bytes; a
// workload left with no segment loses its document too.
func (x *Index) deleteSegment(ctx context.Context, v victim) error {
	st := x.cfg.Store
	for attempt := 0; ; attempt++ {
		if attempt == casAttempts {
			return fmt.Errorf("logs: unlist segment of %s: %w", v.workload, store.ErrConflict)
		}
		var w Workload
		err := st.Get(ctx, WorkloadsCollection, v.workload, &w)
		if errors.Is(err, store.ErrNotFound) {
			break
		}
		if err != nil {
			return fmt.Errorf("logs: read workload log: %w", err)
		}
		i := slices.IndexFunc(w.Segments, func(r SegmentRef) bool { return r.SHA256 == v.ref.SHA256 })
		if i < 0 {
			break
		}
		if len(w.Segments) == 1 {
			ok, err := st.DeleteWhen(ctx, WorkloadsCollection, w.ID, store.Fields{store.RevisionField: w.Revision})
			if err != nil {
				return fmt.Errorf("logs: delete workload log: %w", err)
			}
			if ok {
				break
			}
			continue
		}
		w.Bytes -= w.Segments[i].Bytes
		w.Segments = slices.Delete(w.Segments, i, i+1)
		expected := w.Revision
		w.Revision++
		ok, err := st.ReplaceIfRevision(ctx, st.Collection(WorkloadsCollection), w.ID, expected, w)
		if err != nil {
			return fmt.Errorf("logs: unlist segment: %w", err)
		}
		if ok {
			break
		}
	}
	if _, err := st.DeleteWhen(ctx, SegmentsCollection, "sha256:"+v.ref.SHA256, store.Fields{}); err != nil {
		return fmt.Errorf("logs: delete segment record: %w", err)
	}
	if err := x.cfg.Blobs.Delete(ctx, blobKey(v.ref.SHA256)); err != nil && !errors.Is(err, blobs.ErrNotFound) {
		return fmt.Errorf("logs: delete segment bytes: %w", err)
	}
	return nil
}

// SweepPass runs [Index.Sweep] once (berthd runs it as the platform task "logs.retention",
// docs/jobs.md section 10) and returns interval as the wait before the next pass.
func (x *Index) SweepPass(ctx context.Context, interval time.Duration) (time.Duration, error) {
	_, err := x.Sweep(ctx)
	return interval, err
}
