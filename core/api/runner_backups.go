package api

import (
	"errors"
	"io"
	"mime"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	abierrors "github.com/berthhq/berth/abi/errors"
	abirunner "github.com/berthhq/berth/abi/runner"
	"github.com/berthhq/berth/core/backups"
	"github.com/berthhq/berth/core/blobs"
	"github.com/berthhq/berth/core/operations"
)

// registerBackupTransport serves the executor's backup calls on the runner transport
// (docs/backups.md section 2) when the transport and the backup manager are both on.
func (s *Server) registerBackupTransport(g *echo.Group) {
	if s.cfg.Backups == nil || s.cfg.Backups.Manager == nil {
		return
	}
	g.POST(abirunner.PathBackupBegin, s.runnerBackupBegin)
	g.POST(abirunner.PathBackupArchive, s.runnerBackupArchive)
	g.POST(abirunner.PathBackupCommit, s.runnerBackupCommit)
	g.POST(abirunner.PathBackupFail, s.runnerBackupFail)
	g.POST(abirunner.PathBackupRecord, s.runnerBackupRecord)
	g.POST(abirunner.PathBackupSource, s.runnerBackupSource)
	g.POST(abirunner.PathBackupDrill, s.runnerBackupDrill)
}

// backupRunnerError maps a manager error on the transport: a lost lease as the transport says
// it, a backup refusal by its code.
func backupRunnerError(err error) error {
	if errors.Is(err, operations.ErrLeaseLost) || errors.Is(err, operations.ErrNotFound) {
		return runnerError(leaseErr(err))
	}
	if errors.Is(err, blobs.ErrTooLarge) {
		return problem(abierrors.BodyTooLarge, "the archive is larger than this server's backup limit")
	}
	return backupProblem(err)
}

func (s *Server) runnerBackupBegin(c echo.Context) error {
	var req abirunner.BackupBeginRequest
	if err := runnerBind(c, &req); err != nil {
		return err
	}
	if _, err := s.runnerNode(c, req.NodeID); err != nil {
		return err
	}
	m, ctx, h := s.cfg.Backups.Manager, c.Request().Context(), holder(req.Lease)
	rec, err := m.Begin(ctx, req.OperationID, h)
	if errors.Is(err, backups.ErrCommitted) {
		if err := m.CompleteCommitted(ctx, req.OperationID, h, rec); err != nil {
			return backupRunnerError(err)
		}
		return c.JSON(http.StatusOK, abirunner.BackupBeginResponse{BackupID: rec.ID, State: string(rec.State), Committed: true})
	}
	if err != nil {
		return backupRunnerError(err)
	}
	return c.JSON(http.StatusOK, abirunner.BackupBeginResponse{BackupID: rec.ID, State: string(rec.State)})
}

// runnerBackupArchive streams the request body, the archive, into the blob store under the
// lease its headers carry; the store hashes and counts it as it arrives.
func (s *Server) runnerBackupArchive(c echo.Context) error {
	r := c.Request()
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/octet-stream" {
		return problem(abierrors.UnsupportedMedia, "the archive must be sent as application/octet-stream")
	}
	fence, err := strconv.ParseInt(r.Header.Get(abirunner.HeaderFence), 10, 64)
	if err != nil {
		return problem(abierrors.BadRequest, abirunner.HeaderFence+" must be the lease's fence")
	}
	l := abirunner.Lease{NodeID: r.Header.Get(abirunner.HeaderNodeID), OperationID: r.Header.Get(abirunner.HeaderOperationID),
		LeaseToken: r.Header.Get(abirunner.HeaderLeaseToken), Fence: fence}
	if _, err := s.runnerNode(c, l.NodeID); err != nil {
		return err
	}
	info, err := s.cfg.Backups.Manager.Upload(r.Context(), l.OperationID, holder(l), r.Body)
	if err != nil {
		return backupRunnerError(err)
	}
	return c.JSON(http.StatusOK, abirunner.BackupArchiveResponse{Digest: info.SHA256, Size: info.Size})
}

