package plugin

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"syscall"

	goplugin "github.com/hashicorp/go-plugin"

	"github.com/berthhq/berth/abi/pluginapi"
	"github.com/berthhq/berth/internal/securefile"
)

// reattachVersion is the version of the reattach record's format.
//
//   - 1 (2026-12): pid, start time, address, protocol, binary, digest, args.
const reattachVersion = 1

// reattachRecord is what a handle with Config.ReattachPath writes about its
// current process (docs/plugins.md section 2.8): enough for the next host to
// reconnect to it, and to tell it from a process that got the same pid later
// or runs another binary.
type reattachRecord struct {
	Version         int      `json:"version"`
	PID             int      `json:"pid"`
	StartTicks      uint64   `json:"start_ticks"` // /proc/<pid>/stat field 22
	Network         string   `json:"network"`     // "unix" or "tcp"
	Address         string   `json:"address"`
	Protocol        string   `json:"protocol"`         // go-plugin's, "grpc"
	ProtocolVersion int      `json:"protocol_version"` // the negotiated contract version
	Path            string   `json:"path"`
	SHA256          string   `json:"sha256"` // hex digest of the running binary
	Args            []string `json:"args"`
}

// errNoRecord: there is no reattach record, so there is nothing to reattach to.
var errNoRecord = errors.New("no reattach record")

// writeReattach records client's process at Config.ReattachPath (0600, written
// atomically). Failures are logged: the process then does not outlive this
// host's next start, it is reaped and relaunched.
func (s *supervisor) writeReattach(client *goplugin.Client, negotiated int) {
	if s.cfg.ReattachPath == "" {
		return
	}
	rc := client.ReattachConfig()
	if rc == nil || rc.Addr == nil || rc.Pid <= 0 {
		s.log.Warn("plugin gave no reattach information; it will be relaunched, not reattached, after a host restart")
		return
	}
	ticks, err := startTicks(rc.Pid)
	if err != nil {
		s.log.Warn("cannot read the plugin's start time; it will be relaunched after a host restart", "error", err)
		return
	}
	sum, err := fileSHA256("/proc/" + strconv.Itoa(rc.Pid) + "/exe")
	if err != nil {
		s.log.Warn("cannot hash the plugin's binary; it will be relaunched after a host restart", "error", err)
		return
	}
	raw, _ := json.Marshal(reattachRecord{ // plain struct: cannot fail
		Version: reattachVersion, PID: rc.Pid, StartTicks: ticks,
		Network: rc.Addr.Network(), Address: rc.Addr.String(),
		Protocol: string(rc.Protocol), ProtocolVersion: negotiated,
		Path: s.cfg.Path, SHA256: hex.EncodeToString(sum), Args: s.cfg.Args,
	})
	if err := securefile.WriteFile(s.cfg.ReattachPath, raw); err != nil {
		s.log.Warn("cannot write the reattach record; the plugin will be relaunched after a host restart", "error", err)
	}
}

// removeReattach deletes the reattach record; a missing one is fine.
func (s *supervisor) removeReattach() {
	if s.cfg.ReattachPath == "" {
		return
	}
	if err := os.Remove(s.cfg.ReattachPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		s.log.Warn("cannot remove the reattach record", "error", err)
	}
}

// readReattach returns the reattach record when it describes a live process
// that this handle may reconnect to: same pid and start time, the binary it
// runs hashes to the pinned SHA-256 (when one is pinned), same path and
// arguments. It returns errNoRecord without a record; any other error leaves
// the recorded process to [supervisor.reapRecorded].
func (s *supervisor) readReattach() (reattachRecord, error) {
	var rec reattachRecord
	raw, err := securefile.ReadFile(s.cfg.ReattachPath)
	if errors.Is(err, os.ErrNotExist) {
		return rec, errNoRecord
	}
	if err != nil {
		return rec, fmt.Errorf("read reattach record: %w", err)
	}
	if err := json.Unmarshal(raw, &rec); err != nil || rec.Version != reattachVersion || rec.PID <= 0 {
		return rec, fmt.Errorf("reattach record %s is corrupt or of another version", s.cfg.ReattachPath)
	}
	if !sameProcessAlive(rec.PID, rec.StartTicks) {
		return rec, fmt.Errorf("recorded plugin process %d is gone", rec.PID)
	}
	if rec.Path != s.cfg.Path || !slices.Equal(rec.Args, s.cfg.Args) {
		return rec, fmt.Errorf("recorded plugin process %d runs %s %v, not %s %v", rec.PID, rec.Path, rec.Args, s.cfg.Path, s.cfg.Args)
	}
	if s.checksum != nil {
		// /proc/<pid>/exe is the binary the process runs, even when the file
		// at Path was replaced since (an upgrade).
		sum, err := fileSHA256("/proc/" + strconv.Itoa(rec.PID) + "/exe")
		if err != nil {
			return rec, fmt.Errorf("hash the binary of plugin process %d: %w", rec.PID, err)
		}
		if !bytes.Equal(sum, s.checksum) {
			return rec, fmt.Errorf("plugin process %d runs a binary with SHA-256 %x, not the pinned %x: %w", rec.PID, sum, s.checksum, ErrChecksum)
		}
	}
	if rec.Protocol != string(goplugin.ProtocolGRPC) || !slices.Contains(s.spec.versions, rec.ProtocolVersion) {
		return rec, fmt.Errorf("plugin process %d speaks %s version %d, which this host does not", rec.PID, rec.Protocol, rec.ProtocolVersion)
	}
	return rec, nil
}

