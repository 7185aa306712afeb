package backup

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	_ "modernc.org/sqlite" // the embedded store's SQLite files, opened beside the running berthd

	"github.com/berthhq/berth/core/identity"
)

// Options says what [Create] captures.
type Options struct {
	// DataDir is berthd's data directory. Required.
	DataDir string
	// MongoURI, when set, is the MongoDB server berthd uses: its database is
	// exported through the driver instead of copying the embedded store.
	MongoURI string
	// Database is the MongoDB database; empty means "berth".
	Database string
	// Blobs copies blobs into the archive (BlobsCopy, the default) or only lists them.
	Blobs BlobMode
	// TempDir holds the store snapshot while the archive is written; empty means os.TempDir().
	TempDir string
	Logger  *slog.Logger
	// Now stamps the manifest; nil means time.Now.
	Now func() time.Time
}

// source is one file to copy: its manifest entry and where its bytes are.
type source struct {
	File
	from string
}

// Create writes a backup archive of opt.DataDir to w and returns its manifest
// (docs/operating.md section 5). It runs beside a running berthd or with none:
//
//   - the embedded store's SQLite files are copied with VACUUM INTO, which reads
//     inside one SQLite read transaction, so each copy is one point in time even
//     while berthd writes (WAL mode lets it go on writing meanwhile); with
//     MongoURI set, every collection is exported through the driver instead;
//   - every other file berthd owns (keys, retired keys, TLS material, admin
//     token, cluster id, fingerprint, blobs) is hashed and copied after the
//     store snapshot. berthd writes those atomically by rename, and a blob is on
//     disk before the record naming it, so every blob the snapshot refers to is
//     in the archive.
//
// Skipped: the lock file, wasm-cache, plugin pid files and blobs/tmp. A symlink or
// other non-regular file in the data directory is an error (berthd writes none).
// The archive is a tar.gz whose first entry is the manifest: every file's path,
// size, mode and SHA-256. Nothing in the data directory is changed.
func Create(ctx context.Context, w io.Writer, opt Options) (*Manifest, error) {
	if opt.DataDir == "" {
		return nil, errors.New("backup: a data directory is required")
	}
	if opt.Blobs == "" {
		opt.Blobs = BlobsCopy
	}
	if opt.Blobs != BlobsCopy && opt.Blobs != BlobsReference {
		return nil, fmt.Errorf("backup: blob mode %q: want copy or reference", opt.Blobs)
	}
	if opt.Database == "" {
		opt.Database = "berth"
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	log := opt.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	clusterID, err := os.ReadFile(filepath.Join(opt.DataDir, identity.ClusterIDFile))
	if err != nil {
		return nil, fmt.Errorf("backup: %s is not a berthd data directory: %w", opt.DataDir, err)
	}
	tmp, err := os.MkdirTemp(opt.TempDir, "berth-backup-")
	if err != nil {
		return nil, fmt.Errorf("backup: staging directory: %w", err)
	}
	defer os.RemoveAll(tmp)

	m := &Manifest{Format: FormatVersion, CreatedAt: opt.Now().UTC().Truncate(time.Second), ClusterID: strings.TrimSpace(string(clusterID)), Blobs: opt.Blobs}
	var srcs []source
	// 1. The store, first: every file copied after it is at least as new.
	if opt.MongoURI != "" {
		m.Store, m.Database = StoreMongo, opt.Database
		if srcs, err = exportMongo(ctx, opt.MongoURI, opt.Database, tmp, log); err != nil {
			return nil, err
		}
	} else {
		m.Store = StoreEmbedded
		if srcs, err = snapshotEmbedded(ctx, filepath.Join(opt.DataDir, "store"), tmp); err != nil {
			return nil, err
		}
	}
	log.Info("backup: store captured", "kind", m.Store, "files", len(srcs))
	// 2. Everything else berthd owns.
	files, err := walkDataDir(opt.DataDir, opt.Blobs)
	if err != nil {
		return nil, err
	}
	srcs = append(srcs, files...)
	for i := range srcs {
		m.Files = append(m.Files, srcs[i].File)
	}
	if err := m.check(); err != nil {
		return nil, fmt.Errorf("backup: refusing to write an archive restore would refuse: %w", err)
	}
	if err := writeArchive(ctx, w, m, srcs); err != nil {
		return nil, err
	}
	return m, nil
}

// snapshotEmbedded copies every *.sqlite file of storeDir into tmp with VACUUM INTO.
func snapshotEmbedded(ctx context.Context, storeDir, tmp string) ([]source, error) {
	names, err := filepath.Glob(filepath.Join(storeDir, "*.sqlite"))
	if err != nil {
		return nil, fmt.Errorf("backup: list store files: %w", err)
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("backup: no embedded store under %s (with MongoDB, pass its URI)", storeDir)
	}
	sort.Strings(names)
	var out []source
	for _, name := range names {
		dst := filepath.Join(tmp, filepath.Base(name))
		if err := vacuumInto(ctx, name, dst); err != nil {
			return nil, err
		}
		f, err := hashFile(dst, "store/"+filepath.Base(name), 0o600)
		if err != nil {
			return nil, err
		}
		out = append(out, source{File: f, from: dst})
	}
	return out, nil
}

// vacuumInto writes a transactionally consistent copy of the SQLite database src
// to dst. It opens src read-write (a WAL reader needs the shared-memory file) but
// only reads; busy_timeout waits out a checkpoint of the running berthd.
func vacuumInto(ctx context.Context, src, dst string) error {
	dsn := "file:" + src + "?_pragma=busy_timeout(10000)"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return fmt.Errorf("backup: open %s: %w", src, err)
	}
	db.SetMaxOpenConns(1)
	_, err = db.ExecContext(ctx, "VACUUM INTO ?", dst)
	errC := db.Close()
	keepOwner(src)
	if err != nil {
		return fmt.Errorf("backup: snapshot %s: %w", src, err)
	}
	if errC != nil {
		return fmt.Errorf("backup: close %s: %w", src, errC)
	}
	var ok string
	check, err := sql.Open("sqlite", "file:"+dst+"?mode=ro")
	if err != nil {
		return fmt.Errorf("backup: open snapshot: %w", err)
	}
	defer check.Close()
	if err := check.QueryRowContext(ctx, "PRAGMA quick_check").Scan(&ok); err != nil || ok != "ok" {
		return fmt.Errorf("backup: snapshot of %s fails its integrity check (%q): %w", src, ok, err)
	}
	return nil
}

