package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
)

// fileConfig is the file "berth login" writes. It holds a token, so it is
// written owner-only and refused on read when anyone else could read it.
type fileConfig struct {
	Server  string `json:"server,omitempty"`
	Token   string `json:"token,omitempty"`
	Project string `json:"project,omitempty"`
	// Fingerprint pins the server's TLS certificate ("sha256:<64 hex>");
	// empty trusts the system CAs (docs/node-protocol.md section 2.2).
	Fingerprint string `json:"fingerprint,omitempty"`
}

// settings are the resolved connection settings of one command.
type settings struct {
	Server     string
	Token      string
	Project    string
	ConfigPath string
	// Fingerprint is the pinned server certificate; FingerprintFromFile
	// reports whether it came from the config file rather than a flag or the
	// environment.
	Fingerprint         string
	FingerprintFromFile bool
}

// defaultProject is the project used when nothing names one.
const defaultProject = "default"

// configPath returns $XDG_CONFIG_HOME/berth/config.json, or
// ~/.config/berth/config.json when XDG_CONFIG_HOME is unset or relative (the
// XDG spec says to ignore a relative one).
func (a *app) configPath() (string, error) {
	if x := a.getenv("XDG_CONFIG_HOME"); x != "" && filepath.IsAbs(x) {
		return filepath.Join(x, "berth", "config.json"), nil
	}
	home := a.getenv("HOME")
	if home == "" {
		h, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("find config directory: %w", err)
		}
		home = h
	}
	return filepath.Join(home, ".config", "berth", "config.json"), nil
}

// resolve merges flags over environment over the config file.
func (a *app) resolve(cmd *cobra.Command) (settings, error) {
	var s settings
	p, err := a.configPath()
	if err != nil {
		return s, err
	}
	s.ConfigPath = p
	fc, err := loadConfig(p)
	if err != nil {
		return s, err
	}
	changed := func(name string) bool {
		f := cmd.Flags().Lookup(name)
		return f != nil && f.Changed
	}
	pick := func(flagName, flagVal, envName, fileVal string) string {
		if changed(flagName) {
			return flagVal
		}
		if v := a.getenv(envName); v != "" {
			return v
		}
		return fileVal
	}
	s.Server = pick("server", a.server, "BERTH_SERVER", fc.Server)
	s.Token = pick("token", a.token, "BERTH_TOKEN", fc.Token)
	s.Project = pick("project", a.project, "BERTH_PROJECT", fc.Project)
	s.Fingerprint = pick("fingerprint", a.fingerprint, "BERTH_FINGERPRINT", "")
	if s.Fingerprint == "" && fc.Fingerprint != "" {
		s.Fingerprint, s.FingerprintFromFile = fc.Fingerprint, true
	}
	if s.Project == "" {
		s.Project = defaultProject
	}
	return s, nil
}

// loadConfig reads the config file at p. A missing file is an empty config.
// A symlink, a non-regular file, or one readable by group or others is
// refused, since it holds a token.
func loadConfig(p string) (fileConfig, error) {
	var fc fileConfig
	info, err := os.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return fc, nil
	}
	if err != nil {
		return fc, fmt.Errorf("read config: %w", err)
	}
	if !info.Mode().IsRegular() {
		return fc, fmt.Errorf("read config %s: not a regular file (symlinks are refused)", p)
	}
	if info.Mode().Perm()&0o077 != 0 {
		return fc, fmt.Errorf("read config %s: mode %04o lets others read the token; run chmod 600 %s", p, info.Mode().Perm(), p)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return fc, fmt.Errorf("read config: %w", err)
	}
	if err := json.Unmarshal(b, &fc); err != nil {
		return fc, fmt.Errorf("read config %s: %w", p, err)
	}
	return fc, nil
}

// saveConfig writes fc to p atomically: a 0600 temp file in the same 0700
// directory, synced, then renamed over p.
func saveConfig(p string, fc fileConfig) error {
	dir := filepath.Dir(p)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("save config: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("save config: %w", err)
	}
	b, err := json.MarshalIndent(fc, "", "  ")
	if err != nil {
		return fmt.Errorf("save config: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".config-*.json") // created 0600
	if err != nil {
		return fmt.Errorf("save config: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("save config: %w", err)
	}
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return fmt.Errorf("save config: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("save config: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("save config: %w", err)
	}
	if err := os.Rename(tmp.Name(), p); err != nil {
		return fmt.Errorf("save config: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync() // make the rename durable; best effort where unsupported
		d.Close()
	}
	return nil
}
