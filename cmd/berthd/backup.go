package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/berthhq/berth/core/backup"
	"github.com/berthhq/berth/core/server"
	"github.com/berthhq/berth/internal/config"
)

func runBackup(args []string, stdout, stderr io.Writer) int {
	var cfg server.Config
	var level slog.Level
	var file, to, blobs string
	fs := serveFlags(&cfg, &level, &file)
	fs.SetOutput(stderr)
	fs.StringVar(&to, "to", "", "archive to write (0600, replaced atomically); - writes to stdout")
	fs.StringVar(&blobs, "blobs", string(backup.BlobsCopy), "copy blobs into the archive, or reference them (list sizes and hashes only)")
	// --s3-endpoint, --s3-region and --s3-insecure come from serveFlags: an
	// s3://BUCKET/KEY destination is reached like the blob store.
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `berthd backup writes a consistent snapshot of the data directory and the store
to one archive (docs/operating.md section 5). It runs beside a running berthd
or with none, reads --data-dir and --mongo-uri like berthd does (flags,
BERTH_* variables, --config), and changes nothing.

Usage:
  berthd backup --to FILE|s3://BUCKET/KEY [--config FILE] [--data-dir DIR] [--mongo-uri URI] [--blobs copy|reference]
                [--s3-endpoint HOST:PORT]

Flags (the server flags are read only for --data-dir and --mongo-uri):
`)
		fmt.Fprint(fs.Output(), fs.FlagUsages())
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		return server.ExitConfig
	}
	if file == "" {
		file = os.Getenv(config.EnvName("config"))
	}
	if _, err := config.Apply(fs, config.Options{File: file, Getenv: os.Getenv, Skip: []string{"config", "version", "to", "blobs", "s3-endpoint", "s3-region", "s3-insecure", "s3-bucket", "s3-prefix", "s3-credentials-file"}}); err != nil {
		fmt.Fprintf(stderr, "berthd backup: %v\n", err)
		return server.ExitConfig
	}
	s3 := backup.S3Config{Endpoint: cfg.S3.Endpoint, Region: cfg.S3.Region, Insecure: cfg.S3.Insecure}
	switch {
	case cfg.DataDir == "":
		fmt.Fprintln(stderr, "berthd backup: --data-dir is required")
		return server.ExitConfig
	case to == "":
		fmt.Fprintln(stderr, "berthd backup: --to FILE is required")
		return server.ExitConfig
	}
	var bucket, key string
	if strings.Contains(to, "://") {
		var err error
		if bucket, key, err = backup.ParseS3URL(to); err != nil {
			fmt.Fprintf(stderr, "berthd backup: --to: %v\n", err)
			return server.ExitConfig
		}
		if s3.Endpoint == "" {
			fmt.Fprintln(stderr, "berthd backup: an s3:// destination needs --s3-endpoint")
			return server.ExitConfig
		}
	}
	if to != "-" && bucket == "" {
		absTo, err1 := filepath.Abs(to)
		absData, err2 := filepath.Abs(cfg.DataDir)
		if err1 != nil || err2 != nil || strings.HasPrefix(absTo, absData+string(filepath.Separator)) {
			fmt.Fprintf(stderr, "berthd backup: --to %s: write the archive outside the data directory\n", to)
			return server.ExitConfig
		}
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	opt := backup.Options{DataDir: cfg.DataDir, MongoURI: cfg.MongoURI, Blobs: backup.BlobMode(blobs), Logger: log}
	start := time.Now()
	var m *backup.Manifest
	var sum string
	var err error
	if to == "-" {
		h := sha256.New()
		m, err = backup.Create(ctx, io.MultiWriter(stdout, h), opt)
		sum = hex.EncodeToString(h.Sum(nil))
		stdout = stderr
	} else if bucket != "" {
		m, sum, err = backupToS3(ctx, s3, bucket, key, opt)
	} else {
		m, sum, err = backupToFile(ctx, to, opt)
	}
	if err != nil {
		fmt.Fprintf(stderr, "berthd backup: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "backup of cluster %s: %d files, %d bytes, store %s, blobs %s, in %s\narchive SHA-256 %s  %s\n",
		m.ClusterID, len(m.Files), m.TotalBytes(), m.Store, m.Blobs, time.Since(start).Round(time.Millisecond), sum, to)
	return 0
}

// backupToFile writes the archive beside path and renames it into place, so a
// failed or interrupted backup never leaves a partial file under path.
func backupToFile(ctx context.Context, path string, opt backup.Options) (*backup.Manifest, string, error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return nil, "", err
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	h := sha256.New()
	m, err := backup.Create(ctx, io.MultiWriter(tmp, h), opt)
	if err == nil {
		err = tmp.Sync()
	}
	if errC := tmp.Close(); err == nil {
		err = errC
	}
	if err != nil {
		return nil, "", err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return nil, "", err
	}
	return m, hex.EncodeToString(h.Sum(nil)), nil
}

// backupToS3 writes the archive to a temporary file, uploads it and removes the file.
func backupToS3(ctx context.Context, s3 backup.S3Config, bucket, key string, opt backup.Options) (*backup.Manifest, string, error) {
	dir, err := os.MkdirTemp("", "berthd-backup-")
	if err != nil {
		return nil, "", err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "archive")
	m, sum, err := backupToFile(ctx, path, opt)
	if err != nil {
		return nil, "", err
	}
	if err := backup.UploadS3(ctx, s3, path, bucket, key); err != nil {
		return nil, "", err
	}
	return m, sum, nil
}

func runRestore(args []string, stdout, stderr io.Writer) int {
	var opt backup.RestoreOptions
	fs := pflag.NewFlagSet("berthd restore", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&opt.DataDir, "data-dir", "", "data directory to create (must not exist, or be empty); required")
	fs.StringVar(&opt.MongoURI, "mongo-uri", "", "MongoDB to import a MongoDB export into (its database must be empty)")
	fs.StringVar(&opt.BlobsFrom, "blobs-from", "", "directory laid out like DATA/blobs holding the blobs of a --blobs reference archive")
	var s3 backup.S3Config
	fs.StringVar(&s3.Endpoint, "s3-endpoint", "", "S3 API host[:port] when FILE is s3://BUCKET/KEY (credentials: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)")
	fs.StringVar(&s3.Region, "s3-region", "", "S3 region (default: the store's)")
	fs.BoolVar(&s3.Insecure, "s3-insecure", false, "speak plain HTTP to the S3 endpoint (loopback test servers only)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `berthd restore checks a whole archive (every SHA-256, nothing missing, nothing
extra) and only then writes it into a new data directory. The restored berthd has
the same cluster id, signing key and TLS certificate, so nodes reconnect without
enrolling again (docs/operating.md section 5.2).

Usage:
  berthd restore FILE|s3://BUCKET/KEY --data-dir DIR [--mongo-uri URI] [--blobs-from DIR] [--s3-endpoint HOST:PORT]

Flags:
`)
		fmt.Fprint(fs.Output(), fs.FlagUsages())
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		return server.ExitConfig
	}
	if fs.NArg() != 1 || opt.DataDir == "" {
		fmt.Fprintln(stderr, "berthd restore: usage: berthd restore FILE --data-dir DIR (see --help)")
		return server.ExitConfig
	}
	opt.Logger = slog.New(slog.NewTextHandler(stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	archive := fs.Arg(0)
	if strings.Contains(archive, "://") {
		bucket, key, err := backup.ParseS3URL(archive)
		if err != nil {
			fmt.Fprintf(stderr, "berthd restore: %v\n", err)
			return server.ExitConfig
		}
		tmp, err := os.MkdirTemp("", "berthd-restore-")
		if err != nil {
			fmt.Fprintf(stderr, "berthd restore: %v\n", err)
			return 1
		}
		defer os.RemoveAll(tmp)
		archive = filepath.Join(tmp, "archive")
		if err := backup.DownloadS3(ctx, s3, bucket, key, archive); err != nil {
			fmt.Fprintf(stderr, "berthd restore: %v\n", err)
			return 1
		}
	}
	m, err := backup.Restore(ctx, archive, opt)
	if err != nil {
		fmt.Fprintf(stderr, "berthd restore: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "restored cluster %s (backup of %s): %d files, %d bytes into %s in %s\nStart berthd with --data-dir %s; its nodes reconnect with their existing credentials.\n",
		m.ClusterID, m.CreatedAt.Format(time.RFC3339), len(m.Files), m.TotalBytes(), opt.DataDir, time.Since(start).Round(time.Millisecond), opt.DataDir)
	return 0
}