// keepOwner gives src's -wal and -shm files, if this process created them (a
// backup run as root while berthd is stopped), back to the owner of src, so
// berthd running as its own user can still open its store.
func keepOwner(src string) {
	fi, err := os.Stat(src)
	if err != nil {
		return
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return
	}
	for _, suffix := range []string{"-wal", "-shm"} {
		p := src + suffix
		if f, err := os.Lstat(p); err == nil {
			if ws, ok := f.Sys().(*syscall.Stat_t); ok && (ws.Uid != st.Uid || ws.Gid != st.Gid) {
				_ = os.Lchown(p, int(st.Uid), int(st.Gid))
			}
		}
	}
}

// walkDataDir lists every file of dir to back up, hashed.
func walkDataDir(dir string, blobs BlobMode) ([]source, error) {
	var out []source
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if rel == "." {
			return nil
		}
		top, _, _ := strings.Cut(rel, "/")
		if d.IsDir() {
			if top == "store" || skipped(rel) {
				return filepath.SkipDir
			}
			return nil
		}
		if top == "store" || skipped(rel) {
			return nil
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("backup: %s is not a regular file (berthd writes no links or devices)", p)
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		f, err := hashFile(p, rel, uint32(info.Mode().Perm())|0o600)
		if err != nil {
			return err
		}
		f.Reference = blobs == BlobsReference && isBlob(rel)
		out = append(out, source{File: f, from: p})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("backup: walk %s: %w", dir, err)
	}
	return out, nil
}

func hashFile(p, rel string, mode uint32) (File, error) {
	f, err := os.Open(p)
	if err != nil {
		return File{}, fmt.Errorf("backup: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return File{}, fmt.Errorf("backup: read %s: %w", p, err)
	}
	return File{Path: rel, Size: n, SHA256: hex.EncodeToString(h.Sum(nil)), Mode: mode}, nil
}

func writeArchive(ctx context.Context, w io.Writer, m *Manifest, srcs []source) error {
	mb, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("backup: manifest: %w", err)
	}
	gz := gzip.NewWriter(w)
	tw := tar.NewWriter(gz)
	hdr := func(name string, size int64) *tar.Header {
		return &tar.Header{Name: name, Size: size, Mode: 0o600, Typeflag: tar.TypeReg, ModTime: m.CreatedAt, Format: tar.FormatPAX}
	}
	if err := tw.WriteHeader(hdr(ManifestName, int64(len(mb)))); err != nil {
		return fmt.Errorf("backup: write archive: %w", err)
	}
	if _, err := tw.Write(mb); err != nil {
		return fmt.Errorf("backup: write archive: %w", err)
	}
	for _, s := range srcs {
		if s.Reference {
			continue
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("backup: %w", err)
		}
		if err := copyEntry(tw, hdr(dataPrefix+s.Path, s.Size), s); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("backup: write archive: %w", err)
	}
	if err := gz.Close(); err != nil {
		return fmt.Errorf("backup: write archive: %w", err)
	}
	return nil
}

// copyEntry copies one file into the archive and fails if it changed since it
// was hashed: its bytes must match the manifest.
func copyEntry(tw *tar.Writer, h *tar.Header, s source) error {
	f, err := os.Open(s.from)
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	defer f.Close()
	if err := tw.WriteHeader(h); err != nil {
		return fmt.Errorf("backup: write archive: %w", err)
	}
	sum := sha256.New()
	n, err := io.Copy(io.MultiWriter(tw, sum), io.LimitReader(f, s.Size))
	if err != nil {
		return fmt.Errorf("backup: copy %s: %w", s.Path, err)
	}
	if n != s.Size || hex.EncodeToString(sum.Sum(nil)) != s.SHA256 {
		return fmt.Errorf("backup: %s changed while it was copied; run the backup again", s.Path)
	}
	return nil
}
