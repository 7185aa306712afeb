package bench

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/berthhq/berth/core/backup"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/store"
)

// The size of the core BenchmarkControlPlaneBackup backs up and restores.
const (
	backupServices = 1000
	backupNodes    = 100
	backupBlobMiB  = 8 // one release bundle in the blob store
)

// backupCore creates a data directory as berthd leaves it (keys, TLS, cluster id,
// one blob) with backupServices services and backupNodes enrolled nodes in its
// embedded store, which stays open as in a running berthd.
func backupCore(b *testing.B) string {
	b.Helper()
	ctx := context.Background()
	dir := filepath.Join(b.TempDir(), "data")
	if _, _, err := identity.LoadOrCreateSigningKey(dir); err != nil {
		b.Fatal(err)
	}
	if _, _, err := identity.ClusterID(dir); err != nil {
		b.Fatal(err)
	}
	if _, err := identity.LoadOrCreateServerTLS(dir, "", "", []string{"127.0.0.1"}); err != nil {
		b.Fatal(err)
	}
	blob := make([]byte, backupBlobMiB<<20)
	_, _ = rand.Read(blob)
	if err := os.MkdirAll(filepath.Join(dir, "blobs", "sha256", "00"), 0o700); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "blobs", "sha256", "00", "bundle"), blob, 0o600); err != nil {
		b.Fatal(err)
	}
	unlock, err := store.LockDir(dir)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = unlock() })
	st, err := store.Open(ctx, store.Config{DataDir: dir})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = st.Close(context.Background()) })
	reg, cat := nodes.NewRegistry(st, nil), services.NewCatalog(st, nil)
	if err := reg.EnsureIndexes(ctx); err != nil {
		b.Fatal(err)
	}
	if err := cat.EnsureIndexes(ctx); err != nil {
		b.Fatal(err)
	}
	for i := range backupNodes {
		tok, _, err := reg.CreateJoinToken(ctx, 0)
		if err != nil {
			b.Fatal(err)
		}
		pub, _, _ := ed25519.GenerateKey(rand.Reader)
		if _, _, err := reg.Enroll(ctx, nodes.EnrollRequest{JoinToken: tok, PublicKey: base64.StdEncoding.EncodeToString(pub),
			Hostname: fmt.Sprintf("node-%03d", i), Address: "127.0.0.1"}); err != nil {
			b.Fatal(err)
		}
	}
	p, _, err := cat.EnsureProject(ctx, "default")
	if err != nil {
		b.Fatal(err)
	}
	for i := range backupServices {
		if _, _, err := cat.PutService(ctx, p, &services.Service{Name: fmt.Sprintf("svc-%04d", i), BundleDigest: "sha256:" + fmt.Sprintf("%064x", i),
			Command: []string{"./web"}, Port: 8080, Replicas: 2, Env: map[string]string{"MODE": "production", "INDEX": fmt.Sprint(i)}}, nil); err != nil {
			b.Fatal(err)
		}
	}
	return dir
}

// BenchmarkControlPlaneBackup measures `berthd backup` and `berthd restore` of a
// core with 1,000 services and 100 nodes on the embedded store, backed up while
// the store is open: seconds per backup and per restore, and the archive size.
func BenchmarkControlPlaneBackup(b *testing.B) {
	ctx := context.Background()
	dir := backupCore(b)
	archive := filepath.Join(b.TempDir(), "core.backup")
	write := func() *backup.Manifest {
		f, err := os.Create(archive)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		m, err := backup.Create(ctx, f, backup.Options{DataDir: dir})
		if err != nil {
			b.Fatal(err)
		}
		return m
	}
	b.Run("backup", func(b *testing.B) {
		for b.Loop() {
			write()
		}
		fi, err := os.Stat(archive)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "s/backup")
		b.ReportMetric(float64(fi.Size())/(1<<20), "archive-MiB")
	})
	m := write()
	b.Run("restore", func(b *testing.B) {
		root := b.TempDir()
		i := 0
		for b.Loop() {
			i++
			if _, err := backup.Restore(ctx, archive, backup.RestoreOptions{DataDir: filepath.Join(root, fmt.Sprint(i))}); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "s/restore")
		b.ReportMetric(float64(m.TotalBytes())/(1<<20), "data-MiB")
	})
}