func (s *Server) runnerBackupCommit(c echo.Context) error {
	var req abirunner.BackupCommitRequest
	if err := runnerBind(c, &req); err != nil {
		return err
	}
	if _, err := s.runnerNode(c, req.NodeID); err != nil {
		return err
	}
	rec, err := s.cfg.Backups.Manager.Commit(c.Request().Context(), req.OperationID, holder(req.Lease),
		backups.Declared{Digest: req.Digest, Size: req.Size, Figures: req.Figures}, backups.DefaultKeep)
	if err != nil {
		return backupRunnerError(err)
	}
	s.log.Info("backup committed", "backup", rec.ID, "operation_id", req.OperationID, "size", rec.Size, "digest", rec.Digest)
	return c.JSON(http.StatusOK, abirunner.BackupBeginResponse{BackupID: rec.ID, State: string(rec.State), Committed: true})
}

func (s *Server) runnerBackupFail(c echo.Context) error {
	var req abirunner.BackupFailRequest
	if err := runnerBind(c, &req); err != nil {
		return err
	}
	if _, err := s.runnerNode(c, req.NodeID); err != nil {
		return err
	}
	if req.Step != backups.StepDump && req.Step != backups.StepUpload {
		return problem(abierrors.ValidationFailed, "step must be dump or upload")
	}
	if err := s.cfg.Backups.Manager.Fail(c.Request().Context(), req.OperationID, holder(req.Lease), req.Step, errors.New(req.Error), req.Retryable); err != nil {
		return backupRunnerError(err)
	}
	return c.JSON(http.StatusOK, abirunner.SettleResponse{State: "failed_attempt"})
}

func (s *Server) runnerBackupRecord(c echo.Context) error {
	var req abirunner.Lease
	if err := runnerBind(c, &req); err != nil {
		return err
	}
	if _, err := s.runnerNode(c, req.NodeID); err != nil {
		return err
	}
	rec, err := s.cfg.Backups.Manager.Source(c.Request().Context(), req.OperationID, holder(req))
	if err != nil {
		return backupRunnerError(err)
	}
	return c.JSON(http.StatusOK, abirunner.BackupRecordResponse{BackupID: rec.ID, Kind: string(rec.Kind), Digest: rec.Digest, Size: rec.Size, Figures: rec.Figures})
}

// runnerBackupSource answers the archive a restore or drill reads, streamed with its exact
// length and digest; bytes that do not hash to the record end the stream short.
func (s *Server) runnerBackupSource(c echo.Context) error {
	var req abirunner.Lease
	if err := runnerBind(c, &req); err != nil {
		return err
	}
	if _, err := s.runnerNode(c, req.NodeID); err != nil {
		return err
	}
	m, ctx, h := s.cfg.Backups.Manager, c.Request().Context(), holder(req)
	rec, err := m.Source(ctx, req.OperationID, h)
	if err != nil {
		return backupRunnerError(err)
	}
	rc, _, err := m.OpenArchive(ctx, req.OperationID, h, rec.ID)
	if err != nil {
		return backupRunnerError(err)
	}
	defer rc.Close()
	w := c.Response()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(rec.Size, 10))
	w.Header().Set(abirunner.HeaderDigest, rec.Digest)
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, rc); err != nil {
		s.log.Error("backup archive not served whole", "backup", rec.ID, "operation_id", req.OperationID, "err", err)
	}
	return nil
}

func (s *Server) runnerBackupDrill(c echo.Context) error {
	var req abirunner.BackupDrillRequest
	if err := runnerBind(c, &req); err != nil {
		return err
	}
	if _, err := s.runnerNode(c, req.NodeID); err != nil {
		return err
	}
	d, err := s.cfg.Backups.Manager.RecordDrill(c.Request().Context(), req.OperationID, holder(req.Lease), req.Result)
	if err != nil {
		return backupRunnerError(err)
	}
	return c.JSON(http.StatusOK, abirunner.SettleResponse{State: d.Result})
}
