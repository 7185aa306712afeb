package backups

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	abibackups "github.com/berthhq/berth/abi/backups"
	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/operations"
)

// RestorePayload is the canonical payload of a restore or drill operation.
type RestorePayload struct {
	BackupID string          `json:"backup_id"`
	Project  string          `json:"project,omitempty"` // the project's name, when [Config.ProjectName] is set
	Kind     abibackups.Kind `json:"kind"`
	// Service and Binding name the target; the binding's resource is
	// restored into (Clean), unless Scratch is set.
	Service string `json:"service"`
	Binding string `json:"binding"`
	// Scratch names a new resource beside the live one to restore into
	// (--into-scratch and drills): "<binding resource>_restore_<suffix>".
	Scratch string `json:"scratch,omitempty"`
	Drill   bool   `json:"drill,omitempty"`
}

// Target answers what a restore needs to know about its target service.
// The core's services package implements it at wiring time.
type Target interface {
	// ServiceState reports whether service exists in the project, whether
	// any of its replicas is running, and whether it declares binding.
	ServiceState(ctx context.Context, projectID, service, binding string) (exists, running, hasBinding bool, err error)
}

// TargetFunc adapts a function to [Target].
type TargetFunc func(ctx context.Context, projectID, service, binding string) (bool, bool, bool, error)

// ServiceState implements Target.
func (f TargetFunc) ServiceState(ctx context.Context, projectID, service, binding string) (bool, bool, bool, error) {
	return f(ctx, projectID, service, binding)
}

// RestoreRequest asks for one restore (docs/backups.md section 6).
type RestoreRequest struct {
	ProjectID string
	BackupID  string
	// Into names the target service; empty: the backup's own service.
	Into string
	// IntoScratch restores into a new scratch resource beside the live one.
	IntoScratch bool
	// WhileRunning allows a restore into a running service's live resource.
	WhileRunning bool
	// IdempotencyKey is the caller's key (the API's Idempotency-Key); required.
	IdempotencyKey string
}

// Restore checks every precondition before anything changes and then
// enqueues the restore operation. In order: 1. the backup exists in the
// project and succeeded; 2. the target service exists and declares the
// backup's binding; 3. it is stopped, or WhileRunning or IntoScratch; 4. the
// archive in the blob store hashes to the record's digest and size. A repeat
// with the same key returns the first operation. Errors: ErrNotFound,
// ErrNotRestorable, ErrTargetMissing, ErrTargetRunning, ErrCorrupt,
// ErrInvalid.
func (m *Manager) Restore(ctx context.Context, t Target, r RestoreRequest) (*operations.Operation, error) {
	if r.IdempotencyKey == "" {
		return nil, fmt.Errorf("restore: an idempotency key is required: %w", ErrInvalid)
	}
	rec, err := m.Get(ctx, r.ProjectID, r.BackupID)
	if err != nil {
		return nil, err
	}
	if rec.State != Succeeded {
		return nil, fmt.Errorf("backup %s is %s: %w", rec.ID, rec.State, ErrNotRestorable)
	}
	into := r.Into
	if into == "" {
		into = rec.Service
	}
	exists, running, has, err := t.ServiceState(ctx, r.ProjectID, into, rec.Binding)
	if err != nil {
		return nil, fmt.Errorf("restore %s: read target %s: %w", rec.ID, into, err)
	}
	if !exists || !has {
		return nil, fmt.Errorf("restore %s into %s (binding %s): %w", rec.ID, into, rec.Binding, ErrTargetMissing)
	}
	if running && !r.WhileRunning && !r.IntoScratch {
		return nil, fmt.Errorf("restore %s into %s: %w", rec.ID, into, ErrTargetRunning)
	}
	if err := m.VerifyArchive(ctx, rec); err != nil {
		return nil, err
	}
	name, err := m.projectName(ctx, r.ProjectID)
	if err != nil {
		return nil, err
	}
	p := RestorePayload{BackupID: rec.ID, Project: name, Kind: rec.Kind, Service: into, Binding: rec.Binding}
	if r.IntoScratch {
		p.Scratch = scratchName(rec.Binding, "restore", r.IdempotencyKey)
	}
	body, _ := json.Marshal(p)
	op, _, err := m.q.Enqueue(ctx, operations.EnqueueRequest{ProjectID: r.ProjectID, Kind: KindRestore, IdempotencyKey: "restore:" + r.IdempotencyKey, Payload: body, TargetNode: m.target})
	if err != nil {
		return nil, fmt.Errorf("restore %s: %w", rec.ID, err)
	}
	return op, nil
}

