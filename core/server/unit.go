package server

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// UnitName is the systemd unit [InstallUnit] writes (docs/operating.md section 2).
const UnitName = "berthd.service"

// DefaultUnitDir is where [InstallUnit] writes the unit when UnitConfig.UnitDir is empty.
const DefaultUnitDir = "/etc/systemd/system"

// DefaultLimitNOFILE is the unit's open-file limit: one socket per node session,
// per API client and per gateway connection pair, plus the store's files and
// plugin pipes, with room for several thousand nodes (docs/operating.md section 7).
const DefaultLimitNOFILE = 65536

// ExitConfig is berthd's exit status for an error a restart cannot fix (bad
// flags, a refused configuration file): EX_CONFIG of sysexits.h. The unit sets
// RestartPreventExitStatus to it.
const ExitConfig = 78

// UnitConfig says how the berthd unit runs. Binary, DataDir and every other
// path must be absolute.
type UnitConfig struct {
	Binary      string // absolute path of berthd
	DataDir     string // absolute data directory; writable by the unit, everything else is read-only
	ConfigFile  string // absolute path passed as --config; empty passes none
	User        string // dedicated system user (and group) the unit runs as; empty: "berthd"
	LimitNOFILE int    // open-file limit; zero: DefaultLimitNOFILE
	UnitDir     string // where InstallUnit writes; empty: DefaultUnitDir
}

func (c *UnitConfig) check() error {
	if c.User == "" {
		c.User = "berthd"
	}
	if c.LimitNOFILE == 0 {
		c.LimitNOFILE = DefaultLimitNOFILE
	}
	if c.LimitNOFILE < 1024 {
		return fmt.Errorf("berthd: LimitNOFILE %d is below 1024", c.LimitNOFILE)
	}
	if c.Binary == "" || c.DataDir == "" {
		return errors.New("berthd: the unit needs the binary and the data directory")
	}
	for _, p := range []string{c.Binary, c.DataDir, c.ConfigFile} {
		if p != "" && !filepath.IsAbs(p) {
			return fmt.Errorf("berthd: unit path %q is not absolute", p)
		}
		if strings.ContainsAny(p, " \t\n\"'\\%$;") {
			return fmt.Errorf("berthd: path %q holds a character the unit would have to quote; use a plain path", p)
		}
	}
	if filepath.Clean(c.DataDir) == "/" {
		return errors.New("berthd: the data directory cannot be /")
	}
	for _, r := range c.User {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return fmt.Errorf("berthd: user name %q: use lower-case letters, digits, - and _", c.User)
		}
	}
	return nil
}

// Unit returns the text of berthd.service for cfg: `berthd --data-dir D
// [--config F]` as a dedicated system user, restarted 5 s after a failure other
// than [ExitConfig], with an open-file limit for node sessions, and sandboxed:
// no new privileges, the whole file system read-only except the data directory
// (ProtectSystem=strict with ReadWritePaths), private /tmp and devices, no
// home directories, files created 0600 (UMask=0077). Binding ports below 1024
// is the only capability kept. MemoryDenyWriteExecute stays off: the
// WebAssembly runtime compiles modules to native code. When DataDir is
// /var/lib/NAME, systemd creates it (StateDirectory, mode 0700, owned by User).
func Unit(cfg UnitConfig) (string, error) {
	if err := cfg.check(); err != nil {
		return "", err
	}
	exec := cfg.Binary + " --data-dir " + cfg.DataDir
	if cfg.ConfigFile != "" {
		exec += " --config " + cfg.ConfigFile
	}
	state := ""
	if rest, ok := strings.CutPrefix(filepath.Clean(cfg.DataDir), "/var/lib/"); ok && rest != "" && !strings.Contains(rest, "/") {
		state = "StateDirectory=" + rest + "\nStateDirectoryMode=0700\n"
	}
	return fmt.Sprintf(`# Written by berthd install (docs/operating.md section 2). Nothing was started.
[Unit]
Description=Berth control plane (berthd)
Documentation=https://github.com/berthhq/berth/blob/main/docs/operating.md
Wants=network-online.target
After=network-online.target

[Service]
Type=simple
User=%[2]s
Group=%[2]s
ExecStart=%[1]s
Restart=on-failure
RestartSec=5s
# Exit status %[3]d is a configuration error (bad flag or configuration file)
# that a restart cannot fix.
RestartPreventExitStatus=%[3]d
TimeoutStopSec=30s
# Stop and restart end berthd alone: the gateway outlives it and is
# reattached by the next start (docs/plugins.md section 5.3).
KillMode=process
# One descriptor per node session, API client and gateway connection pair.
LimitNOFILE=%[4]d
%[5]sReadWritePaths=%[6]s
UMask=0077
NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
PrivateDevices=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
RestrictSUIDSGID=yes
RestrictRealtime=yes
RestrictNamespaces=yes
LockPersonality=yes
RemoveIPC=yes
RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX
SystemCallArchitectures=native
CapabilityBoundingSet=CAP_NET_BIND_SERVICE
AmbientCapabilities=CAP_NET_BIND_SERVICE

[Install]
WantedBy=multi-user.target
`, exec, cfg.User, ExitConfig, cfg.LimitNOFILE, state, cfg.DataDir), nil
}

// InstallUnit writes the unit of cfg to UnitDir/berthd.service (0644, replacing
// an existing file atomically: temp file, fsync, rename) and returns its path and
// text. It creates no user, no directory, and enables, reloads or starts
// nothing: [NextSteps] says what the operator runs.
func InstallUnit(cfg UnitConfig) (path, text string, err error) {
	text, err = Unit(cfg)
	if err != nil {
		return "", "", err
	}
	dir := cfg.UnitDir
	if dir == "" {
		dir = DefaultUnitDir
	}
	path = filepath.Join(dir, UnitName)
	tmp, err := os.CreateTemp(dir, "."+UnitName+".*")
	if err != nil {
		return "", "", fmt.Errorf("berthd: write unit: %w", err)
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	_, err = tmp.WriteString(text)
	if err == nil {
		err = tmp.Chmod(0o644)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if errC := tmp.Close(); err == nil {
		err = errC
	}
	if err != nil {
		return "", "", fmt.Errorf("berthd: write unit: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return "", "", fmt.Errorf("berthd: install unit: %w", err)
	}
	return path, text, nil
}

// NextSteps returns the commands an operator runs after [InstallUnit]: create
// the system user, the data directory (0700, owned by it) and, when set, the
// configuration file's directory; then reload systemd and start the unit.
func NextSteps(cfg UnitConfig) string {
	if cfg.User == "" {
		cfg.User = "berthd"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "  useradd --system --user-group --home-dir %s --shell /usr/sbin/nologin %s\n", cfg.DataDir, cfg.User)
	fmt.Fprintf(&b, "  install -d -m 0700 -o %s -g %s %s\n", cfg.User, cfg.User, cfg.DataDir)
	if cfg.ConfigFile != "" {
		fmt.Fprintf(&b, "  install -d -m 0750 -g %s %s   # then write %s (berthd config sample > it; berthd config check --config it)\n", cfg.User, filepath.Dir(cfg.ConfigFile), cfg.ConfigFile)
	}
	b.WriteString("  systemctl daemon-reload\n  systemctl enable --now berthd\n")
	fmt.Fprintf(&b, "  journalctl -u berthd -f        # the admin token is printed once at first start, and kept in %s/admin-token\n", cfg.DataDir)
	return b.String()
}
