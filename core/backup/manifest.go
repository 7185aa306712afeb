// Package backup writes and restores a consistent snapshot of everything berthd
// owns: its data directory (keys, TLS material, tokens, blobs) and its store.
package backup

import (
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strings"
	"time"

	abierrors "github.com/berthhq/berth/abi/errors"
)

// FormatVersion is the archive format this package writes and reads
// (docs/operating.md section 5.3). 1 (2026-12): a tar.gz of manifest.json
// followed by every copied file, in manifest order.
const FormatVersion = 1

// ManifestName is the archive's first entry.
const ManifestName = "berth-backup/manifest.json"

// dataPrefix starts the archive name of every copied file.
const dataPrefix = "berth-backup/data/"

// Store kinds: how a manifest's store was captured.
const (
	// StoreEmbedded is a point-in-time copy of each SQLite file of the embedded
	// store (store/*.sqlite), taken in one read transaction by VACUUM INTO.
	StoreEmbedded = "embedded-sqlite"
	// StoreMongo is a driver-level export of every collection of the MongoDB
	// database as canonical extended JSON, one document a line, under mongo/.
	StoreMongo = "mongodb-export"
)

// BlobMode says whether blobs (release bundles, registry layers) are copied into
// the archive or only listed with their sizes and hashes.
type BlobMode string

// The blob modes.
const (
	BlobsCopy      BlobMode = "copy"
	BlobsReference BlobMode = "reference"
)

// Manifest describes an archive: what was captured, and every file with its size
// and SHA-256. Files in reference mode are listed with Reference set and are not
// in the archive.
type Manifest struct {
	Format    int       `json:"format"`
	CreatedAt time.Time `json:"created_at"`
	ClusterID string    `json:"cluster_id"`
	Store     string    `json:"store"`
	Database  string    `json:"database,omitempty"` // MongoDB database of a StoreMongo export
	Blobs     BlobMode  `json:"blobs"`
	Files     []File    `json:"files"`
}

// File is one file of a backup. Path is relative to the data directory, in
// slash form; Mode is its permission bits (0600 or 0644 as berthd writes them).
type File struct {
	Path      string `json:"path"`
	Size      int64  `json:"size"`
	SHA256    string `json:"sha256"`
	Mode      uint32 `json:"mode"`
	Reference bool   `json:"reference,omitempty"`
}

// TotalBytes is the sum of the sizes of the files the archive holds (not references).
func (m *Manifest) TotalBytes() int64 {
	var n int64
	for _, f := range m.Files {
		if !f.Reference {
			n += f.Size
		}
	}
	return n
}

func invalid(format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	return abierrors.New(abierrors.BackupInvalid, "backup: "+msg)
}

// check refuses a manifest a restore could not apply safely: another format,
// unknown store or blob mode, and any path that is absolute, not clean,
// escapes the data directory, repeats, or names what berthd never restores.
func (m *Manifest) check() error {
	if m.Format != FormatVersion {
		return invalid("archive format %d, this berthd reads %d", m.Format, FormatVersion)
	}
	if m.Store != StoreEmbedded && m.Store != StoreMongo {
		return invalid("unknown store kind %q", m.Store)
	}
	if m.Blobs != BlobsCopy && m.Blobs != BlobsReference {
		return invalid("unknown blob mode %q", m.Blobs)
	}
	seen := map[string]bool{}
	for _, f := range m.Files {
		p := f.Path
		if p == "" || path.IsAbs(p) || path.Clean(p) != p || p == "." || p == ".." || strings.HasPrefix(p, "../") || strings.Contains(p, "\\") {
			return invalid("file path %q is not a clean relative path", p)
		}
		if skipped(p) {
			return invalid("file path %q is one berthd never restores", p)
		}
		if seen[p] {
			return invalid("file path %q is listed twice", p)
		}
		seen[p] = true
		if f.Size < 0 || len(f.SHA256) != 64 || strings.Trim(f.SHA256, "0123456789abcdef") != "" {
			return invalid("file %q has a bad size or hash", p)
		}
		if f.Mode&^0o777 != 0 || f.Mode&0o600 != 0o600 {
			return invalid("file %q has mode %o", p, f.Mode)
		}
		if f.Reference && !isBlob(p) {
			return invalid("file %q is a reference but not a blob", p)
		}
		top, _, _ := strings.Cut(p, "/")
		exportFile := strings.Count(p, "/") == 1 && strings.HasSuffix(p, ".jsonl")
		if (top == "mongo" && (m.Store != StoreMongo || !exportFile)) || (top == "store" && m.Store == StoreMongo) {
			return invalid("file %q does not belong to a %s archive", p, m.Store)
		}
	}
	return nil
}

func decodeManifest(b []byte) (*Manifest, error) {
	var m Manifest
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return nil, abierrors.Wrap(abierrors.BackupInvalid, "backup: manifest is not valid", err)
	}
	if dec.More() {
		return nil, invalid("manifest has trailing data")
	}
	if err := m.check(); err != nil {
		return nil, err
	}
	return &m, nil
}

// skipped reports whether a data-directory path is never backed up: the lock,
// the live store files (captured as a snapshot instead), caches, plugin pid
// files, temporary uploads and an interrupted restore's marker.
func skipped(p string) bool {
	top, _, _ := strings.Cut(p, "/")
	switch top {
	case ".lock", IncompleteMarker, "wasm-cache", "plugins":
		return true
	}
	if strings.HasPrefix(p, "blobs/tmp/") || p == "blobs/tmp" || strings.HasPrefix(p, "blobs/.incoming/") || p == "blobs/.incoming" {
		return true
	}
	if top == "store" {
		// Only snapshot files are restored into store/: no WAL or shared-memory files.
		return !strings.HasSuffix(p, ".sqlite") || strings.Count(p, "/") != 1
	}
	return false
}

// isBlob reports whether p is a content-addressed blob.
func isBlob(p string) bool { return strings.HasPrefix(p, "blobs/") }

// ErrNotEmpty is the cause of a restore refused because its target holds something.
var ErrNotEmpty = errors.New("backup: restore target is not empty")
