package errors

// Backup codes: service backups, restores and restore drills (docs/backups.md
// section 7).
const (
	// BackupCorrupt: an archive whose bytes do not hash to its record's
	// digest or size, or that is truncated; nothing was restored (422).
	BackupCorrupt Code = "backup_corrupt"
	// BackupVersionMismatch: the archive tool's major version is not the
	// server's (pg_dump 14 against PostgreSQL 15), or an archive format
	// version this build does not read (422).
	BackupVersionMismatch Code = "backup_version_mismatch"
	// BackupNotFound: no backup with that id in the project (404).
	BackupNotFound Code = "backup_not_found"
	// BackupNotRestorable: a restore of a backup that is not succeeded (409).
	BackupNotRestorable Code = "backup_not_restorable"
	// RestoreTargetRunning: a restore into a service that is running,
	// without while_running (409).
	RestoreTargetRunning Code = "restore_target_running"
	// BackupNothingToBack: a backup of a service with no binding to back up,
	// or of a binding the service does not declare (422).
	BackupNothingToBack Code = "backup_nothing_to_back"
)
