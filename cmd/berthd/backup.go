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
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `berthd backup writes a consistent snapshot of the data directory and the store
to one archive (docs/operating.md section 5). It runs beside a running berthd
or with none, reads --data-dir and --mongo-uri like berthd does (flags,
BERTH_* variables, --config), and changes nothing.

Usage:
  berthd backup --to FILE [--config FILE] [--data-dir DIR] [--mongo-uri URI] [--blobs copy|reference]

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
	if _, err := config.Apply(fs, config.Options{File: file, Getenv: os.Getenv, Skip: []string{"config", "version", "to", "blobs"}}); err != nil {
		fmt.Fprintf(stderr, "berthd backup: %v\n", err)
		return server.ExitConfig
	}
	switch {
	case cfg.DataDir == "":
		fmt.Fprintln(stderr, "berthd backup: --data-dir is required")
		return server.ExitConfig
	case to == "":
		fmt.Fprintln(stderr, "berthd backup: --to FILE is required")
		return server.ExitConfig
	case strings.Contains(to, "://"):
		fmt.Fprintf(stderr, "berthd backup: %s: only a local file or - is supported; copy the archive to object storage afterwards (docs/operating.md section 5)\n", to)
		return server.ExitConfig
	}
	if to != "-" {
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

func runRestore(args []string, stdout, stderr io.Writer) int {
	var opt backup.RestoreOptions
	fs := pflag.NewFlagSet("berthd restore", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&opt.DataDir, "data-dir", "", "data directory to create (must not exist, or be empty); required")
	fs.StringVar(&opt.MongoURI, "mongo-uri", "", "MongoDB to import a MongoDB export into (its database must be empty)")
	fs.StringVar(&opt.BlobsFrom, "blobs-from", "", "directory laid out like DATA/blobs holding the blobs of a --blobs reference archive")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `berthd restore checks a whole archive (every SHA-256, nothing missing, nothing
extra) and only then writes it into a new data directory. The restored berthd has
the same cluster id, signing key and TLS certificate, so nodes reconnect without
enrolling again (docs/operating.md section 5.2).

Usage:
  berthd restore FILE --data-dir DIR [--mongo-uri URI] [--blobs-from DIR]

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
	m, err := backup.Restore(ctx, fs.Arg(0), opt)
	if err != nil {
		fmt.Fprintf(stderr, "berthd restore: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "restored cluster %s (backup of %s): %d files, %d bytes into %s in %s\nStart berthd with --data-dir %s; its nodes reconnect with their existing credentials.\n",
		m.ClusterID, m.CreatedAt.Format(time.RFC3339), len(m.Files), m.TotalBytes(), opt.DataDir, time.Since(start).Round(time.Millisecond), opt.DataDir)
	return 0
}