// reattach reconnects to the process in the reattach record and readies it as
// launch does (Describe, configuration). It returns errNoRecord when there is
// no record; on any other error the recorded process, if still the same, is
// killed so that a fresh launch can take its place.
func (s *supervisor) reattach(ctx context.Context) (*goplugin.Client, any, int, error) {
	rec, err := s.readReattach()
	if errors.Is(err, errNoRecord) {
		return nil, nil, 0, err
	}
	if err == nil {
		var client *goplugin.Client
		var impl any
		client, impl, err = s.connect(ctx, rec)
		if err == nil {
			return client, impl, rec.ProtocolVersion, nil
		}
	}
	s.reapRecorded(rec)
	return nil, nil, 0, err
}

// connect builds a go-plugin client over the recorded address and readies it.
func (s *supervisor) connect(ctx context.Context, rec reattachRecord) (*goplugin.Client, any, error) {
	var addr net.Addr
	switch rec.Network {
	case "unix":
		addr = &net.UnixAddr{Net: "unix", Name: rec.Address}
	case "tcp":
		a, err := net.ResolveTCPAddr("tcp", rec.Address)
		if err != nil {
			return nil, nil, fmt.Errorf("reattach: address %q: %w", rec.Address, err)
		}
		addr = a
	default:
		return nil, nil, fmt.Errorf("reattach: network %q", rec.Network)
	}
	client := goplugin.NewClient(&goplugin.ClientConfig{
		HandshakeConfig:  goplugin.HandshakeConfig{MagicCookieKey: pluginapi.MagicCookieKey, MagicCookieValue: s.spec.cookie},
		Plugins:          goplugin.PluginSet{s.spec.name: &clientPlugin{newClient: s.spec.newClient}},
		Reattach:         &goplugin.ReattachConfig{Protocol: goplugin.ProtocolGRPC, ProtocolVersion: rec.ProtocolVersion, Addr: addr, Pid: rec.PID},
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		Managed:          false,
		Logger:           newHclogAdapter(s.log),
		SyncStdout:       &lineLogger{l: s.log, stream: "stdout"},
		SyncStderr:       &lineLogger{l: s.log, stream: "stderr"},
	})
	rpc, err := client.Client()
	if err != nil {
		return nil, nil, fmt.Errorf("reattach to plugin process %d: %w", rec.PID, err)
	}
	// From here on a failure must not kill the process through client.Kill
	// before reapRecorded decides: close only this host's connection.
	fail := func(what string, err error) (*goplugin.Client, any, error) {
		detachClient(client)
		return nil, nil, fmt.Errorf("reattach to plugin process %d: %s: %w", rec.PID, what, err)
	}
	raw, err := rpc.Dispense(s.spec.name)
	if err != nil {
		return fail("dispense", err)
	}
	if _, ok := raw.(dispensed); !ok {
		return fail("dispense", fmt.Errorf("unexpected client type %T", raw))
	}
	rctx, cancel := context.WithTimeout(ctx, s.cfg.CallTimeout)
	defer cancel()
	version, err := s.ready(rctx, raw, rec.ProtocolVersion)
	if err != nil {
		return fail("first calls", err)
	}
	s.mu.Lock()
	s.status.Version = version
	s.mu.Unlock()
	s.log.Info("plugin reattached", "pid", rec.PID, "api_version", rec.ProtocolVersion, "version", version)
	return client, raw, nil
}

// reapRecorded kills the process of rec when it is still the same process
// (pid and start time), waits until it is gone, and removes the record.
func (s *supervisor) reapRecorded(rec reattachRecord) {
	if rec.PID > 0 && rec.PID != os.Getpid() && sameProcessAlive(rec.PID, rec.StartTicks) {
		s.log.Warn("killing the recorded plugin process, which cannot be reattached", "pid", rec.PID)
		if err := syscall.Kill(rec.PID, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			s.log.Warn("cannot kill the recorded plugin process", "pid", rec.PID, "error", err)
		} else if err := waitGone(rec.PID, rec.StartTicks, reapWait); err != nil {
			s.log.Warn("recorded plugin process did not exit", "pid", rec.PID, "error", err)
		}
	}
	s.removeReattach()
}

// detachClient closes this host's connection to the plugin without asking the
// plugin to exit (go-plugin's Kill and GRPCClient.Close both would).
func detachClient(client *goplugin.Client) {
	rpc, err := client.Client()
	if err != nil {
		return
	}
	if g, ok := rpc.(*goplugin.GRPCClient); ok {
		_ = g.Conn.Close()
	}
}
