package upgrade

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/node"
)

// script is a stand-in binary: a shell script that prints a --version line
// the way every Berth binary does (internal/version.Line).
func script(program, version string) []byte {
	return []byte(fmt.Sprintf("#!/bin/sh\necho '%s %s go1.26.8 %s/%s'\n", program, version, goruntime.GOOS, goruntime.GOARCH))
}

func sum(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

type fixture struct {
	dir, path, data string
	old             []byte
	releases        map[string][]byte // sha256 -> content served
}

func newFixture(t *testing.T, running string) *fixture {
	t.Helper()
	dir := t.TempDir()
	f := &fixture{dir: dir, path: filepath.Join(dir, "bin", "berth-agent"), data: filepath.Join(dir, "data"),
		old: script("berth-agent", running), releases: map[string][]byte{}}
	for _, d := range []string{filepath.Dir(f.path), f.data} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(f.path, f.old, 0o755); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) manager(t *testing.T, running string) *Manager {
	t.Helper()
	m, err := New(Config{Path: f.path, DataDir: f.data, Program: "berth-agent", Version: running,
		RestartGrace: time.Millisecond,
		Fetch: func(_ context.Context, s string) (io.ReadCloser, error) {
			b, ok := f.releases[s]
			if !ok {
				return nil, errors.New("no such release")
			}
			return io.NopCloser(bytes.NewReader(b)), nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// offer serves content as the release of version v and returns the params.
func (f *fixture) offer(v string, content []byte, claimed []byte) node.AgentUpgrade {
	s := sum(claimed)
	f.releases[s] = content
	return node.AgentUpgrade{Version: v, Releases: []node.ReleaseFile{
		{Name: "berth-agent", Version: v, OS: "plan9", Arch: goruntime.GOARCH, SHA256: strings.Repeat("0", 64), Size: 1},
		{Name: "berth-agent", Version: v, OS: goruntime.GOOS, Arch: goruntime.GOARCH, SHA256: s, Size: int64(len(claimed))},
	}}
}

func (f *fixture) read(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return b
}

// unchanged checks that the binary is the old one and nothing else was left behind.
func (f *fixture) unchanged(t *testing.T) {
	t.Helper()
	if got := f.read(t, f.path); !bytes.Equal(got, f.old) {
		t.Fatalf("binary replaced: %q", got)
	}
	ents, _ := os.ReadDir(filepath.Dir(f.path))
	if len(ents) != 1 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Fatalf("files beside the binary: %v, want only berth-agent", names)
	}
	if _, err := os.Stat(filepath.Join(f.data, MarkerFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("upgrade record left behind: %v", err)
	}
}

func wantCode(t *testing.T, res node.CommandResult, code string) {
	t.Helper()
	if res.Status != "error" || res.Error == nil || res.Error.Code != code {
		t.Fatalf("result %+v (error %+v), want error %s", res, res.Error, code)
	}
}

func restarted(m *Manager) bool {
	select {
	case <-m.RestartRequested():
		return true
	case <-time.After(5 * time.Second):
		return false
	}
}

func TestUpgradeSwapsKeepsPreviousAndRestarts(t *testing.T) {
	f := newFixture(t, "0.3.0")
	m := f.manager(t, "0.3.0")
	newBin := script("berth-agent", "0.4.0")
	res := m.Upgrade(context.Background(), f.offer("0.4.0", newBin, newBin))
	if res.Status != "ok" {
		t.Fatalf("upgrade: %+v %+v", res, res.Error)
	}
	if got := f.read(t, f.path); !bytes.Equal(got, newBin) {
		t.Fatalf("binary after the swap: %q", got)
	}
	if got := f.read(t, f.path+".prev"); !bytes.Equal(got, f.old) {
		t.Fatalf(".prev: %q", got)
	}
	if !restarted(m) {
		t.Fatal("no restart requested after the swap")
	}
	// A second offer while the first is unsettled is refused.
	wantCode(t, m.Upgrade(context.Background(), f.offer("0.4.0", newBin, newBin)), "upgrade_in_progress")
}

func TestUpgradeChecksumMismatchReplacesNothing(t *testing.T) {
	f := newFixture(t, "0.3.0")
	m := f.manager(t, "0.3.0")
	newBin := script("berth-agent", "0.4.0")
	tampered := append([]byte(nil), newBin...)
	tampered[len(tampered)-2] ^= 1
	wantCode(t, m.Upgrade(context.Background(), f.offer("0.4.0", tampered, newBin)), "digest_mismatch")
	f.unchanged(t)
	// A longer body than announced is refused the same way.
	wantCode(t, m.Upgrade(context.Background(), f.offer("0.4.0", append(newBin, '\n'), newBin)), "digest_mismatch")
	f.unchanged(t)
}

func TestUpgradeRefusals(t *testing.T) {
	f := newFixture(t, "0.3.0")
	m := f.manager(t, "0.3.0")
	older := script("berth-agent", "0.2.0")
	wantCode(t, m.Upgrade(context.Background(), f.offer("0.2.0", older, older)), "agent_downgrade")
	f.unchanged(t)
	liar := script("berth-agent", "0.9.0") // offered as 0.4.0
	wantCode(t, m.Upgrade(context.Background(), f.offer("0.4.0", liar, liar)), "upgrade_failed")
	f.unchanged(t)
	other := script("berth-relay", "0.4.0")
	wantCode(t, m.Upgrade(context.Background(), f.offer("0.4.0", other, other)), "upgrade_failed")
	f.unchanged(t)
	noArch := f.offer("0.4.0", older, older)
	noArch.Releases = noArch.Releases[:1]
	wantCode(t, m.Upgrade(context.Background(), noArch), "release_not_found")
	wantCode(t, m.Upgrade(context.Background(), node.AgentUpgrade{Version: "latest"}), "validation_failed")
	if res := m.Upgrade(context.Background(), f.offer("0.3.0", f.old, f.old)); res.Status != "ok" || !strings.HasPrefix(res.Detail, "unchanged") {
		t.Fatalf("upgrade to the running version: %+v", res)
	}
	f.unchanged(t)
	// A forced downgrade goes through.
	req := f.offer("0.2.0", older, older)
	req.Force = true
	if res := m.Upgrade(context.Background(), req); res.Status != "ok" {
		t.Fatalf("forced downgrade: %+v %+v", res, res.Error)
	}
	if got := f.read(t, f.path); !bytes.Equal(got, older) {
		t.Fatalf("binary after the forced downgrade: %q", got)
	}
}

// TestResumeConfirmAndRollBack walks the restarts after a swap: the new
// version's first start awaits confirmation, a confirmed one stays; one
// that starts a second time unconfirmed, or whose window passes, puts the
// previous binary back, which then clears the record.
func TestResumeConfirmAndRollBack(t *testing.T) {
	newBin := script("berth-agent", "0.4.0")
	swapped := func(t *testing.T) *fixture {
		f := newFixture(t, "0.3.0")
		if res := f.manager(t, "0.3.0").Upgrade(context.Background(), f.offer("0.4.0", newBin, newBin)); res.Status != "ok" {
			t.Fatalf("upgrade: %+v", res)
		}
		return f
	}
	t.Run("confirmed", func(t *testing.T) {
		f := swapped(t)
		m := f.manager(t, "0.4.0")
		if act, err := m.Resume(); act != AwaitConfirm || err != nil {
			t.Fatalf("first start of the new version: %v %v", act, err)
		}
		if err := m.Confirm(); err != nil {
			t.Fatal(err)
		}
		if act, err := f.manager(t, "0.4.0").Resume(); act != Continue || err != nil {
			t.Fatalf("start after the confirmation: %v %v", act, err)
		}
		if got := f.read(t, f.path); !bytes.Equal(got, newBin) {
			t.Fatal("confirmed binary replaced")
		}
	})
	t.Run("died before confirmation", func(t *testing.T) {
		f := swapped(t)
		if act, _ := f.manager(t, "0.4.0").Resume(); act != AwaitConfirm {
			t.Fatalf("first start: %v", act)
		}
		// The process died unconfirmed; the supervisor starts it again.
		if act, err := f.manager(t, "0.4.0").Resume(); act != Restart || err != nil {
			t.Fatalf("second unconfirmed start: %v %v, want Restart", act, err)
		}
		if got := f.read(t, f.path); !bytes.Equal(got, f.old) {
			t.Fatalf("binary after the rollback: %q", got)
		}
		if act, err := f.manager(t, "0.3.0").Resume(); act != Continue || err != nil {
			t.Fatalf("start of the previous binary: %v %v", act, err)
		}
		if _, err := os.Stat(filepath.Join(f.data, MarkerFile)); !errors.Is(err, os.ErrNotExist) {
			t.Fatal("record kept after the previous binary started")
		}
	})
	t.Run("window passed", func(t *testing.T) {
		f := swapped(t)
		m := f.manager(t, "0.4.0")
		if act, _ := m.Resume(); act != AwaitConfirm {
			t.Fatalf("first start: %v", act)
		}
		if act, err := m.RollBack(); act != Restart || err != nil {
			t.Fatalf("rollback: %v %v", act, err)
		}
		if !restarted(m) {
			t.Fatal("no restart after the rollback")
		}
		if got := f.read(t, f.path); !bytes.Equal(got, f.old) {
			t.Fatalf("binary after the rollback: %q", got)
		}
		if err := m.Confirm(); err != nil {
			t.Fatal(err)
		}
		if got := f.read(t, f.path); !bytes.Equal(got, f.old) {
			t.Fatal("a late welcome undid the rollback")
		}
	})
}

// TestCrashStatesLeaveACompleteBinary: whatever step a killed swap reached,
// the binary at Path is a complete one, old or new, and the next start
// settles the record. Each state is what the crash leaves on disk.
func TestCrashStatesLeaveACompleteBinary(t *testing.T) {
	newBin := script("berth-agent", "0.4.0")
	for _, tc := range []struct {
		name    string
		make    func(t *testing.T, f *fixture, m *Manager)
		running string
		want    Action
		binary  string // "old" or "new"
	}{
		{"staging file written", func(t *testing.T, f *fixture, m *Manager) {
			_ = os.WriteFile(filepath.Join(filepath.Dir(f.path), ".berth-agent.staged-abc"), newBin[:10], 0o700)
		}, "0.3.0", Continue, "old"},
		{"previous kept", func(t *testing.T, f *fixture, m *Manager) {
			if err := m.keepPrevious(); err != nil {
				t.Fatal(err)
			}
			_ = os.WriteFile(f.path+".prev.tmp", nil, 0o700)
		}, "0.3.0", Continue, "old"},
		{"record written, not swapped", func(t *testing.T, f *fixture, m *Manager) {
			if err := m.keepPrevious(); err != nil {
				t.Fatal(err)
			}
			if err := m.writeMarker(&Marker{Program: "berth-agent", Path: f.path, From: "0.3.0", To: "0.4.0", State: StateSwapped}); err != nil {
				t.Fatal(err)
			}
		}, "0.3.0", Continue, "old"},
		{"swapped, not restarted", func(t *testing.T, f *fixture, m *Manager) {
			if res := m.Upgrade(context.Background(), f.offer("0.4.0", newBin, newBin)); res.Status != "ok" {
				t.Fatalf("upgrade: %+v", res)
			}
		}, "0.4.0", AwaitConfirm, "new"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, "0.3.0")
			tc.make(t, f, f.manager(t, "0.3.0"))
			act, err := f.manager(t, tc.running).Resume()
			if act != tc.want || err != nil {
				t.Fatalf("Resume: %v %v, want %v", act, err, tc.want)
			}
			want := f.old
			if tc.binary == "new" {
				want = newBin
			}
			if got := f.read(t, f.path); !bytes.Equal(got, want) {
				t.Fatalf("binary: %q, want the %s one", got, tc.binary)
			}
			out, err := exec.Command(f.path, "--version").Output()
			if err != nil || !strings.HasPrefix(string(out), "berth-agent ") {
				t.Fatalf("binary does not run: %v %q", err, out)
			}
			ents, _ := os.ReadDir(filepath.Dir(f.path))
			for _, e := range ents {
				if strings.Contains(e.Name(), ".staged-") || strings.HasSuffix(e.Name(), ".tmp") {
					t.Fatalf("leftover %s after Resume", e.Name())
				}
			}
		})
	}
}

// TestKilledMidDownload kills a real process in the middle of downloading
// the release (the helper below, run from this test binary): the binary is
// untouched and the next start removes the partial file.
func TestKilledMidDownload(t *testing.T) {
	f := newFixture(t, "0.3.0")
	newBin := append(script("berth-agent", "0.4.0"), bytes.Repeat([]byte("#padding\n"), 8192)...)
	half := make(chan struct{})
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(len(newBin)))
		_, _ = w.Write(newBin[:len(newBin)/2])
		w.(http.Flusher).Flush()
		close(half)
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperUpgrade$")
	cmd.Env = append(os.Environ(), "UPGRADE_HELPER=1", "UPGRADE_PATH="+f.path, "UPGRADE_DATA="+f.data,
		"UPGRADE_URL="+srv.URL, "UPGRADE_SUM="+sum(newBin), fmt.Sprintf("UPGRADE_SIZE=%d", len(newBin)))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-half:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("helper never fetched the release:\n%s", out.String())
	}
	// Half the release is in the helper's staging file: kill it there.
	deadline := time.Now().Add(10 * time.Second)
	staged := false
	for !staged && time.Now().Before(deadline) {
		ents, _ := os.ReadDir(filepath.Dir(f.path))
		for _, e := range ents {
			if info, err := e.Info(); err == nil && strings.Contains(e.Name(), ".staged-") && info.Size() > 0 {
				staged = true
			}
		}
		if !staged {
			time.Sleep(20 * time.Millisecond) // bounded poll of the helper's file
		}
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	if !staged {
		t.Fatalf("the helper wrote no staging file:\n%s", out.String())
	}
	if got := f.read(t, f.path); !bytes.Equal(got, f.old) {
		t.Fatalf("binary changed by a killed download")
	}
	if act, err := f.manager(t, "0.3.0").Resume(); act != Continue || err != nil {
		t.Fatalf("Resume: %v %v", act, err)
	}
	f.unchanged(t)
}

// TestHelperUpgrade is the process TestKilledMidDownload kills; it does
// nothing unless UPGRADE_HELPER is set.
func TestHelperUpgrade(t *testing.T) {
	if os.Getenv("UPGRADE_HELPER") != "1" {
		return
	}
	url := os.Getenv("UPGRADE_URL")
	m, err := New(Config{Path: os.Getenv("UPGRADE_PATH"), DataDir: os.Getenv("UPGRADE_DATA"), Program: "berth-agent", Version: "0.3.0",
		Fetch: func(ctx context.Context, _ string) (io.ReadCloser, error) {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return nil, err
			}
			return resp.Body, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	var size int64
	fmt.Sscan(os.Getenv("UPGRADE_SIZE"), &size)
	res := m.Upgrade(context.Background(), node.AgentUpgrade{Version: "0.4.0", Releases: []node.ReleaseFile{
		{Name: "berth-agent", Version: "0.4.0", OS: goruntime.GOOS, Arch: goruntime.GOARCH, SHA256: os.Getenv("UPGRADE_SUM"), Size: size}}})
	t.Fatalf("helper was not killed: %+v", res)
}

// TestRollBackUnconfirmedPlugin: a driver plugin swapped in that does not
// launch is put back before the agent starts it; the record is then
// settled, so a second failure does not loop.
func TestRollBackUnconfirmedPlugin(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "berth-plugin-process")
	data := filepath.Join(dir, "data")
	_ = os.MkdirAll(data, 0o700)
	old := script("berth-plugin-process", "0.4.0")
	if err := os.WriteFile(path, old, 0o755); err != nil {
		t.Fatal(err)
	}
	newBin := script("berth-plugin-process", "0.4.1")
	m, err := New(Config{Path: path, DataDir: data, Program: "berth-plugin-process", Version: "0.4.0", RestartGrace: time.Millisecond,
		Fetch: func(context.Context, string) (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(newBin)), nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	res := m.Upgrade(context.Background(), node.AgentUpgrade{Program: "berth-plugin-process", Version: "0.4.1", Releases: []node.ReleaseFile{
		{Name: "berth-plugin-process", Version: "0.4.1", OS: goruntime.GOOS, Arch: goruntime.GOARCH, SHA256: sum(newBin), Size: int64(len(newBin))}}})
	if res.Status != "ok" {
		t.Fatalf("plugin upgrade: %+v %+v", res, res.Error)
	}
	if _, err := os.Stat(filepath.Join(data, "upgrade-berth-plugin-process.json")); err != nil {
		t.Fatalf("plugin upgrade record: %v", err)
	}
	back, err := RollBackUnconfirmed(data, "berth-plugin-process", path, nil)
	if err != nil || !back {
		t.Fatalf("RollBackUnconfirmed = %v, %v; want a rollback", back, err)
	}
	if got, _ := os.ReadFile(path); !bytes.Equal(got, old) {
		t.Fatalf("plugin after the rollback: %q", got)
	}
	if back, err := RollBackUnconfirmed(data, "berth-plugin-process", path, nil); err != nil || back {
		t.Fatalf("second RollBackUnconfirmed = %v, %v; want nothing to do", back, err)
	}
}

// TestNetworkPluginSwapAndRollBack: the node's network plugin is upgraded in
// place beside its runtime driver plugin, in one plugin and one data
// directory (docs/upgrades.md section 3.5): its binary is swapped with its
// own .prev and record, the driver's is left alone, and each way the new
// network plugin can fail (it does not launch; it is not welcomed within the
// window) puts the previous binary back.
func TestNetworkPluginSwapAndRollBack(t *testing.T) {
	const nft, drv = "berth-plugin-nftables", "berth-plugin-process"
	newBin := script(nft, "0.4.1")
	type plugins struct{ dir, data, nftPath, drvPath string }
	manager := func(t *testing.T, p plugins, program, path, running string) *Manager {
		t.Helper()
		m, err := New(Config{Path: path, DataDir: p.data, Program: program, Version: running, RestartGrace: time.Millisecond,
			Fetch: func(_ context.Context, s string) (io.ReadCloser, error) {
				if s != sum(newBin) {
					return nil, errors.New("no such release")
				}
				return io.NopCloser(bytes.NewReader(newBin)), nil
			}})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	swapped := func(t *testing.T) plugins {
		t.Helper()
		dir := t.TempDir()
		p := plugins{dir: dir, data: filepath.Join(dir, "data"), nftPath: filepath.Join(dir, nft), drvPath: filepath.Join(dir, drv)}
		if err := os.MkdirAll(p.data, 0o700); err != nil {
			t.Fatal(err)
		}
		for path, b := range map[string][]byte{p.nftPath: script(nft, "0.4.0"), p.drvPath: script(drv, "0.4.0")} {
			if err := os.WriteFile(path, b, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		m := manager(t, p, nft, p.nftPath, "0.4.0")
		res := m.Upgrade(context.Background(), node.AgentUpgrade{Program: nft, Version: "0.4.1", Releases: []node.ReleaseFile{
			{Name: nft, Version: "0.4.1", OS: goruntime.GOOS, Arch: goruntime.GOARCH, SHA256: sum(newBin), Size: int64(len(newBin))}}})
		if res.Status != "ok" {
			t.Fatalf("network plugin upgrade: %+v %+v", res, res.Error)
		}
		if !restarted(m) {
			t.Fatal("no restart requested after the network plugin's swap")
		}
		if got, _ := os.ReadFile(p.nftPath); !bytes.Equal(got, newBin) {
			t.Fatalf("network plugin after the swap: %q", got)
		}
		if got, _ := os.ReadFile(p.nftPath + ".prev"); !bytes.Equal(got, script(nft, "0.4.0")) {
			t.Fatalf("network plugin .prev: %q", got)
		}
		if _, err := os.Stat(filepath.Join(p.data, "upgrade-"+nft+".json")); err != nil {
			t.Fatalf("network plugin record: %v", err)
		}
		// The driver plugin's manager, settling its own record at the
		// restart, neither sees nor touches the network plugin's.
		if act, err := manager(t, p, drv, p.drvPath, "0.4.0").Resume(); act != Continue || err != nil {
			t.Fatalf("driver plugin Resume beside a network upgrade: %v %v", act, err)
		}
		if _, err := os.Stat(filepath.Join(p.data, "upgrade-"+nft+".json")); err != nil {
			t.Fatalf("network plugin record after the driver's Resume: %v", err)
		}
		return p
	}
	driverUntouched := func(t *testing.T, p plugins) {
		t.Helper()
		if got, _ := os.ReadFile(p.drvPath); !bytes.Equal(got, script(drv, "0.4.0")) {
			t.Fatalf("driver plugin replaced: %q", got)
		}
		if _, err := os.Stat(p.drvPath + ".prev"); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("driver plugin .prev: %v", err)
		}
	}
	oldBack := func(t *testing.T, p plugins) {
		t.Helper()
		if got, _ := os.ReadFile(p.nftPath); !bytes.Equal(got, script(nft, "0.4.0")) {
			t.Fatalf("network plugin after the rollback: %q", got)
		}
		driverUntouched(t, p)
	}

	t.Run("confirmed", func(t *testing.T) {
		p := swapped(t)
		m := manager(t, p, nft, p.nftPath, "0.4.1")
		if act, err := m.Resume(); act != AwaitConfirm || err != nil {
			t.Fatalf("first start of the new network plugin: %v %v", act, err)
		}
		if err := m.Confirm(); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(p.data, "upgrade-"+nft+".json")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("record kept after the confirmation: %v", err)
		}
		if got, _ := os.ReadFile(p.nftPath); !bytes.Equal(got, newBin) {
			t.Fatal("confirmed network plugin replaced")
		}
		driverUntouched(t, p)
	})
	t.Run("does not launch", func(t *testing.T) {
		p := swapped(t)
		if back, err := RollBackUnconfirmed(p.data, drv, p.drvPath, nil); err != nil || back {
			t.Fatalf("driver RollBackUnconfirmed = %v, %v; want nothing to do", back, err)
		}
		if back, err := RollBackUnconfirmed(p.data, nft, p.nftPath, nil); err != nil || !back {
			t.Fatalf("RollBackUnconfirmed = %v, %v; want a rollback", back, err)
		}
		oldBack(t, p)
		if back, err := RollBackUnconfirmed(p.data, nft, p.nftPath, nil); err != nil || back {
			t.Fatalf("second RollBackUnconfirmed = %v, %v; want nothing to do", back, err)
		}
	})
	t.Run("window passed", func(t *testing.T) {
		p := swapped(t)
		m := manager(t, p, nft, p.nftPath, "0.4.1")
		if act, _ := m.Resume(); act != AwaitConfirm {
			t.Fatalf("first start: %v", act)
		}
		if act, err := m.RollBack(); act != Restart || err != nil {
			t.Fatalf("rollback: %v %v", act, err)
		}
		if !restarted(m) {
			t.Fatal("no restart after the rollback")
		}
		oldBack(t, p)
		if act, err := manager(t, p, nft, p.nftPath, "0.4.0").Resume(); act != Continue || err != nil {
			t.Fatalf("start of the previous network plugin: %v %v", act, err)
		}
	})
}
