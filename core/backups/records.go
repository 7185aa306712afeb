// Package backups owns service backups in the core: backup records (the
// commit point of every backup), the backup, restore and drill operations on
// the operation queue, archive ingest into the blob store, retention and
// schedules (docs/backups.md). It is not core/backup, berthd's own store
// backup.
package backups

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	abibackups "github.com/berthhq/berth/abi/backups"
	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/core/blobs"
	"github.com/berthhq/berth/core/events"
	"github.com/berthhq/berth/core/operations"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/internal/digestio"
)

// Collection holds one document per backup, keyed by the backup id.
const Collection = "service_backups"

// Operation kinds on the queue (docs/backups.md section 4).
const (
	KindBackup  = "backup"  // payload [Payload]; executed by the Corestore provider
	KindRestore = "restore" // payload [RestorePayload]
	KindDrill   = "drill"   // payload [RestorePayload] with Scratch set and Drill true
)

// State is a backup record's state.
type State string

// Backup states (docs/backups.md section 4.2). Only succeeded backups exist
// as restorable data; a failed record names the step that failed.
const (
	Pending   State = "pending"   // the operation is queued; nothing is stored
	Running   State = "running"   // an attempt (Fence) holds it
	Succeeded State = "succeeded" // the archive is stored and matches Digest and Size: the commit point
	Failed    State = "failed"    // FailedStep says where; the archive, if any, was deleted
)

// Steps a failed record names.
const (
	StepDump   = "dump"   // the engine could not read the resource
	StepUpload = "upload" // the archive did not reach the blob store whole
	StepVerify = "verify" // the stored archive's digest or size is not what the executor declared
	StepRecord = "record" // the record could not be committed (a later attempt holds it)
)

// Trigger says why a backup ran.
type Trigger string

// Triggers.
const (
	TriggerManual   Trigger = "manual"
	TriggerSchedule Trigger = "schedule"
)

// Drill results of a record.
const (
	DrillPassed = "passed"
	DrillFailed = "failed"
)

// Drill is the last restore drill of a backup.
type Drill struct {
	Result      string                  `bson:"result" json:"result"` // DrillPassed | DrillFailed
	At          time.Time               `bson:"at" json:"at"`
	Figures     abibackups.Figures      `bson:"figures" json:"figures"`
	Differences []abibackups.Difference `bson:"differences" json:"differences,omitempty"`
	// Table is the first differing table, collection or object; empty when passed.
	Table string `bson:"table" json:"table,omitempty"`
	Error string `bson:"error" json:"error,omitempty"`
}

// Record is one backup: a document in [Collection].
type Record struct {
	ID        string          `bson:"_id" json:"id"` // "bkp_" + the operation id's ULID
	ProjectID string          `bson:"project_id" json:"project_id"`
	Service   string          `bson:"service" json:"service"`
	Binding   string          `bson:"binding" json:"binding"`
	Kind      abibackups.Kind `bson:"kind" json:"kind"`
	// Keep is the retention of the service's backup block when the backup was requested
	// (zero: the committer's default), applied after this backup commits.
	Keep        int       `bson:"keep,omitempty" json:"keep,omitempty"`
	Trigger     Trigger   `bson:"trigger" json:"trigger"`
	ScheduledAt time.Time `bson:"scheduled_at" json:"scheduled_at,omitzero"`
	OperationID string    `bson:"operation_id" json:"operation_id"`
	State       State     `bson:"state" json:"state"`
	FailedStep  string    `bson:"failed_step" json:"failed_step,omitempty"`
	Error       string    `bson:"error" json:"error,omitempty"`
	// Fence is the operation fence of the attempt that last held the record.
	Fence   int64  `bson:"fence" json:"fence"`
	BlobKey string `bson:"blob_key" json:"-"`
	// StoredDigest and StoredSize are what the blob store computed for the
	// attempt's upload; the commit compares the declared digest with them,
	// never with what the executor says alone.
	StoredDigest string             `bson:"stored_digest" json:"-"`
	StoredSize   int64              `bson:"stored_size" json:"-"`
	Size         int64              `bson:"size" json:"size"`       // archive bytes
	Digest       string             `bson:"digest" json:"digest"`   // "sha256:<hex>" of the archive
	Figures      abibackups.Figures `bson:"figures" json:"figures"` // recorded by the engine
	Drill        *Drill             `bson:"drill" json:"drill,omitempty"`
	CreatedAt    time.Time          `bson:"created_at" json:"created_at"`
	FinishedAt   time.Time          `bson:"finished_at" json:"finished_at,omitzero"`
}

