package plugin_test

import (
	"context"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/pluginapi"
	"github.com/berthhq/berth/host/plugin"
	"github.com/berthhq/berth/internal/clocktest"
)

// launchHealthPlugin starts testdata/provider-health with args on a manual clock.
func launchHealthPlugin(t *testing.T, clock *clocktest.Clock, crashLimit int, args ...string) *plugin.Provider {
	t.Helper()
	logger, _ := testLogger(t)
	path := filepath.Join(binDir, "provider-health")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := plugin.LaunchProvider(ctx, plugin.Config{
		Name:       "health",
		Path:       path,
		SHA256:     sha256File(t, path),
		Args:       append([]string{"--state-dir", t.TempDir()}, args...),
		Logger:     logger,
		MinBackoff: 5 * time.Millisecond,
		MaxBackoff: 10 * time.Millisecond,
		CrashLimit: crashLimit,
		Now:        clock.Now,
		// UnhealthyWindow left zero: the default, 30 s on the manual clock.
	})
	if err != nil {
		t.Fatalf("LaunchProvider: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// TestUnhealthyPluginRestartedAfterWindow: a plugin that reports unhealthy
// without a break for longer than the unhealthy window is killed and relaunched
// through the crash path, and such restarts count toward quarantine; a healthy
// report in between starts the window again (docs/plugins.md section 2).
func TestUnhealthyPluginRestartedAfterWindow(t *testing.T) {
	t.Parallel()
	clock := clocktest.New(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	p := launchHealthPlugin(t, clock, 2)
	waitFor(t, 10*time.Second, "healthy", func() bool { return p.Status().Health == pluginapi.Healthy })

	signal := func(sig syscall.Signal) {
		t.Helper()
		if err := syscall.Kill(p.PID(), sig); err != nil {
			t.Fatal(err)
		}
	}
	unhealthySince := func(want time.Time) func() bool {
		return func() bool {
			st := p.Status()
			return st.Health == pluginapi.Unhealthy && st.UnhealthySince != nil && st.UnhealthySince.Equal(want)
		}
	}

	// Unhealthy for 20 s, healthy again, unhealthy again: the window restarts.
	signal(syscall.SIGUSR1)
	waitFor(t, 10*time.Second, "unhealthy", unhealthySince(clock.Now()))
	clock.Advance(20 * time.Second)
	signal(syscall.SIGUSR2)
	waitFor(t, 10*time.Second, "healthy again", func() bool {
		st := p.Status()
		return st.Health == pluginapi.Healthy && st.UnhealthySince == nil
	})
	signal(syscall.SIGUSR1)
	waitFor(t, 10*time.Second, "unhealthy from a new start", unhealthySince(clock.Now()))
	if st := p.Status(); st.Launches != 1 || st.Crashes != 0 {
		t.Fatalf("Status before the window ran out = %+v; want the first process, no crash", st)
	}

	// Past the window: restarted as a crash, with the reason recorded.
	first := p.PID()
	clock.Advance(31 * time.Second)
	waitFor(t, 20*time.Second, "relaunched", func() bool { return p.Launches() == 2 && p.PID() != 0 })
	if processAlive(first) {
		t.Fatalf("the unhealthy process %d still runs after the relaunch", first)
	}
	st := p.Status()
	if st.Crashes != 1 || st.State != plugin.StateRunning || !strings.Contains(st.LastError, "unhealthy for longer than 30s") {
		t.Fatalf("Status after the unhealthy restart = %+v; want one crash, running, last error naming the window", st)
	}
	waitFor(t, 10*time.Second, "the new process healthy", func() bool { return p.Status().Health == pluginapi.Healthy })

	// A second unhealthy run reaches the crash limit (2): quarantined.
	signal(syscall.SIGUSR1)
	waitFor(t, 10*time.Second, "unhealthy again", unhealthySince(clock.Now()))
	second := p.PID()
	clock.Advance(31 * time.Second)
	waitFor(t, 20*time.Second, "quarantined", func() bool { return p.Status().State == plugin.StateQuarantined })
	if st := p.Status(); st.Launches != 2 || st.Crashes != 2 || st.PID != 0 || processAlive(second) {
		t.Fatalf("Status after the second unhealthy restart = %+v (process %d alive: %v); want quarantined after 2 launches", st, second, processAlive(second))
	}
}

// TestPluginWithoutHealthIsUndetected: a plugin whose Health call is
// Unimplemented is reported undetected, not healthy, and is never restarted
// for it (docs/plugins.md section 2).
func TestPluginWithoutHealthIsUndetected(t *testing.T) {
	t.Parallel()
	clock := clocktest.New(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	p := launchHealthPlugin(t, clock, 1, "--no-health")
	waitFor(t, 10*time.Second, "health reported", func() bool { return p.Status().Health != "" })
	st := p.Status()
	if st.Health != pluginapi.Undetected || st.HealthDescription == "" || st.UnhealthySince != nil {
		t.Fatalf("Status of a plugin without Health = %+v; want undetected with a description", st)
	}
	// Still answering: undetected says nothing about the plugin's calls.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if d, err := p.Describe(ctx); err != nil || d.Name != "hello" {
		t.Fatalf("Describe = %+v, %v", d, err)
	}
	clock.Advance(time.Hour)
	if _, err := p.Describe(ctx); err != nil {
		t.Fatalf("Describe after an hour of undetected health: %v", err)
	}
	if st := p.Status(); st.Launches != 1 || st.Crashes != 0 || st.Health != pluginapi.Undetected {
		t.Fatalf("Status = %+v; want the first process, undetected", st)
	}
}
