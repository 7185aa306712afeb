package backup

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	abierrors "github.com/berthhq/berth/abi/errors"
)

// IncompleteMarker is the file a restore writes into the data directory before
// anything else and removes after everything else; berthd refuses to start on
// a data directory that holds it (docs/operating.md section 5.2).
const IncompleteMarker = ".restore-incomplete"

// maxManifestBytes bounds the manifest entry (16 MiB: about 100,000 files).
const maxManifestBytes = 16 << 20

// walk reads an archive from r: the manifest, then every non-reference file in
// manifest order, handing each to fn with a reader of exactly its bytes, and
// checks each file's size and SHA-256 as it streams, then that nothing follows
// and that the gzip stream ends intact. fn may be nil (verify only). Any
// deviation is an error with code backup_invalid; fn may have been called for
// the files before it.
func walk(r io.Reader, fn func(File, io.Reader) error) (*Manifest, error) {
	gz, err := gzip.NewReader(bufio.NewReader(r))
	if err != nil {
		return nil, abierrors.Wrap(abierrors.BackupInvalid, "backup: not a gzip archive", err)
	}
	tr := tar.NewReader(gz)
	h, err := tr.Next()
	if err != nil {
		return nil, abierrors.Wrap(abierrors.BackupInvalid, "backup: archive ends before its manifest", err)
	}
	if h.Name != ManifestName || h.Typeflag != tar.TypeReg || h.Size > maxManifestBytes {
		return nil, invalid("first entry is %q, not a Berth backup manifest", h.Name)
	}
	mb, err := io.ReadAll(tr)
	if err != nil {
		return nil, abierrors.Wrap(abierrors.BackupInvalid, "backup: archive truncated in its manifest", err)
	}
	m, err := decodeManifest(mb)
	if err != nil {
		return nil, err
	}
	for _, f := range m.Files {
		if f.Reference {
			continue
		}
		h, err := tr.Next()
		if err != nil {
			return nil, abierrors.Wrap(abierrors.BackupInvalid, fmt.Sprintf("backup: archive truncated: %s is missing", f.Path), err)
		}
		if h.Name != dataPrefix+f.Path || h.Typeflag != tar.TypeReg || h.Size != f.Size {
			return nil, invalid("entry %q (%d bytes) where the manifest lists %s (%d bytes)", h.Name, h.Size, f.Path, f.Size)
		}
		sum := sha256.New()
		body := io.TeeReader(tr, sum)
		if fn != nil {
			if err := fn(f, &hashCheck{r: body, f: f, sum: sum}); err != nil {
				return nil, err
			}
		}
		if _, err := io.Copy(io.Discard, body); err != nil {
			return nil, abierrors.Wrap(abierrors.BackupInvalid, fmt.Sprintf("backup: archive truncated in %s", f.Path), err)
		}
		if got := hex.EncodeToString(sum.Sum(nil)); got != f.SHA256 {
			return nil, invalid("%s has SHA-256 %s, the manifest says %s", f.Path, got, f.SHA256)
		}
	}
	if h, err := tr.Next(); err != io.EOF {
		if err == nil {
			return nil, invalid("unexpected entry %q after the last file", h.Name)
		}
		return nil, abierrors.Wrap(abierrors.BackupInvalid, "backup: archive truncated after the last file", err)
	}
	// Read to the gzip trailer, whose CRC and length catch damage tar cannot see.
	if _, err := io.Copy(io.Discard, gz); err != nil {
		return nil, abierrors.Wrap(abierrors.BackupInvalid, "backup: archive truncated or damaged at its end", err)
	}
	return m, nil
}

// hashCheck hands fn a file's bytes and, at their end, refuses them (before
// the consumer sees io.EOF) unless they hash to the manifest's SHA-256, so a
// restore never installs a file whose bytes are wrong.
type hashCheck struct {
	r   io.Reader
	f   File
	sum interface{ Sum([]byte) []byte }
	n   int64
}

func (h *hashCheck) Read(p []byte) (int, error) {
	n, err := h.r.Read(p)
	h.n += int64(n)
	if errors.Is(err, io.EOF) {
		if h.n != h.f.Size || hex.EncodeToString(h.sum.Sum(nil)) != h.f.SHA256 {
			return n, invalid("%s does not match its manifest entry", h.f.Path)
		}
	}
	return n, err
}

// Verify reads a whole archive and returns its manifest if every file is present,
// in order, of its listed size and SHA-256, and the archive ends intact. Any
// other archive is refused with code backup_invalid.
func Verify(r io.Reader) (*Manifest, error) { return walk(r, nil) }

// RestoreOptions says where [Restore] writes.
type RestoreOptions struct {
	// DataDir is the data directory to create; it must not exist or be empty.
	DataDir string
	// MongoURI is the MongoDB server to import a StoreMongo archive into; its
	// database must hold no collection. Required for such archives, refused for others.
	MongoURI string
	// BlobsFrom is a directory laid out like the data directory's blobs/ holding
	// the blobs of a reference-mode archive; each is checked against the
	// manifest and copied. Required when the archive lists references.
	BlobsFrom string
	Logger    *slog.Logger
}

