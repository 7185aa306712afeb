// Package hostsetup owns the agent's host duties: the systemd unit that runs
// berth-agent on a node, the system user workloads run as, and the exit status that tells
// systemd not to restart it.
package hostsetup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
)

// ExitConfig is the exit status of berth-agent for a configuration error
// that a restart cannot fix (not enrolled, node removed, plugin missing,
// bad flags): EX_CONFIG of sysexits.h. The unit sets
// RestartPreventExitStatus to it, so systemd does not restart the agent in a loop.
const ExitConfig = 78

// ExitPinMismatch is the exit status of berth-agent run when berthd kept
// presenting a certificate other than the one pinned at enrollment
// (docs/node-protocol.md sections 2.2 and 13): EX_NOPERM of sysexits.h. The
// core was re-created or something sits in the middle; either way only an
// operator can fix it (a new join command into a fresh data directory), so
// the unit does not restart the agent on it either.
const ExitPinMismatch = 77

// UnitName is the name of the unit file [Install] writes.
const UnitName = "berth-agent.service"

// DefaultUnitDir is where [Install] writes the unit when UnitConfig.UnitDir is empty.
const DefaultUnitDir = "/etc/systemd/system"

// UnitConfig says how the unit runs the agent. Binary and DataDir are
// required and must be absolute; PluginDir empty means the binary's directory.
type UnitConfig struct {
	Binary    string // absolute path of berth-agent
	DataDir   string // absolute path of the agent's data directory
	PluginDir string // absolute path of the runtime-driver plugins; empty: the binary's directory
	UnitDir   string // where the unit is written; empty: DefaultUnitDir
	// Resources are the --resource NAME=COUNT values the unit runs the agent with (extended
	// resources the node offers); Reserve is its --reserve value ("cpu_m=500,memory_mib=512");
	// both empty for none. The caller checks their form.
	Resources []string
	Reserve   string
}

// Unit returns the systemd unit text for cfg: it runs `berth-agent run`,
// restarts it 5 s after any failure except exit status [ExitConfig], and
// kills only the agent's own process on stop (KillMode=process), so the
// workloads, which outlive the agent, keep running.
func Unit(cfg UnitConfig) (string, error) {
	if !filepath.IsAbs(cfg.Binary) || !filepath.IsAbs(cfg.DataDir) || (cfg.PluginDir != "" && !filepath.IsAbs(cfg.PluginDir)) {
		return "", errors.New("hostsetup: Binary, DataDir and PluginDir must be absolute paths")
	}
	for _, p := range append([]string{cfg.Binary, cfg.DataDir, cfg.PluginDir, cfg.Reserve}, cfg.Resources...) {
		if strings.ContainsAny(p, " \t\n\"'\\%$") {
			return "", fmt.Errorf("hostsetup: %q holds a character the unit would have to quote; use a plain value", p)
		}
	}
	exec := cfg.Binary + " run --data-dir " + cfg.DataDir
	if cfg.PluginDir != "" {
		exec += " --plugin-dir " + cfg.PluginDir
	}
	for _, r := range cfg.Resources {
		exec += " --resource " + r
	}
	if cfg.Reserve != "" {
		exec += " --reserve " + cfg.Reserve
	}
	return fmt.Sprintf(`# Written by berth-agent install. Enable with:
#   systemctl daemon-reload && systemctl enable --now berth-agent
[Unit]
Description=Berth node agent
Documentation=https://github.com/berthhq/berth/blob/main/docs/node-protocol.md
Wants=network-online.target
After=network-online.target

[Service]
Type=simple
ExecStart=%s
Restart=on-failure
RestartSec=5s
# Exit status %d is a configuration error (not enrolled, node removed, plugin
# missing) and %d a server certificate other than the pinned one: a restart
# fixes neither.
RestartPreventExitStatus=%d %d
# Workloads outlive the agent: stop only the agent's own process.
KillMode=process
TimeoutStopSec=30s

[Install]
WantedBy=multi-user.target
`, exec, ExitConfig, ExitPinMismatch, ExitConfig, ExitPinMismatch), nil
}

// Install writes the unit of cfg to UnitDir/berth-agent.service (0644,
// replacing an existing file atomically) and returns the path and the text it
// wrote. It starts, enables and reloads nothing: the operator does.
func Install(cfg UnitConfig) (string, string, error) {
	text, err := Unit(cfg)
	if err != nil {
		return "", "", err
	}
	dir := cfg.UnitDir
	if dir == "" {
		dir = DefaultUnitDir
	}
	path := filepath.Join(dir, UnitName)
	tmp, err := os.CreateTemp(dir, "."+UnitName+".*")
	if err != nil {
		return "", "", fmt.Errorf("hostsetup: write unit: %w", err)
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if _, err := tmp.WriteString(text); err != nil {
		_ = tmp.Close()
		return "", "", fmt.Errorf("hostsetup: write unit: %w", err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		_ = tmp.Close()
		return "", "", fmt.Errorf("hostsetup: write unit: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return "", "", fmt.Errorf("hostsetup: write unit: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return "", "", fmt.Errorf("hostsetup: write unit: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return "", "", fmt.Errorf("hostsetup: install unit: %w", err)
	}
	return path, text, nil
}

// EnsureSystemUser makes sure the host has the system user name (with a group of the same name,
// no home directory and no login shell; docs/node-protocol.md section 6.7), creating it with
// useradd when it is missing. It reports whether it created the user. It must run as root to
// create one; an existing user is never changed.
func EnsureSystemUser(ctx context.Context, name string) (bool, error) {
	if _, err := user.Lookup(name); err == nil {
		return false, nil
	} else if !errors.As(err, new(user.UnknownUserError)) {
		return false, fmt.Errorf("look up user %s: %w", name, err)
	}
	if name == "" || strings.HasPrefix(name, "-") || strings.ContainsAny(name, " \t\n:/") {
		return false, fmt.Errorf("hostsetup: %q is not a user name", name)
	}
	out, err := exec.CommandContext(ctx, "useradd", "--system", "--user-group", "--no-create-home",
		"--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", name).CombinedOutput()
	if err != nil {
		if _, lerr := user.Lookup(name); lerr == nil {
			return false, nil // created meanwhile by another agent
		}
		return false, fmt.Errorf("create system user %s: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	return true, nil
}
