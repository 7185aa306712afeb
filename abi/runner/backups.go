package runner

import abibackups "github.com/berthhq/berth/abi/backups"

// Backup calls of the runner transport (docs/backups.md section 2): the Corestore provider's
// executor acts on a leased backup, restore or drill operation under its node credential and
// the operation's lease.
const (
	// PathBackupBegin: BackupBeginRequest in, BackupBeginResponse out.
	PathBackupBegin = "/backup/begin"
	// PathBackupArchive: the body is the archive itself (application/octet-stream, streamed);
	// the lease travels in the Header* headers; BackupArchiveResponse out.
	PathBackupArchive = "/backup/archive"
	// PathBackupCommit: BackupCommitRequest in, BackupBeginResponse out.
	PathBackupCommit = "/backup/commit"
	// PathBackupFail: BackupFailRequest in, SettleResponse out.
	PathBackupFail = "/backup/fail"
	// PathBackupRecord: Lease in, BackupRecordResponse out (the backup a restore or drill names).
	PathBackupRecord = "/backup/record"
	// PathBackupSource: Lease in, the archive of the backup a restore or drill names out
	// (application/octet-stream, exact Content-Length, X-Berth-Digest).
	PathBackupSource = "/backup/source"
	// PathBackupDrill: BackupDrillRequest in, SettleResponse out.
	PathBackupDrill = "/backup/drill"
)

// Headers carrying the lease of an archive upload, whose body is the archive.
const (
	HeaderNodeID      = "X-Berth-Node-Id"
	HeaderOperationID = "X-Berth-Operation-Id"
	HeaderLeaseToken  = "X-Berth-Lease-Token"
	HeaderFence       = "X-Berth-Fence"
)

// BackupBeginRequest begins (or, after a lost completion, finishes) a leased backup.
type BackupBeginRequest struct {
	Lease
}

// BackupBeginResponse says which backup the operation writes and whether an earlier attempt
// already committed it (the operation is then completed; the executor stops).
type BackupBeginResponse struct {
	BackupID  string `json:"backup_id"`
	State     string `json:"state"`
	Committed bool   `json:"committed"`
}

// BackupArchiveResponse is what the blob store computed for an uploaded archive.
type BackupArchiveResponse struct {
	Digest string `json:"digest"` // sha256:<hex>
	Size   int64  `json:"size"`
}

// BackupCommitRequest declares the uploaded archive: the digest and size the executor
// computed while streaming, and the engine's figures.
type BackupCommitRequest struct {
	Lease
	Digest  string             `json:"digest"`
	Size    int64              `json:"size"`
	Figures abibackups.Figures `json:"figures"`
}

// BackupFailRequest fails an attempt at Step ("dump" or "upload").
type BackupFailRequest struct {
	Lease
	Step      string `json:"step"`
	Error     string `json:"error"`
	Retryable bool   `json:"retryable"`
}

// BackupRecordResponse describes the backup a restore or drill operation reads.
type BackupRecordResponse struct {
	BackupID string             `json:"backup_id"`
	Kind     string             `json:"kind"`
	Digest   string             `json:"digest"`
	Size     int64              `json:"size"`
	Figures  abibackups.Figures `json:"figures"`
}

// BackupDrillRequest records a drill's result and settles the drill operation.
type BackupDrillRequest struct {
	Lease
	Result abibackups.DrillResult `json:"result"`
}
