package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"sort"

	"github.com/spf13/pflag"

	"github.com/berthhq/berth/core/server"
	"github.com/berthhq/berth/internal/config"
)

func runInstall(args []string, stdout, stderr io.Writer) int {
	var cfg server.UnitConfig
	fs := pflag.NewFlagSet("berthd install", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `berthd install writes the systemd unit berthd.service (docs/operating.md section 2):
berthd as a dedicated system user with only its data directory writable,
restarted after a failure. It creates no user or directory and starts nothing;
it prints the commands to run next.

Flags:
`)
		fmt.Fprint(fs.Output(), fs.FlagUsages())
	}
	fs.StringVar(&cfg.DataDir, "data-dir", "/var/lib/berthd", "data directory the unit runs with")
	fs.StringVar(&cfg.ConfigFile, "config", "", "configuration file the unit passes as --config (default: none)")
	fs.StringVar(&cfg.User, "user", "berthd", "system user (and group) the unit runs as")
	fs.StringVar(&cfg.Binary, "binary", "", "berthd path the unit runs (default: this binary)")
	fs.IntVar(&cfg.LimitNOFILE, "limit-nofile", server.DefaultLimitNOFILE, "open-file limit (one per node session, API client and gateway connection pair)")
	fs.StringVar(&cfg.UnitDir, "unit-dir", server.DefaultUnitDir, "directory the unit is written to")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		return server.ExitConfig
	}
	if cfg.Binary == "" {
		exe, err := os.Executable()
		if err != nil {
			fmt.Fprintf(stderr, "berthd install: locate this binary: %v\n", err)
			return 1
		}
		cfg.Binary = exe
	}
	for _, p := range []*string{&cfg.Binary, &cfg.DataDir, &cfg.ConfigFile} {
		if *p == "" {
			continue
		}
		abs, err := filepath.Abs(*p)
		if err != nil {
			fmt.Fprintf(stderr, "berthd install: %v\n", err)
			return server.ExitConfig
		}
		*p = abs
	}
	path, text, err := server.InstallUnit(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "berthd install: %v\n", err)
		return server.ExitConfig
	}
	fmt.Fprintf(stdout, "wrote %s:\n\n%s\nNothing was started. Next:\n%s", path, text, server.NextSteps(cfg))
	return 0
}

func runConfig(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || (args[0] != "check" && args[0] != "sample") {
		fmt.Fprintln(stderr, "usage: berthd config check [--config FILE] [flags] | berthd config sample")
		return server.ExitConfig
	}
	if args[0] == "sample" {
		var cfg server.Config
		var file string
		var level slog.Level
		fs := serveFlags(&cfg, &level, &file)
		if err := config.Sample(stdout, fs, "config", "version"); err != nil {
			fmt.Fprintf(stderr, "berthd config sample: %v\n", err)
			return 1
		}
		return 0
	}
	_, _, src, fs, err := loadServe(args[1:], stderr)
	if errors.Is(err, pflag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "berthd config check: %v\n", err)
		return server.ExitConfig
	}
	names := make([]string, 0, len(src))
	for n := range src {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintln(stdout, "configuration ok; effective values:")
	for _, n := range names {
		if n == "config" {
			continue
		}
		v := fs.Lookup(n).Value.String()
		if u, err := url.Parse(v); n == "mongo-uri" && err == nil {
			v = u.Redacted() // never print a password
		}
		fmt.Fprintf(stdout, "  %-18s %-24s (%s)\n", n, v, src[n])
	}
	return 0
}