// scratchName is a resource name beside the binding's: lower case letters,
// digits and underscores, at most 40 bytes, valid as a PostgreSQL or
// MongoDB database and (with underscores read as hyphens by the provider)
// an S3 bucket.
func scratchName(binding, what, key string) string {
	sum := sha256.Sum256([]byte(key))
	b := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, strings.ToLower(binding))
	if len(b) > 16 {
		b = b[:16]
	}
	return b + "_" + what + "_" + hex.EncodeToString(sum[:6])
}

// Drill enqueues a restore drill of the latest succeeded backup of one
// service binding, keyed by period (e.g. the ISO week "2026-W49"), so
// replicas and repeats of a schedule tick converge on one drill. It returns
// nil, nil when the binding has no succeeded backup yet.
func (m *Manager) Drill(ctx context.Context, projectID, service, binding, period string) (*operations.Operation, error) {
	all, err := m.List(ctx, projectID, service)
	if err != nil {
		return nil, err
	}
	name, err := m.projectName(ctx, projectID)
	if err != nil {
		return nil, err
	}
	for _, rec := range all {
		if rec.Binding != binding || rec.State != Succeeded {
			continue
		}
		key := "drill:" + service + ":" + binding + ":" + period
		p := RestorePayload{BackupID: rec.ID, Project: name, Kind: rec.Kind, Service: service, Binding: binding, Scratch: scratchName(binding, "drill", key), Drill: true}
		body, _ := json.Marshal(p)
		op, _, err := m.q.Enqueue(ctx, operations.EnqueueRequest{ProjectID: projectID, Kind: KindDrill, IdempotencyKey: key, Payload: body, TargetNode: m.target})
		if err != nil {
			return nil, fmt.Errorf("drill of %s: %w", rec.ID, err)
		}
		return op, nil
	}
	return nil, nil
}

// DrillBackup enqueues a drill of backup id of the project now, whichever backup is the
// latest (docs/backups.md section 5): an operator proving one backup on demand. The key
// (the caller's Idempotency-Key) makes a repeated request answer the same operation. The
// archive is not checked here: a drill of an altered archive runs and records failed.
// Errors: ErrNotFound, ErrNotRestorable.
func (m *Manager) DrillBackup(ctx context.Context, projectID, id, key string) (*operations.Operation, error) {
	rec, err := m.Get(ctx, projectID, id)
	if err != nil {
		return nil, err
	}
	if rec.State != Succeeded {
		return nil, fmt.Errorf("drill of %s (%s): %w", rec.ID, rec.State, ErrNotRestorable)
	}
	name, err := m.projectName(ctx, projectID)
	if err != nil {
		return nil, err
	}
	key = "drill:" + rec.ID + ":" + key
	p := RestorePayload{BackupID: rec.ID, Project: name, Kind: rec.Kind, Service: rec.Service, Binding: rec.Binding, Scratch: scratchName(rec.Binding, "drill", key), Drill: true}
	body, _ := json.Marshal(p)
	op, _, err := m.q.Enqueue(ctx, operations.EnqueueRequest{ProjectID: projectID, Kind: KindDrill, IdempotencyKey: key, Payload: body, TargetNode: m.target})
	if err != nil {
		return nil, fmt.Errorf("drill of %s: %w", rec.ID, err)
	}
	return op, nil
}

// EventDrillFailed is the event type raised when a drill finds a backup
// that does not restore to its recorded figures.
const EventDrillFailed = "backup.drill_failed"