// Payload is the canonical payload of a backup operation (never secret).
type Payload struct {
	BackupID    string          `json:"backup_id"`
	Project     string          `json:"project,omitempty"` // the project's name, when [Config.ProjectName] is set
	Keep        int             `json:"keep,omitempty"`    // the service's keep at request time; zero: the committer's
	Service     string          `json:"service"`
	Binding     string          `json:"binding"`
	Kind        abibackups.Kind `json:"kind"`
	ScheduledAt string          `json:"scheduled_at,omitempty"` // RFC 3339, schedules only
}

// projectName is the name of project id from [Config.ProjectName], or "" without one.
func (m *Manager) projectName(ctx context.Context, id string) (string, error) {
	if m.project == nil {
		return "", nil
	}
	name, err := m.project(ctx, id)
	if err != nil {
		return "", fmt.Errorf("backup: project %s: %w", id, err)
	}
	return name, nil
}

// Errors of [Manager]; each carries a code of abi/errors and is checked
// with errors.Is.
var (
	ErrNotFound      = abierrors.New(abierrors.BackupNotFound, "no such backup")
	ErrCorrupt       = abierrors.New(abierrors.BackupCorrupt, "the archive does not match its backup record")
	ErrNotRestorable = abierrors.New(abierrors.BackupNotRestorable, "the backup did not succeed")
	ErrTargetRunning = abierrors.New(abierrors.RestoreTargetRunning, "the target service is running; stop it or pass while_running")
	ErrTargetMissing = abierrors.New(abierrors.ServiceNotFound, "the restore target does not exist")
	ErrInvalid       = abierrors.New(abierrors.ValidationFailed, "invalid backup request")
	// ErrCommitted: an attempt found its record already succeeded (an earlier
	// attempt committed it before its completion was lost); the executor
	// completes the operation with the record.
	ErrCommitted = errors.New("berth: backup already committed")
)

// Config configures a [Manager]. Store, Queue and Blobs are required.
type Config struct {
	Store  *store.Store
	Queue  *operations.Queue
	Blobs  blobs.Store
	Events *events.Log // nil: no events
	// Registerer receives the metrics; nil: not registered.
	Registerer prometheus.Registerer
	// ExecutorNode, when not empty, is the runner node id of the Corestore provider's
	// executor: every backup, restore and drill operation is enqueued for that node only, so
	// no other runner claims one. Empty: any runner node may claim them.
	ExecutorNode string
	// ProjectName, when set, names a project by id; payloads then carry the name, which is
	// how the Corestore provider knows its binding resources (<project>/<service>/<binding>).
	// nil: payloads carry no name and the executor resolves by the operation's project id.
	ProjectName func(ctx context.Context, projectID string) (string, error)
	// MaxArchiveBytes bounds one archive; zero means 64 GiB.
	MaxArchiveBytes int64
	Now             func() time.Time // nil: time.Now
	Log             *slog.Logger     // nil: slog.Default()
}

// Manager runs backups, restores and drills on one store. Safe for
// concurrent use by any number of berthd processes on one store: every
// state change is one conditional update of one record.
type Manager struct {
	st      *store.Store
	coll    *mongo.Collection
	q       *operations.Queue
	blobs   blobs.Store
	ev      *events.Log
	max     int64
	target  string
	project func(ctx context.Context, projectID string) (string, error)
	now     func() time.Time
	log     *slog.Logger
	metrics metrics
}

type metrics struct {
	backups *prometheus.CounterVec // by kind, result
	drills  *prometheus.CounterVec // by kind, result
	bytes   prometheus.Counter
}

