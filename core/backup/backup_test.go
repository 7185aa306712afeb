package backup

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/store"
)

// liveCore is a data directory as berthd leaves it, with its embedded store open
// (FerretDB running in this process, as in a running berthd).
type liveCore struct {
	dir string
	st  *store.Store
}

func newLiveCore(t *testing.T) *liveCore {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "data")
	if _, _, err := identity.LoadOrCreateSigningKey(dir); err != nil {
		t.Fatal(err)
	}
	if _, _, err := identity.ClusterID(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := identity.LoadOrCreateServerTLS(dir, "", "", []string{"127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	blob := filepath.Join(dir, "blobs", "sha256", "ab", "abcdef")
	if err := os.MkdirAll(filepath.Dir(blob), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(blob, bytes.Repeat([]byte("bundle"), 1000), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"wasm-cache/x/compiled", "plugins/gateway.pid", "blobs/tmp/upload-1"} {
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), []byte("skip me"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	unlock, err := store.LockDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unlock() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := store.Open(ctx, store.Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close(context.Background()) })
	return &liveCore{dir: dir, st: st}
}

func (c *liveCore) insert(t *testing.T, coll string, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if _, err := c.st.Collection(coll).InsertOne(context.Background(), bson.M{"_id": id, "n": int64(len(id))}); err != nil {
			t.Fatal(err)
		}
	}
}

func ids(t *testing.T, st *store.Store, coll string) []string {
	t.Helper()
	cur, err := st.Collection(coll).Find(context.Background(), bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	var docs []struct {
		ID string `bson:"_id"`
	}
	if err := cur.All(context.Background(), &docs); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, d := range docs {
		out = append(out, d.ID)
	}
	return out
}

func backupTo(t *testing.T, c *liveCore, opt Options) (string, *Manifest) {
	t.Helper()
	opt.DataDir = c.dir
	path := filepath.Join(t.TempDir(), "berthd.backup")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := Create(context.Background(), f, opt)
	if err != nil {
		t.Fatal(err)
	}
	return path, m
}

func TestBackupOfRunningStoreRestoresThatPointInTime(t *testing.T) {
	c := newLiveCore(t)
	c.insert(t, "services", "svc_a", "svc_b")
	c.insert(t, "nodes", "nod_1")
	path, m := backupTo(t, c, Options{})
	c.insert(t, "services", "svc_after") // after the snapshot: not in it

	if m.Store != StoreEmbedded || m.Blobs != BlobsCopy || m.ClusterID == "" {
		t.Fatalf("manifest %+v", m)
	}
	listed := map[string]File{}
	for _, f := range m.Files {
		listed[f.Path] = f
	}
	for _, p := range []string{"store/berth.sqlite", identity.SigningKeyFile, identity.ClusterIDFile, identity.TLSCertFile, identity.TLSKeyFile, identity.FingerprintFile, "blobs/sha256/ab/abcdef"} {
		if _, ok := listed[p]; !ok {
			t.Errorf("manifest lacks %s", p)
		}
	}
	for p := range listed {
		if strings.HasPrefix(p, "wasm-cache") || strings.HasPrefix(p, "plugins") || strings.HasPrefix(p, "blobs/tmp") || p == ".lock" || strings.HasSuffix(p, "-wal") || strings.HasSuffix(p, "-shm") {
			t.Errorf("manifest lists %s, which is never backed up", p)
		}
	}

	target := filepath.Join(t.TempDir(), "restored")
	if _, err := Restore(context.Background(), path, RestoreOptions{DataDir: target}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(target, IncompleteMarker)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the incomplete marker is still there: %v", err)
	}
	for _, p := range []string{identity.SigningKeyFile, identity.ClusterIDFile, identity.TLSCertFile, identity.TLSKeyFile, identity.FingerprintFile, "blobs/sha256/ab/abcdef"} {
		a, _ := os.ReadFile(filepath.Join(c.dir, p))
		b, err := os.ReadFile(filepath.Join(target, p))
		if err != nil || !bytes.Equal(a, b) {
			t.Errorf("%s differs after restore (%v)", p, err)
		}
		if fi, err := os.Stat(filepath.Join(target, p)); err == nil && fi.Mode().Perm()&0o077 != 0 && p != identity.TLSCertFile {
			t.Errorf("%s restored with mode %o", p, fi.Mode().Perm())
		}
	}
	if fi, err := os.Stat(target); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("restored data directory mode: %v %v", fi.Mode(), err)
	}
	// The restored store opens and holds exactly the snapshot.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := store.Open(ctx, store.Config{DataDir: target})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close(context.Background())
	if got := fmt.Sprint(ids(t, st, "services")); got != "[svc_a svc_b]" {
		t.Errorf("restored services %s, want [svc_a svc_b]", got)
	}
	if got := fmt.Sprint(ids(t, st, "nodes")); got != "[nod_1]" {
		t.Errorf("restored nodes %s", got)
	}
}

func TestRestoreRefusesNonEmptyTarget(t *testing.T) {
	c := newLiveCore(t)
	path, _ := backupTo(t, c, Options{})
	target := t.TempDir()
	if err := os.WriteFile(filepath.Join(target, "keep-me"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Restore(context.Background(), path, RestoreOptions{DataDir: target})
	if !errors.Is(err, ErrNotEmpty) || abierrors.CodeOf(err) != abierrors.RestoreNotEmpty {
		t.Fatalf("err = %v, want restore_not_empty", err)
	}
	entries, _ := os.ReadDir(target)
	if len(entries) != 1 {
		t.Fatalf("target holds %d entries after a refused restore", len(entries))
	}
	// An empty existing directory is fine.
	if _, err := Restore(context.Background(), path, RestoreOptions{DataDir: t.TempDir()}); err != nil {
		t.Fatal(err)
	}
}

// rewrite decompresses an archive, lets edit change its entries, and
// compresses it again, so the damage is inside a well-formed tar.gz.
func rewrite(t *testing.T, path string, edit func(name string, body []byte) (string, []byte, bool)) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	var out bytes.Buffer
	gw := gzip.NewWriter(&out)
	tw := tar.NewWriter(gw)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(tr)
		name, body, keep := edit(h.Name, body)
		if !keep {
			continue
		}
		h.Name, h.Size = name, int64(len(body))
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		_, _ = tw.Write(body)
	}
	_ = tw.Close()
	_ = gw.Close()
	p := filepath.Join(t.TempDir(), "edited.backup")
	if err := os.WriteFile(p, out.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestTruncatedOrTamperedBackupIsRefusedBeforeWritingAnything(t *testing.T) {
	c := newLiveCore(t)
	path, _ := backupTo(t, c, Options{})
	whole, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]string{}
	dir := t.TempDir()
	for _, cut := range []int{0, 10, len(whole) / 3, len(whole) / 2, len(whole) - 9, len(whole) - 1} {
		p := filepath.Join(dir, fmt.Sprintf("cut-%d", cut))
		if err := os.WriteFile(p, whole[:cut], 0o600); err != nil {
			t.Fatal(err)
		}
		cases[fmt.Sprintf("truncated at %d of %d bytes", cut, len(whole))] = p
	}
	flipped := bytes.Clone(whole)
	flipped[len(flipped)/2] ^= 0x40
	p := filepath.Join(dir, "flipped")
	_ = os.WriteFile(p, flipped, 0o600)
	cases["one compressed bit flipped"] = p
	cases["a key file altered"] = rewrite(t, path, func(n string, b []byte) (string, []byte, bool) {
		if n == dataPrefix+identity.SigningKeyFile {
			b = bytes.Clone(b)
			b[len(b)/2] ^= 1
		}
		return n, b, true
	})
	cases["a file dropped"] = rewrite(t, path, func(n string, b []byte) (string, []byte, bool) {
		return n, b, n != dataPrefix+identity.ClusterIDFile
	})
	cases["an extra entry"] = rewrite(t, path, func(n string, b []byte) (string, []byte, bool) {
		if n == dataPrefix+identity.ClusterIDFile {
			return dataPrefix + "evil", b, true
		}
		return n, b, true
	})
	cases["a path escaping the directory"] = rewrite(t, path, func(n string, b []byte) (string, []byte, bool) {
		if n == ManifestName {
			b = bytes.Replace(b, []byte(`"path": "cluster-id"`), []byte(`"path": "../cluster-id"`), 1)
		}
		return n, b, true
	})
	cases["an unknown manifest field"] = rewrite(t, path, func(n string, b []byte) (string, []byte, bool) {
		if n == ManifestName {
			b = bytes.Replace(b, []byte(`"format": 1,`), []byte(`"format": 1, "extra": true,`), 1)
		}
		return n, b, true
	})
	cases["another format"] = rewrite(t, path, func(n string, b []byte) (string, []byte, bool) {
		if n == ManifestName {
			b = bytes.Replace(b, []byte(`"format": 1,`), []byte(`"format": 2,`), 1)
		}
		return n, b, true
	})
	cases["not a backup"] = rewrite(t, path, func(n string, b []byte) (string, []byte, bool) {
		return n, b, n != ManifestName
	})
	for name, p := range cases {
		t.Run(name, func(t *testing.T) {
			target := filepath.Join(t.TempDir(), "restored")
			_, err := Restore(context.Background(), p, RestoreOptions{DataDir: target})
			if abierrors.CodeOf(err) != abierrors.BackupInvalid {
				t.Fatalf("err = %v, want code backup_invalid", err)
			}
			if _, err := os.Lstat(target); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the refused restore created %s", target)
			}
		})
	}
}

func TestReferenceModeListsBlobsAndRestoreNeedsThem(t *testing.T) {
	c := newLiveCore(t)
	path, m := backupTo(t, c, Options{Blobs: BlobsReference})
	var refs int
	for _, f := range m.Files {
		if f.Reference {
			refs++
		}
	}
	if refs != 1 {
		t.Fatalf("%d references, want the one blob", refs)
	}
	target := filepath.Join(t.TempDir(), "restored")
	if _, err := Restore(context.Background(), path, RestoreOptions{DataDir: target}); err == nil {
		t.Fatal("a reference-mode restore without the blobs succeeded")
	}
	if _, err := os.Lstat(target); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("the refused restore wrote something")
	}
	// A changed blob in the blob directory is refused too.
	bad := t.TempDir()
	_ = os.MkdirAll(filepath.Join(bad, "sha256", "ab"), 0o700)
	_ = os.WriteFile(filepath.Join(bad, "sha256", "ab", "abcdef"), []byte("other"), 0o600)
	if _, err := Restore(context.Background(), path, RestoreOptions{DataDir: target, BlobsFrom: bad}); abierrors.CodeOf(err) != abierrors.BackupInvalid {
		t.Fatalf("err = %v, want backup_invalid for a changed blob", err)
	}
	if _, err := Restore(context.Background(), path, RestoreOptions{DataDir: target, BlobsFrom: filepath.Join(c.dir, "blobs")}); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(filepath.Join(c.dir, "blobs/sha256/ab/abcdef"))
	b, _ := os.ReadFile(filepath.Join(target, "blobs/sha256/ab/abcdef"))
	if !bytes.Equal(a, b) {
		t.Fatal("blob differs after a reference restore")
	}
}

func TestBackupRefusesSymlinkInDataDir(t *testing.T) {
	c := newLiveCore(t)
	if err := os.Symlink("/etc/passwd", filepath.Join(c.dir, "keys", "sneaky")); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := Create(context.Background(), &buf, Options{DataDir: c.dir}); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("err = %v", err)
	}
}

