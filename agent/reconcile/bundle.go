package reconcile

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/sdk/bundle"
)

// BundleSource downloads a release bundle by digest ("sha256:<hex>") and
// writes its bytes to w. *client.Client of sdk/client satisfies it.
type BundleSource interface {
	DownloadBundle(ctx context.Context, digest string, w io.Writer) error
}

// ErrDigestMismatch is returned when a downloaded or cached bundle does not hash to its digest.
var ErrDigestMismatch = errors.New("berth: bundle content does not match its digest")

// prepareWorkDir makes appDir a fresh copy of the workload's bundle: each start
// extracts the digest-verified cached archive into a new directory, so a
// restart never sees files a previous run wrote into its tree. A workload
// without a bundle gets an empty directory. dir is the workload's own
// directory (0700), holding appDir and the log.
func (l *Loop) prepareWorkDir(ctx context.Context, spec *node.WorkloadSpec, dir, appDir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create workload directory: %w", err)
	}
	tmp, err := os.MkdirTemp(dir, ".app-")
	if err != nil {
		return fmt.Errorf("create workload directory: %w", err)
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	if spec.BundleDigest != "" {
		archive, err := l.ensureBundle(ctx, spec.BundleDigest)
		if err != nil {
			return err
		}
		f, err := os.Open(archive)
		if err != nil {
			return fmt.Errorf("open bundle %s: %w", spec.BundleDigest, err)
		}
		err = bundle.Extract(ctx, f, tmp, l.cfg.MaxExpandedBytes)
		_ = f.Close()
		if err != nil {
			return fmt.Errorf("extract bundle %s: %w", spec.BundleDigest, err)
		}
	}
	if err := os.RemoveAll(appDir); err != nil {
		return fmt.Errorf("clear workload directory: %w", err)
	}
	if err := os.Rename(tmp, appDir); err != nil {
		return fmt.Errorf("install workload directory: %w", err)
	}
	return nil
}

// ensureBundle returns the path of the cached archive of digest, downloading
// it when absent. Both a fresh download and a cached file are hashed before
// use; a mismatch is [ErrDigestMismatch] and the bad file is removed.
func (l *Loop) ensureBundle(ctx context.Context, digest string) (string, error) {
	hexd, ok := strings.CutPrefix(digest, "sha256:")
	if !ok || len(hexd) != 64 {
		return "", fmt.Errorf("bundle digest %q is not sha256:<64 hex>", digest)
	}
	if _, err := hex.DecodeString(hexd); err != nil {
		return "", fmt.Errorf("bundle digest %q is not sha256:<64 hex>", digest)
	}
	dir := filepath.Join(l.cfg.DataDir, "bundles")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("create bundle cache: %w", err)
	}
	path := filepath.Join(dir, hexd+".tar.gz")
	if _, err := os.Stat(path); err == nil {
		if err := verifyFile(path, hexd); err == nil {
			return path, nil
		}
		l.log.Warn("cached bundle does not match its digest; downloading again", "digest", digest)
		_ = os.Remove(path)
	}
	if l.cfg.Bundles == nil {
		return "", fmt.Errorf("download bundle %s: no bundle source configured", digest)
	}
	tmp, err := os.CreateTemp(dir, ".download-")
	if err != nil {
		return "", fmt.Errorf("download bundle %s: %w", digest, err)
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	h := sha256.New()
	w := &capWriter{w: io.MultiWriter(tmp, h), left: l.cfg.MaxBundleBytes}
	if err := l.cfg.Bundles.DownloadBundle(ctx, digest, w); err != nil {
		_ = tmp.Close()
		return "", fmt.Errorf("download bundle %s: %w", digest, err)
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return "", fmt.Errorf("download bundle %s: %w", digest, err)
	}
	if err := tmp.Close(); err != nil {
		return "", fmt.Errorf("download bundle %s: %w", digest, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != hexd {
		return "", fmt.Errorf("download bundle %s: got sha256:%s: %w", digest, got, ErrDigestMismatch)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return "", fmt.Errorf("download bundle %s: %w", digest, err)
	}
	return path, nil
}

func verifyFile(path, hexd string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer func() { _ = f.Close() }()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return fmt.Errorf("hash %s: %w", path, err)
	}
	if hex.EncodeToString(h.Sum(nil)) != hexd {
		return ErrDigestMismatch
	}
	return nil
}

// errBundleTooLarge is returned by capWriter past its limit.
var errBundleTooLarge = errors.New("berth: bundle download exceeds the size limit")

type capWriter struct {
	w    io.Writer
	left int64
}

func (c *capWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > c.left {
		return 0, errBundleTooLarge
	}
	c.left -= int64(len(p))
	return c.w.Write(p)
}