// New returns a Manager. It does no I/O.
func New(cfg Config) *Manager {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.MaxArchiveBytes <= 0 {
		cfg.MaxArchiveBytes = 64 << 30
	}
	m := &Manager{st: cfg.Store, coll: cfg.Store.Collection(Collection), q: cfg.Queue, blobs: cfg.Blobs, ev: cfg.Events,
		max: cfg.MaxArchiveBytes, target: cfg.ExecutorNode, project: cfg.ProjectName, now: cfg.Now, log: cfg.Log}
	m.metrics = metrics{
		backups: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "berth_backups_total", Help: "Service backups settled, by kind and result (succeeded, failed)."}, []string{"kind", "result"}),
		drills:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "berth_backup_drills_total", Help: "Restore drills recorded, by kind and result (passed, failed)."}, []string{"kind", "result"}),
		bytes:   prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_backup_archive_bytes_total", Help: "Archive bytes committed to the blob store."}),
	}
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(m.metrics.backups, m.metrics.drills, m.metrics.bytes)
	}
	return m
}

// Get returns backup id of project. Errors: ErrNotFound.
func (m *Manager) Get(ctx context.Context, projectID, id string) (*Record, error) {
	var r Record
	err := store.FindByID(ctx, m.coll, id, &r)
	if errors.Is(err, store.ErrNotFound) || (err == nil && r.ProjectID != projectID) {
		return nil, fmt.Errorf("backup %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("backups: get %s: %w", id, err)
	}
	return &r, nil
}

// List returns the backups of one service of a project (all services when
// service is empty), newest first. It scans the collection (not a hot path:
// operators list, retention runs after a commit).
func (m *Manager) List(ctx context.Context, projectID, service string) ([]Record, error) {
	filter := bson.D{{Key: "project_id", Value: projectID}}
	if service != "" {
		filter = append(filter, bson.E{Key: "service", Value: service})
	}
	cur, err := m.coll.Find(ctx, filter)
	if err != nil {
		return nil, fmt.Errorf("backups: list: %w", err)
	}
	var out []Record
	if err := cur.All(ctx, &out); err != nil {
		return nil, fmt.Errorf("backups: list: %w", err)
	}
	slices.SortFunc(out, func(a, b Record) int {
		if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(b.ID, a.ID)
	})
	return out, nil
}

// BackupRequest asks for one backup of one binding of a service.
type BackupRequest struct {
	ProjectID string
	Service   string
	Binding   string
	Kind      abibackups.Kind
	// ScheduledAt is the schedule's time for a scheduled backup; zero for
	// one on demand.
	ScheduledAt time.Time
	// Keep is the service's retention (its backup block's keep) applied when this backup
	// commits; zero leaves the committer's default ([DefaultKeep] on the runner transport).
	Keep int
	// IdempotencyKey of an on-demand request (the API's Idempotency-Key);
	// ignored for scheduled ones, whose key is the scheduled time.
	IdempotencyKey string
}

// backupKey is the operation's idempotency key: service, binding and the
// scheduled time, or the caller's key for a backup on demand.
func backupKey(r BackupRequest) string {
	when := "manual:" + r.IdempotencyKey
	if !r.ScheduledAt.IsZero() {
		when = "schedule:" + r.ScheduledAt.UTC().Format(time.RFC3339)
	}
	sum := sha256.Sum256([]byte(r.Service + "\x00" + r.Binding + "\x00" + when))
	return "backup:" + hex.EncodeToString(sum[:16])
}

// recordID derives a backup id from its operation id.
func recordID(opID string) string { return "bkp_" + strings.TrimPrefix(opID, "op_") }

// Request enqueues a backup operation and writes its pending record, or
// returns the backup an earlier request with the same key made (created
// false). Both writes are idempotent: a repeat after a crash between them
// converges, and an executor that finds no record writes it ([Manager.Begin]).
// Errors: ErrInvalid, or the queue's (idempotency_key_reused).
func (m *Manager) Request(ctx context.Context, r BackupRequest) (*Record, bool, error) {
	if r.ProjectID == "" || r.Service == "" || r.Binding == "" {
		return nil, false, fmt.Errorf("backup: project, service and binding are required: %w", ErrInvalid)
	}
	switch r.Kind {
	case abibackups.KindPostgres, abibackups.KindMongoDB, abibackups.KindS3:
	default:
		return nil, false, fmt.Errorf("backup: binding kind %q: %w", r.Kind, ErrInvalid)
	}
	if r.ScheduledAt.IsZero() && r.IdempotencyKey == "" {
		return nil, false, fmt.Errorf("backup: an on-demand backup needs an idempotency key: %w", ErrInvalid)
	}
	name, err := m.projectName(ctx, r.ProjectID)
	if err != nil {
		return nil, false, err
	}
	if r.Keep < 0 {
		return nil, false, fmt.Errorf("backup: keep %d: %w", r.Keep, ErrInvalid)
	}
	p := Payload{Project: name, Service: r.Service, Binding: r.Binding, Kind: r.Kind, Keep: r.Keep}
	if !r.ScheduledAt.IsZero() {
		p.ScheduledAt = r.ScheduledAt.UTC().Format(time.RFC3339)
	}
	body, _ := json.Marshal(p)
	op, _, err := m.q.Enqueue(ctx, operations.EnqueueRequest{ProjectID: r.ProjectID, Kind: KindBackup, IdempotencyKey: backupKey(r), Payload: body, TargetNode: m.target})
	if err != nil {
		return nil, false, fmt.Errorf("backup %s/%s: %w", r.Service, r.Binding, err)
	}
	return m.ensure(ctx, op)
}

// ensure inserts the pending record of backup operation op unless it exists.
func (m *Manager) ensure(ctx context.Context, op *operations.Operation) (*Record, bool, error) {
	var p Payload
	if err := json.Unmarshal([]byte(op.Payload), &p); err != nil {
		return nil, false, fmt.Errorf("backup operation %s payload: %w", op.ID, err)
	}
	rec := &Record{ID: recordID(op.ID), ProjectID: op.ProjectID, Service: p.Service, Binding: p.Binding, Kind: p.Kind, Keep: p.Keep,
		Trigger: TriggerManual, OperationID: op.ID, State: Pending, CreatedAt: op.CreatedAt.UTC(), Figures: abibackups.Figures{Kind: p.Kind, Items: []abibackups.Item{}}}
	if p.ScheduledAt != "" {
		rec.Trigger = TriggerSchedule
		rec.ScheduledAt, _ = time.Parse(time.RFC3339, p.ScheduledAt)
	}
	if _, err := m.coll.InsertOne(ctx, rec); err != nil {
		if !store.IsDuplicateKey(err) {
			return nil, false, fmt.Errorf("backups: record %s: %w", rec.ID, err)
		}
		cur, err := m.Get(ctx, op.ProjectID, rec.ID)
		return cur, false, err
	}
	return rec, true, nil
}

// Begin is an executor's first call for backup operation opID under lease h:
// it checks the lease, writes the record if the request's write was lost,
// and marks it running under h's fence. Errors: operations.ErrLeaseLost;
// ErrCommitted when an earlier attempt already committed the backup (the
// executor completes the operation); a later attempt's record is lease lost.
func (m *Manager) Begin(ctx context.Context, opID string, h operations.Holder) (*Record, error) {
	op, err := m.q.Check(ctx, opID, h)
	if err != nil {
		return nil, err
	}
	rec, _, err := m.ensure(ctx, op)
	if err != nil {
		return nil, err
	}
	if rec.State == Succeeded {
		return rec, fmt.Errorf("backup %s: %w", rec.ID, ErrCommitted)
	}
	if rec.Fence > h.Fence {
		return nil, fmt.Errorf("backup %s held by fence %d: %w", rec.ID, rec.Fence, operations.ErrLeaseLost)
	}
	ok, err := m.st.UpdateIf(ctx, m.coll, rec.ID, bson.D{{Key: "state", Value: string(rec.State)}, {Key: "fence", Value: rec.Fence}},
		bson.M{"$set": bson.M{"state": Running, "fence": h.Fence, "failed_step": "", "error": ""}})
	if err != nil {
		return nil, fmt.Errorf("backups: begin %s: %w", rec.ID, err)
	}
	if !ok {
		return nil, fmt.Errorf("backup %s changed while beginning: %w", rec.ID, operations.ErrLeaseLost)
	}
	rec.State, rec.Fence, rec.FailedStep, rec.Error = Running, h.Fence, "", ""
	return rec, nil
}

// archiveKey is where attempt fence of backup id stores its archive: one
// key per attempt, so a stale attempt never overwrites a newer one's bytes.
func archiveKey(projectID, id string, fence int64) string {
	return fmt.Sprintf("backups/%s/%s/%d.archive", projectID, id, fence)
}

// Upload streams an executor's archive for backup operation opID into the
// blob store, hashing and counting it in flight, under lease h (checked
// before and after the stream). It returns what was stored. On any error the
// record is failed at StepUpload (retryable) and nothing stays stored.
// Errors: operations.ErrLeaseLost, blobs.ErrTooLarge, the reader's error.
func (m *Manager) Upload(ctx context.Context, opID string, h operations.Holder, r io.Reader) (blobs.Info, error) {
	op, err := m.q.Check(ctx, opID, h)
	if err != nil {
		return blobs.Info{}, err
	}
	rec, err := m.Get(ctx, op.ProjectID, recordID(opID))
	if err != nil {
		return blobs.Info{}, err
	}
	if rec.State != Running || rec.Fence != h.Fence {
		return blobs.Info{}, fmt.Errorf("backup %s is %s under fence %d: %w", rec.ID, rec.State, rec.Fence, operations.ErrLeaseLost)
	}
	key := archiveKey(op.ProjectID, rec.ID, h.Fence)
	info, err := m.blobs.Put(ctx, key, r, blobs.PutOptions{MaxBytes: m.max, ContentType: "application/octet-stream"})
	if err == nil {
		_, err = m.q.Check(ctx, opID, h)
	}
	if err == nil {
		var ok bool
		ok, err = m.st.UpdateIf(ctx, m.coll, rec.ID, bson.D{{Key: "state", Value: string(Running)}, {Key: "fence", Value: h.Fence}},
			bson.M{"$set": bson.M{"blob_key": key, "stored_digest": info.SHA256, "stored_size": info.Size}})
		if err == nil && !ok {
			err = fmt.Errorf("backup %s changed during the upload: %w", rec.ID, operations.ErrLeaseLost)
		}
	}
	if err != nil {
		_ = m.blobs.Delete(context.WithoutCancel(ctx), key)
		m.failRecord(ctx, rec.ID, h.Fence, StepUpload, err)
		return blobs.Info{}, fmt.Errorf("backup %s upload: %w", rec.ID, err)
	}
	return info, nil
}

// Declared is what an executor states about the archive it uploaded.
type Declared struct {
	Digest  string             `json:"digest"` // "sha256:<hex>" computed by the executor as it streamed
	Size    int64              `json:"size"`
	Figures abibackups.Figures `json:"figures"`
}

// Commit is the commit point of backup operation opID under lease h: it
// compares the stored archive with d, then writes the record succeeded with
// one conditional update (state running, fence h's), completes the
// operation and applies retention (keep the newest keep settled backups of
// the service and binding: the record's own keep, from the service's backup block at request
// time, else keep; zero keeps all). A mismatch deletes the archive,
// fails the record at StepVerify and the operation (not retryable), and
// returns ErrCorrupt. Errors: operations.ErrLeaseLost, ErrCorrupt.
func (m *Manager) Commit(ctx context.Context, opID string, h operations.Holder, d Declared, keep int) (*Record, error) {
	op, err := m.q.Check(ctx, opID, h)
	if err != nil {
		return nil, err
	}
	rec, err := m.Get(ctx, op.ProjectID, recordID(opID))
	if err != nil {
		return nil, err
	}
	if rec.State != Running || rec.Fence != h.Fence {
		return nil, fmt.Errorf("backup %s is %s under fence %d: %w", rec.ID, rec.State, rec.Fence, operations.ErrLeaseLost)
	}
	key := archiveKey(op.ProjectID, rec.ID, h.Fence)
	info := blobs.Info{Key: key, Size: rec.StoredSize, SHA256: rec.StoredDigest}
	if rec.BlobKey != key || info.SHA256 == "" || info.SHA256 != normalDigest(d.Digest) || info.Size != d.Size {
		_ = m.blobs.Delete(context.WithoutCancel(ctx), key)
		cause := fmt.Errorf("stored archive %q (%d bytes) is not the declared %s (%d bytes): %w", info.SHA256, info.Size, d.Digest, d.Size, ErrCorrupt)
		m.failRecord(ctx, rec.ID, h.Fence, StepVerify, cause)
		if _, ferr := m.q.Fail(ctx, opID, h, "verify: "+cause.Error(), false); ferr != nil {
			m.log.Warn("backup operation not failed", "operation", opID, "err", ferr)
		}
		m.metrics.backups.WithLabelValues(string(rec.Kind), string(Failed)).Inc()
		return nil, fmt.Errorf("backup %s: %w", rec.ID, cause)
	}
	if d.Figures.Items == nil {
		d.Figures.Items = []abibackups.Item{}
	}
	now := m.now().UTC()
	ok, err := m.st.UpdateIf(ctx, m.coll, rec.ID, bson.D{{Key: "state", Value: string(Running)}, {Key: "fence", Value: h.Fence}},
		bson.M{"$set": bson.M{"state": Succeeded, "blob_key": key, "size": info.Size, "digest": info.SHA256, "figures": d.Figures, "finished_at": now}})
	if err != nil {
		return nil, fmt.Errorf("backups: commit %s: %w", rec.ID, err)
	}
	if !ok {
		return nil, fmt.Errorf("backup %s changed before its commit: %w", rec.ID, operations.ErrLeaseLost)
	}
	rec.State, rec.BlobKey, rec.Size, rec.Digest, rec.Figures, rec.FinishedAt = Succeeded, key, info.Size, info.SHA256, d.Figures, now
	m.metrics.backups.WithLabelValues(string(rec.Kind), string(Succeeded)).Inc()
	m.metrics.bytes.Add(float64(info.Size))
	if err := m.CompleteCommitted(ctx, opID, h, rec); err != nil {
		return rec, err
	}
	if rec.Keep > 0 {
		keep = rec.Keep
	}
	if keep > 0 {
		if err := m.Prune(ctx, rec.ProjectID, rec.Service, rec.Binding, keep); err != nil {
			m.log.Warn("backup retention", "service", rec.Service, "err", err)
		}
	}
	return rec, nil
}

// CompleteCommitted settles the operation of a committed backup (also after
// [Manager.Begin] returned ErrCommitted).
func (m *Manager) CompleteCommitted(ctx context.Context, opID string, h operations.Holder, rec *Record) error {
	res, _ := json.Marshal(map[string]any{"backup_id": rec.ID, "digest": rec.Digest, "size": rec.Size})
	if _, err := m.q.Complete(ctx, opID, h, res); err != nil {
		return fmt.Errorf("backup %s: complete operation: %w", rec.ID, err)
	}
	return nil
}

// Fail records a failed attempt of backup operation opID at step (StepDump
// or StepUpload) and fails the attempt on the queue (retryable: retried with
// the queue's backoff). The record stays failed unless a retry commits.
func (m *Manager) Fail(ctx context.Context, opID string, h operations.Holder, step string, cause error, retryable bool) error {
	op, err := m.q.Check(ctx, opID, h)
	if err != nil {
		return err
	}
	m.failRecord(ctx, recordID(opID), h.Fence, step, cause)
	if _, err := m.q.Fail(ctx, opID, h, step+": "+cause.Error(), retryable); err != nil {
		return err
	}
	if !retryable {
		m.metrics.backups.WithLabelValues(op.Kind, string(Failed)).Inc()
	}
	return nil
}

// failRecord marks record id failed at step when attempt fence still holds
// it; a record another attempt holds or committed is left alone.
func (m *Manager) failRecord(ctx context.Context, id string, fence int64, step string, cause error) {
	msg := cause.Error()
	if len(msg) > 1024 {
		msg = msg[:1024]
	}
	_, err := m.st.UpdateIf(context.WithoutCancel(ctx), m.coll, id, bson.D{{Key: "state", Value: string(Running)}, {Key: "fence", Value: fence}},
		bson.M{"$set": bson.M{"state": Failed, "failed_step": step, "error": msg, "finished_at": m.now().UTC()}})
	if err != nil {
		m.log.Warn("backup record not failed", "backup", id, "step", step, "err", err)
	}
}

// Prune keeps the newest keep settled (succeeded or failed) backups of one
// service binding and deletes the rest: every archive of the record first,
// then the record, so a crash between the two leaves a record a later prune
// finishes, never an archive without one. Pending and running records are
// not counted.
func (m *Manager) Prune(ctx context.Context, projectID, service, binding string, keep int) error {
	all, err := m.List(ctx, projectID, service)
	if err != nil {
		return err
	}
	n := 0
	for _, r := range all {
		if r.Binding != binding || (r.State != Succeeded && r.State != Failed) {
			continue
		}
		if n++; n <= keep {
			continue
		}
		err := m.blobs.List(ctx, fmt.Sprintf("backups/%s/%s/", projectID, r.ID), func(i blobs.Info) error {
			return m.blobs.Delete(ctx, i.Key)
		})
		if err != nil {
			return fmt.Errorf("backups: prune %s: %w", r.ID, err)
		}
		if _, err := m.st.DeleteIf(ctx, m.coll, r.ID, bson.D{{Key: "state", Value: string(r.State)}}); err != nil {
			return fmt.Errorf("backups: prune %s: %w", r.ID, err)
		}
	}
	return nil
}

// VerifyArchive reads a succeeded backup's archive whole and checks its size
// and SHA-256 against the record. Errors: ErrNotRestorable, ErrCorrupt (a
// missing archive too).
func (m *Manager) VerifyArchive(ctx context.Context, rec *Record) error {
	if rec.State != Succeeded {
		return fmt.Errorf("backup %s is %s: %w", rec.ID, rec.State, ErrNotRestorable)
	}
	rc, _, err := m.blobs.Get(ctx, rec.BlobKey, 0, -1)
	if errors.Is(err, blobs.ErrNotFound) {
		return fmt.Errorf("backup %s: archive missing: %w", rec.ID, ErrCorrupt)
	}
	if err != nil {
		return fmt.Errorf("backup %s: open archive: %w", rec.ID, err)
	}
	defer rc.Close()
	h := sha256.New()
	n, err := io.Copy(h, rc)
	if err != nil {
		return fmt.Errorf("backup %s: read archive: %w", rec.ID, err)
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != rec.Digest || n != rec.Size {
		return fmt.Errorf("backup %s: archive is %s (%d bytes), record says %s (%d bytes): %w", rec.ID, got, n, rec.Digest, rec.Size, ErrCorrupt)
	}
	return nil
}

// OpenArchive opens a succeeded backup's archive for an executor under lease
// h of a restore or drill operation of the same project; the reader fails
// at its end (instead of returning io.EOF) when the bytes do not hash to the
// record's digest. Errors: operations.ErrLeaseLost, ErrNotFound,
// ErrNotRestorable.
func (m *Manager) OpenArchive(ctx context.Context, opID string, h operations.Holder, backupID string) (io.ReadCloser, *Record, error) {
	op, err := m.q.Check(ctx, opID, h)
	if err != nil {
		return nil, nil, err
	}
	rec, err := m.Get(ctx, op.ProjectID, backupID)
	if err != nil {
		return nil, nil, err
	}
	if rec.State != Succeeded {
		return nil, nil, fmt.Errorf("backup %s is %s: %w", rec.ID, rec.State, ErrNotRestorable)
	}
	rc, _, err := m.blobs.Get(ctx, rec.BlobKey, 0, -1)
	if err != nil {
		if errors.Is(err, blobs.ErrNotFound) {
			return nil, nil, fmt.Errorf("backup %s: archive missing: %w", rec.ID, ErrCorrupt)
		}
		return nil, nil, err
	}
	return digestio.Verify(rc, rec.Digest, rec.Size, ErrCorrupt), rec, nil
}

func normalDigest(d string) string {
	if !strings.HasPrefix(d, "sha256:") {
		return "sha256:" + d
	}
	return d
}