// RecordDrill stores the result of drill operation opID (under lease h) on
// its backup with one conditional update (the record must still be
// succeeded), completes the operation, and on a failed drill raises an
// [EventDrillFailed] event and counts berth_backup_drills_total{result=
// "failed"}. Errors: operations.ErrLeaseLost, ErrNotFound.
func (m *Manager) RecordDrill(ctx context.Context, opID string, h operations.Holder, res abibackups.DrillResult) (*Drill, error) {
	op, err := m.q.Check(ctx, opID, h)
	if err != nil {
		return nil, err
	}
	var p RestorePayload
	if err := json.Unmarshal([]byte(op.Payload), &p); err != nil || op.Kind != KindDrill {
		return nil, fmt.Errorf("operation %s is not a drill: %w", opID, ErrInvalid)
	}
	d := &Drill{Result: DrillFailed, At: m.now().UTC(), Figures: res.Figures, Differences: res.Differences, Error: res.Error}
	if res.Passed && res.Error == "" {
		d.Result = DrillPassed
	}
	if len(res.Differences) > 0 {
		d.Table = res.Differences[0].Name
	}
	if d.Differences == nil {
		d.Differences = []abibackups.Difference{}
	}
	if d.Figures.Items == nil {
		d.Figures.Items = []abibackups.Item{}
	}
	ok, err := m.st.UpdateIf(ctx, m.coll, p.BackupID, bson.D{{Key: "state", Value: string(Succeeded)}}, bson.M{"$set": bson.M{"drill": d}})
	if err != nil {
		return nil, fmt.Errorf("backups: record drill of %s: %w", p.BackupID, err)
	}
	if !ok {
		return nil, fmt.Errorf("drill of backup %s: %w", p.BackupID, ErrNotFound)
	}
	m.metrics.drills.WithLabelValues(string(p.Kind), d.Result).Inc()
	if d.Result == DrillFailed {
		m.log.Warn("restore drill failed", "backup", p.BackupID, "service", p.Service, "binding", p.Binding, "table", d.Table, "error", d.Error)
		if m.ev != nil {
			ev := node.Event{SchemaVersion: 1, ID: identity.NewID("evt_"), Type: EventDrillFailed, Time: d.At,
				Source: node.EventSource{Kind: "core"}, Subject: node.EventRef{Type: "backup", ID: p.BackupID}, ProjectID: op.ProjectID,
				Actor: node.EventRef{Type: "system", ID: "berthd"},
				Data:  map[string]any{"service": p.Service, "binding": p.Binding, "table": d.Table, "error": d.Error, "differences": len(d.Differences)}}
			if _, _, err := m.ev.Append(ctx, ev); err != nil {
				m.log.Warn("drill event not recorded", "backup", p.BackupID, "err", err)
			}
		}
	}
	out, _ := json.Marshal(map[string]any{"backup_id": p.BackupID, "drill": d.Result, "table": d.Table})
	if _, err := m.q.Complete(ctx, opID, h, out); err != nil {
		return d, fmt.Errorf("drill of %s: complete operation: %w", p.BackupID, err)
	}
	return d, nil
}

// ISOWeek is the drill period of a weekly drill at t ("2026-W49").
func ISOWeek(t time.Time) string {
	y, w := t.UTC().ISOWeek()
	return fmt.Sprintf("%d-W%02d", y, w)
}

// Source returns the backup a restore or drill operation opID names, under lease h.
// Errors: operations.ErrLeaseLost, ErrNotFound, ErrNotRestorable, ErrInvalid.
func (m *Manager) Source(ctx context.Context, opID string, h operations.Holder) (*Record, error) {
	op, err := m.q.Check(ctx, opID, h)
	if err != nil {
		return nil, err
	}
	var p RestorePayload
	if (op.Kind != KindRestore && op.Kind != KindDrill) || json.Unmarshal([]byte(op.Payload), &p) != nil {
		return nil, fmt.Errorf("operation %s reads no backup: %w", opID, ErrInvalid)
	}
	rec, err := m.Get(ctx, op.ProjectID, p.BackupID)
	if err != nil {
		return nil, err
	}
	if rec.State != Succeeded {
		return nil, fmt.Errorf("backup %s is %s: %w", rec.ID, rec.State, ErrNotRestorable)
	}
	return rec, nil
}
