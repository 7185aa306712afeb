package client

import (
	"context"
	"net/http"
	"net/url"
	"time"

	abibackups "github.com/berthhq/berth/abi/backups"
)

// Backup is one service backup as the API answers it (docs/backups.md section 4.2).
type Backup struct {
	ID          string             `json:"id"`
	ProjectID   string             `json:"project_id"`
	Service     string             `json:"service"`
	Binding     string             `json:"binding"`
	Kind        string             `json:"kind"`
	Trigger     string             `json:"trigger"` // manual | schedule
	ScheduledAt time.Time          `json:"scheduled_at,omitzero"`
	OperationID string             `json:"operation_id"`
	State       string             `json:"state"` // pending | running | succeeded | failed
	FailedStep  string             `json:"failed_step,omitempty"`
	Error       string             `json:"error,omitempty"`
	Size        int64              `json:"size"`   // archive bytes
	Digest      string             `json:"digest"` // sha256:<hex> of the archive
	Figures     abibackups.Figures `json:"figures"`
	Drill       *BackupDrill       `json:"drill,omitempty"`
	CreatedAt   time.Time          `json:"created_at"`
	FinishedAt  time.Time          `json:"finished_at,omitzero"`
}

// BackupDrill is the last restore drill of a backup (docs/backups.md section 5).
type BackupDrill struct {
	Result      string                  `json:"result"` // passed | failed
	At          time.Time               `json:"at"`
	Figures     abibackups.Figures      `json:"figures"`
	Differences []abibackups.Difference `json:"differences,omitempty"`
	Table       string                  `json:"table,omitempty"` // the first differing table, collection or object
	Error       string                  `json:"error,omitempty"`
}

// RestoreRequest is the body of a restore: the target service (empty: the backup's own),
// into a scratch resource beside the live one, or into a running service.
type RestoreRequest struct {
	Into         string `json:"into,omitempty"`
	IntoScratch  bool   `json:"into_scratch,omitempty"`
	WhileRunning bool   `json:"while_running,omitempty"`
}

// RestoreAccepted is the answer of an accepted restore: its operation.
type RestoreAccepted struct {
	OperationID string `json:"operation_id"`
	State       string `json:"state"`
	Kind        string `json:"kind"`
}

// CreateBackup requests a backup of one binding of a service, or of every binding when
// binding is empty (POST /projects/{p}/services/{s}/backups, 202). With an idempotency key
// (WithIdempotencyKey) a repeat returns the same backups.
func (c *Client) CreateBackup(ctx context.Context, project, service, binding string) ([]Backup, error) {
	var out List[Backup]
	if err := c.doJSON(ctx, http.MethodPost, servicePath(project, service)+"/backups", map[string]string{"binding": binding}, true, &out); err != nil {
		return nil, err
	}
	return nonNil(out.Items), nil
}

// ListBackups lists a project's backups, newest first, of one service when service is not
// empty (GET /projects/{p}/backups).
func (c *Client) ListBackups(ctx context.Context, project, service string) ([]Backup, error) {
	q := url.Values{}
	if service != "" {
		q.Set("service", service)
	}
	var out List[Backup]
	if err := c.do(ctx, http.MethodGet, "/projects/"+pathEscape(project)+"/backups", q, nil, "", true, &out); err != nil {
		return nil, err
	}
	return nonNil(out.Items), nil
}

// RestoreBackup asks for a restore of backup id (POST /projects/{p}/backups/{id}/restore,
// 202). Refusals: backup_not_found, backup_not_restorable, service_not_found,
// restore_target_running, backup_corrupt.
func (c *Client) RestoreBackup(ctx context.Context, project, id string, req RestoreRequest) (*RestoreAccepted, error) {
	var out RestoreAccepted
	if err := c.doJSON(ctx, http.MethodPost, "/projects/"+pathEscape(project)+"/backups/"+pathEscape(id)+"/restore", req, true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// DrillBackup asks for a restore drill of backup id now (POST
// /projects/{p}/backups/{id}/drill, no body, 202 with the operation): the result lands on
// the backup's record (docs/backups.md section 5). Refusals: backup_not_found,
// backup_not_restorable. With WithIdempotencyKey a repeat answers the same operation.
func (c *Client) DrillBackup(ctx context.Context, project, id string) (*RestoreAccepted, error) {
	var out RestoreAccepted
	if err := c.do(ctx, http.MethodPost, "/projects/"+pathEscape(project)+"/backups/"+pathEscape(id)+"/drill", nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
