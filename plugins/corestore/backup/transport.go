package backup

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	abierrors "github.com/berthhq/berth/abi/errors"
	abirunner "github.com/berthhq/berth/abi/runner"
	"github.com/berthhq/berth/internal/digestio"
)

// HTTPCoordinator is the [Coordinator] of one leased operation over berthd's runner transport
// (docs/backups.md section 2): every call carries the runner node credential as its bearer and
// the operation's lease; the archive upload streams the request body.
type HTTPCoordinator struct {
	BaseURL    string // berthd's URL, e.g. https://berthd:7070
	Credential string // the runner node credential (never in a URL)
	Lease      abirunner.Lease
	HTTP       *http.Client // nil: http.DefaultClient
}

var _ Coordinator = (*HTTPCoordinator)(nil)

func (h *HTTPCoordinator) client() *http.Client {
	if h.HTTP == nil {
		return http.DefaultClient
	}
	return h.HTTP
}

func (h *HTTPCoordinator) send(ctx context.Context, path, ctype string, body io.Reader, hdr map[string]string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(h.BaseURL, "/")+abirunner.Prefix+path, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+h.Credential)
	req.Header.Set("Content-Type", ctype)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := h.client().Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %w", path, ErrUnreachable, err)
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		var p struct {
			Code   string `json:"code"`
			Detail string `json:"detail"`
		}
		_ = json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&p)
		if p.Code == "" {
			p.Code = string(abierrors.Internal)
		}
		return nil, fmt.Errorf("%s: %d: %w", path, resp.StatusCode, abierrors.New(abierrors.Code(p.Code), p.Detail))
	}
	return resp, nil
}

func (h *HTTPCoordinator) call(ctx context.Context, path string, in, out any) error {
	b, err := json.Marshal(in)
	if err != nil {
		return err
	}
	resp, err := h.send(ctx, path, "application/json", bytes.NewReader(b), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		return nil
	}
	return json.NewDecoder(io.LimitReader(resp.Body, abirunner.MaxResponseBytes)).Decode(out)
}

// Begin implements Coordinator.
func (h *HTTPCoordinator) Begin(ctx context.Context) (bool, error) {
	var out abirunner.BackupBeginResponse
	err := h.call(ctx, abirunner.PathBackupBegin, abirunner.BackupBeginRequest{Lease: h.Lease}, &out)
	return out.Committed, err
}

// Upload implements Coordinator: r is the request body, streamed.
func (h *HTTPCoordinator) Upload(ctx context.Context, r io.Reader) error {
	resp, err := h.send(ctx, abirunner.PathBackupArchive, "application/octet-stream", r, map[string]string{
		abirunner.HeaderNodeID: h.Lease.NodeID, abirunner.HeaderOperationID: h.Lease.OperationID,
		abirunner.HeaderLeaseToken: h.Lease.LeaseToken, abirunner.HeaderFence: strconv.FormatInt(h.Lease.Fence, 10)})
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

// Commit implements Coordinator.
func (h *HTTPCoordinator) Commit(ctx context.Context, d Declared) error {
	return h.call(ctx, abirunner.PathBackupCommit, abirunner.BackupCommitRequest{Lease: h.Lease, Digest: d.Digest, Size: d.Size, Figures: d.Figures}, nil)
}

// Fail implements Coordinator.
func (h *HTTPCoordinator) Fail(ctx context.Context, step string, cause error, retryable bool) error {
	return h.call(ctx, abirunner.PathBackupFail, abirunner.BackupFailRequest{Lease: h.Lease, Step: step, Error: cause.Error(), Retryable: retryable}, nil)
}

// Archive implements Coordinator: the record's figures, then the archive streamed, checked
// here too against the record's digest and size at its end.
func (h *HTTPCoordinator) Archive(ctx context.Context) (io.ReadCloser, Figures, error) {
	var rec abirunner.BackupRecordResponse
	if err := h.call(ctx, abirunner.PathBackupRecord, h.Lease, &rec); err != nil {
		return nil, Figures{}, err
	}
	b, _ := json.Marshal(h.Lease)
	resp, err := h.send(ctx, abirunner.PathBackupSource, "application/json", bytes.NewReader(b), nil)
	if err != nil {
		return nil, Figures{}, err
	}
	return digestio.Verify(resp.Body, rec.Digest, rec.Size, ErrArchiveInvalid), rec.Figures, nil
}

// Drilled implements Coordinator.
func (h *HTTPCoordinator) Drilled(ctx context.Context, res DrillResult) error {
	return h.call(ctx, abirunner.PathBackupDrill, abirunner.BackupDrillRequest{Lease: h.Lease, Result: res}, nil)
}

// Restored implements Coordinator (the transport's complete call).
func (h *HTTPCoordinator) Restored(ctx context.Context) error {
	return h.call(ctx, abirunner.PathComplete, abirunner.CompleteRequest{Lease: h.Lease, Result: json.RawMessage(`{"restored":true}`)}, nil)
}