// Restore restores the archive at path into opt.DataDir (docs/operating.md
// section 5.2). Before writing anything it refuses a non-empty target (code
// restore_not_empty, wrapping [ErrNotEmpty]), reads the whole archive to check
// every hash (code backup_invalid), checks every referenced blob under
// BlobsFrom, and, for a MongoDB export, that the target database is empty.
// Then it writes IncompleteMarker, every file (0700 directories, each file by
// temp file, fsync and rename, hashes checked again as they stream), imports a
// MongoDB export, and removes the marker. A restore that dies part way leaves
// the marker, so berthd refuses the directory until it is removed and the
// restore run again. The restored berthd has the backed-up cluster id, signing
// key and TLS certificate, so its nodes reconnect without enrolling again.
func Restore(ctx context.Context, path string, opt RestoreOptions) (*Manifest, error) {
	log := opt.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if opt.DataDir == "" {
		return nil, errors.New("backup: restore needs a data directory")
	}
	if err := checkEmpty(opt.DataDir); err != nil {
		return nil, err
	}
	m, err := verifyFile(path)
	if err != nil {
		return nil, err
	}
	switch {
	case m.Store == StoreMongo && opt.MongoURI == "":
		return nil, fmt.Errorf("backup: the archive holds a MongoDB export: give the MongoDB URI to import it into")
	case m.Store == StoreEmbedded && opt.MongoURI != "":
		return nil, fmt.Errorf("backup: the archive holds an embedded store; restore it without a MongoDB URI")
	}
	var refs []File
	for _, f := range m.Files {
		if f.Reference {
			refs = append(refs, f)
		}
	}
	if len(refs) > 0 {
		if opt.BlobsFrom == "" {
			return nil, fmt.Errorf("backup: the archive lists %d blobs by reference: give the directory holding them", len(refs))
		}
		for _, f := range refs {
			got, err := hashFile(refPath(opt.BlobsFrom, f.Path), f.Path, f.Mode)
			if err != nil || got.SHA256 != f.SHA256 || got.Size != f.Size {
				return nil, abierrors.Wrap(abierrors.BackupInvalid, fmt.Sprintf("backup: referenced blob %s is missing or differs under %s", f.Path, opt.BlobsFrom), err)
			}
		}
	}
	var imp *importer
	if m.Store == StoreMongo {
		if imp, err = newImporter(ctx, opt.MongoURI, m.Database); err != nil {
			return nil, err
		}
		defer imp.close()
	}
	log.Info("backup: archive verified; restoring", "files", len(m.Files), "bytes", m.TotalBytes(), "cluster_id", m.ClusterID)

	// Nothing was written so far. From here on the marker says "incomplete".
	if err := os.MkdirAll(opt.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("backup: create %s: %w", opt.DataDir, err)
	}
	marker := filepath.Join(opt.DataDir, IncompleteMarker)
	if err := writeFileAtomic(marker, strings.NewReader("restore of "+filepath.Base(path)+" in progress\n"), 0o600); err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	defer f.Close()
	_, err = walk(f, func(file File, r io.Reader) error {
		if rest, ok := strings.CutPrefix(file.Path, "mongo/"); ok {
			return imp.load(ctx, strings.TrimSuffix(rest, ".jsonl"), r)
		}
		return writeFileAtomic(filepath.Join(opt.DataDir, filepath.FromSlash(file.Path)), r, os.FileMode(file.Mode))
	})
	if err != nil {
		return nil, fmt.Errorf("backup: restore stopped part way (the archive changed since it was verified?); %s marks the directory incomplete: %w", IncompleteMarker, err)
	}
	for _, file := range refs {
		src, err := os.Open(refPath(opt.BlobsFrom, file.Path))
		if err != nil {
			return nil, fmt.Errorf("backup: %w", err)
		}
		sum := sha256.New()
		err = writeFileAtomic(filepath.Join(opt.DataDir, filepath.FromSlash(file.Path)), &hashCheck{r: io.TeeReader(src, sum), f: file, sum: sum}, os.FileMode(file.Mode))
		src.Close()
		if err != nil {
			return nil, err
		}
	}
	if err := os.Remove(marker); err != nil {
		return nil, fmt.Errorf("backup: remove %s: %w", marker, err)
	}
	if err := syncDir(opt.DataDir); err != nil {
		return nil, err
	}
	return m, nil
}

func refPath(blobsFrom, p string) string {
	return filepath.Join(blobsFrom, filepath.FromSlash(strings.TrimPrefix(p, "blobs/")))
}

func verifyFile(path string) (*Manifest, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	defer f.Close()
	return Verify(f)
}

// checkEmpty refuses a target that exists and is not an empty directory.
func checkEmpty(dir string) error {
	fi, err := os.Lstat(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	if !fi.IsDir() {
		return abierrors.Wrap(abierrors.RestoreNotEmpty, fmt.Sprintf("backup: %s exists and is not a directory", dir), ErrNotEmpty)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	defer d.Close()
	names, err := d.Readdirnames(1)
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("backup: %w", err)
	}
	if len(names) > 0 {
		return abierrors.Wrap(abierrors.RestoreNotEmpty, fmt.Sprintf("backup: %s is not empty (holds %s); restore only into an empty or new directory", dir, names[0]), ErrNotEmpty)
	}
	return nil
}

// writeFileAtomic writes r to path (parents 0700) through a temp file, fsync and rename.
func writeFileAtomic(path string, r io.Reader, mode os.FileMode) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".restore-*")
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	_, err = io.Copy(tmp, r)
	if err == nil {
		err = tmp.Chmod(mode)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if errC := tmp.Close(); err == nil {
		err = errC
	}
	if err != nil {
		return fmt.Errorf("backup: write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("backup: sync %s: %w", dir, err)
	}
	return nil
}
