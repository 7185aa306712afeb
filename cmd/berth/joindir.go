package main

import (
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// agentDefaultDataDir is berth-agent's default --data-dir.
const agentDefaultDataDir = "/var/lib/berth-agent"

// joinDataDir returns the --data-dir to add to a printed join command, "" for none: when this
// user may not create or write berth-agent's default data directory (euid is not 0 and
// canWrite fails for the directory, or for its parent while it does not exist), a directory
// under dataHome (XDG_DATA_HOME, else ~/.local/share) is named instead, so the command works
// as printed on this machine. Pure apart from canWrite.
func joinDataDir(euid int, canWrite func(string) bool, exists func(string) bool, dataHome string) string {
	if euid == 0 || dataHome == "" {
		return ""
	}
	target := agentDefaultDataDir
	if !exists(target) {
		target = filepath.Dir(target)
	}
	if canWrite(target) {
		return ""
	}
	return filepath.Join(dataHome, "berth-agent")
}

// localJoinDataDir is [joinDataDir] for this process and machine.
func localJoinDataDir() string {
	home := os.Getenv("XDG_DATA_HOME")
	if home == "" {
		if h, err := os.UserHomeDir(); err == nil {
			home = filepath.Join(h, ".local", "share")
		}
	}
	return joinDataDir(os.Geteuid(), func(p string) bool { return unix.Access(p, unix.W_OK|unix.X_OK) == nil },
		func(p string) bool { _, err := os.Stat(p); return err == nil }, home)
}