func TestMongoExportRoundTrip(t *testing.T) {
	// The embedded store's FerretDB speaks the MongoDB wire protocol: the
	// driver-level export and import run against it as against MongoDB.
	c := newLiveCore(t)
	c.insert(t, "services", "svc_a", "svc_b")
	c.insert(t, "nodes", "nod_1")
	path, m := backupTo(t, c, Options{MongoURI: c.st.EmbeddedURI()})
	if m.Store != StoreMongo {
		t.Fatalf("store kind %s", m.Store)
	}
	for _, f := range m.Files {
		if strings.HasPrefix(f.Path, "store/") {
			t.Errorf("a MongoDB backup lists %s", f.Path)
		}
	}
	dst := newLiveCore(t)
	_, err := Restore(context.Background(), path, RestoreOptions{DataDir: filepath.Join(t.TempDir(), "d"), MongoURI: dst.st.EmbeddedURI()})
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(ids(t, dst.st, "services")); got != "[svc_a svc_b]" {
		t.Errorf("imported services %s", got)
	}
	// A second import into the now non-empty database is refused.
	_, err = Restore(context.Background(), path, RestoreOptions{DataDir: filepath.Join(t.TempDir(), "e"), MongoURI: dst.st.EmbeddedURI()})
	if !errors.Is(err, ErrNotEmpty) {
		t.Fatalf("err = %v, want ErrNotEmpty", err)
	}
	// An embedded archive is not imported into MongoDB, nor a MongoDB export restored without one.
	emb, _ := backupTo(t, c, Options{})
	if _, err := Restore(context.Background(), emb, RestoreOptions{DataDir: filepath.Join(t.TempDir(), "f"), MongoURI: dst.st.EmbeddedURI()}); err == nil {
		t.Error("an embedded archive was imported into MongoDB")
	}
	if _, err := Restore(context.Background(), path, RestoreOptions{DataDir: filepath.Join(t.TempDir(), "g")}); err == nil {
		t.Error("a MongoDB export was restored without a MongoDB URI")
	}
}
