package plugin_test

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/berthhq/berth/abi/pluginapi"
	"github.com/berthhq/berth/host/plugin"
	"github.com/berthhq/berth/internal/clocktest"
)

// TestStatusCollectorFollowsHealthAndRestarts: the collector exports a real plugin's health
// and counts its restart after an unhealthy window ran out.
func TestStatusCollectorFollowsHealthAndRestarts(t *testing.T) {
	t.Parallel()
	clock := clocktest.New(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	p := launchHealthPlugin(t, clock, 5)
	reg := prometheus.NewRegistry()
	reg.MustRegister(&plugin.StatusCollector{List: func() []plugin.Status { return []plugin.Status{p.Status()} }})
	waitFor(t, 10*time.Second, "healthy", func() bool { return p.Status().Health == pluginapi.Healthy })

	kind := string(p.Status().Kind)
	want := func(health string, restarts int) string {
		var b strings.Builder
		b.WriteString("# HELP berth_plugin_health Health a plugin reports on its Health stream: 1 for the current one.\n# TYPE berth_plugin_health gauge\n")
		for _, h := range []string{"healthy", "undetected", "unhealthy", "unknown"} {
			v := "0"
			if h == health {
				v = "1"
			}
			b.WriteString(`berth_plugin_health{health="` + h + `",kind="` + kind + `",plugin="health"} ` + v + "\n")
		}
		b.WriteString("# HELP berth_plugin_restarts_total Relaunches of a plugin process after its first launch.\n# TYPE berth_plugin_restarts_total counter\n")
		b.WriteString(`berth_plugin_restarts_total{kind="` + kind + `",plugin="health"} ` + string(rune('0'+restarts)) + "\n")
		return b.String()
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want("healthy", 0)), "berth_plugin_health", "berth_plugin_restarts_total"); err != nil {
		t.Fatal(err)
	}

	if err := syscall.Kill(p.PID(), syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "unhealthy", func() bool { return p.Status().Health == pluginapi.Unhealthy })
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want("unhealthy", 0)), "berth_plugin_health", "berth_plugin_restarts_total"); err != nil {
		t.Fatal(err)
	}
	clock.Advance(31 * time.Second)
	waitFor(t, 20*time.Second, "relaunched and healthy", func() bool {
		st := p.Status()
		return st.Launches == 2 && st.Health == pluginapi.Healthy
	})
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want("healthy", 1)), "berth_plugin_health", "berth_plugin_restarts_total"); err != nil {
		t.Fatal(err)
	}
}
