package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berthhq/berth/sdk/bundle"
	"github.com/berthhq/berth/sdk/client"
)

// liveRounds is how many rollouts BenchmarkDashboardLive watches converge.
const liveRounds = 5

// sseMessage is one message of a dashboard stream and when its last line arrived.
type sseMessage struct {
	data string
	at   time.Time
}

// readSSE sends every message of the event stream r on out, stamped at its arrival, until r
// ends.
func readSSE(r *bufio.Reader, out chan<- sseMessage) {
	defer close(out)
	var data strings.Builder
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		line = strings.TrimRight(line, "\r\n")
		switch {
		case line == "":
			if data.Len() > 0 {
				out <- sseMessage{data: data.String(), at: time.Now()}
				data.Reset()
			}
		case strings.HasPrefix(line, "data: "):
			data.WriteString(line[len("data: "):])
			data.WriteByte('\n')
		}
	}
}

// BenchmarkDashboardLive measures, with real processes (berthd on its embedded store, one
// berth-agent with the process driver, on loopback, examples/apps/hello as the workload), the
// time from a rollout's state change to an open dashboard page showing it: a service's page
// stream (/ui/stream/service, the region the browser swaps in) is open, the service's
// environment changes through the API (a rollout), and the figure is from the instant the
// reconciler recorded the rollout converged (the verdict's changed_at) to the arrival of the
// stream's message showing it converged at the new revision. liveRounds rollouts, one after
// another; it reports the median and the worst (goal: worst <= 1 s, bench/goals.tsv). The
// scenario runs once whatever b.N; run with -benchtime 1x.
func BenchmarkDashboardLive(b *testing.B) {
	bin := binaries(b)
	cl := startApplyCluster(b, bin, 1)
	ctx := context.Background()
	var buf bytes.Buffer
	if _, _, err := bundle.Create(ctx, helloBundle(b), &buf); err != nil {
		b.Fatal(err)
	}
	if _, err := cl.c.PushBundle(ctx, "default", "hello", &buf); err != nil {
		b.Fatal(err)
	}
	one := 1
	spec := client.ServiceSpec{Bundle: "hello", Command: []string{"./hello"}, Replicas: &one,
		HealthCheck: client.HealthCheck{Path: "/healthz", IntervalS: 1}}
	if _, err := cl.c.ApplyService(ctx, "default", "live", spec); err != nil {
		b.Fatal(err)
	}
	converged := func(rev int64) (bool, string) {
		s, err := cl.c.GetService(ctx, "default", "live")
		if err != nil {
			return false, err.Error()
		}
		if s.Verdict == nil {
			return false, "no verdict"
		}
		return s.Revision == rev && s.Verdict.State == "converged", fmt.Sprintf("revision %d %s", s.Revision, s.Verdict)
	}
	waitUntil(b, applyLimit, "live converged", func() (bool, string) { return converged(1) })

	// The page's stream, as the browser opens it: the session cookie carries the bearer.
	hc, err := client.PinnedHTTPClient(cl.fp)
	if err != nil {
		b.Fatal(err)
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, _ := http.NewRequestWithContext(sctx, http.MethodGet, cl.url+"/ui/stream/service?project=default&name=live", nil)
	req.Header.Set("Cookie", "__Host-berth_session="+cl.token)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := hc.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b.Fatalf("the service page's stream answered %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	msgs := make(chan sseMessage, 64)
	go readSSE(bufio.NewReader(resp.Body), msgs)

	b.ResetTimer()
	var lags []time.Duration
	for round := range liveRounds {
		rev := int64(round + 2)
		spec.Env = map[string]string{"ROUND": fmt.Sprint(round)}
		if _, err := cl.c.ApplyService(ctx, "default", "live", spec); err != nil {
			b.Fatal(err)
		}
		// The first message that shows the new revision converged.
		var shown time.Time
		deadline := time.After(applyLimit)
		for shown.IsZero() {
			select {
			case m, ok := <-msgs:
				if !ok {
					b.Fatalf("round %d: the stream ended", round)
				}
				if strings.Contains(m.data, fmt.Sprintf("Revision %d ·", rev)) && strings.Contains(m.data, `id="verdict">converged<`) {
					shown = m.at
				}
			case <-deadline:
				b.Fatalf("round %d: the page did not show revision %d converged within %s", round, rev, applyLimit)
			}
		}
		s, err := cl.c.GetService(ctx, "default", "live")
		if err != nil {
			b.Fatal(err)
		}
		if s.Revision != rev || s.Verdict == nil || s.Verdict.State != "converged" {
			b.Fatalf("round %d: the page showed revision %d converged, the API says revision %d %v", round, rev, s.Revision, s.Verdict)
		}
		lags = append(lags, shown.Sub(s.Verdict.ChangedAt))
	}
	b.StopTimer()
	slices.Sort(lags)
	b.ReportMetric(float64(lags[len(lags)/2].Microseconds())/1000, "state_to_page_p50_ms")
	b.ReportMetric(float64(lags[len(lags)-1].Microseconds())/1000, "state_to_page_max_ms")
	b.ReportMetric(0, "ns/op")
}
