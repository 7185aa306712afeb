// Package health runs the HTTP health probes of a node's running workloads and
// keeps each one's passing, failing or unknown state (docs/node-protocol.md section 6.3).
package health

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/berthhq/berth/abi/node"
)

// Defaults of a health check (section 6.3), from abi/node's, which the core shows policies.
const (
	DefaultPath         = node.DefaultHealthPath
	DefaultInterval     = node.DefaultHealthIntervalS * time.Second
	DefaultTimeout      = node.DefaultHealthTimeoutS * time.Second
	DefaultFailures     = node.DefaultHealthFailures
	DefaultFastInterval = time.Second
)

// Target is one probe: GET URL every Interval, each bounded by Timeout;
// Failures consecutive failures make it failing, one success passing. Until
// the first success it probes every FastInterval instead, so a fresh workload
// is seen passing quickly.
type Target struct {
	URL          string
	Interval     time.Duration
	FastInterval time.Duration
	Timeout      time.Duration
	Failures     int
}

// TargetFor returns the probe of a workload listening on addr ("host:port")
// with check; zero fields take the defaults.
func TargetFor(addr string, check node.HealthCheck) Target {
	check = check.WithDefaults()
	p := check.Path
	if p[0] != '/' {
		p = "/" + p
	}
	return Target{
		URL:          "http://" + addr + p,
		Interval:     time.Duration(check.IntervalS) * time.Second,
		FastInterval: DefaultFastInterval,
		Timeout:      time.Duration(check.TimeoutS) * time.Second,
		Failures:     check.Failures,
	}
}

// Tracker folds probe outcomes into a health value. The zero value is unknown
// with a threshold of DefaultFailures.
type Tracker struct {
	Threshold int // consecutive failures that make it failing; zero means DefaultFailures
	failures  int
	state     string
	passedAny bool
}

// Observe records one probe outcome and reports whether the health value changed.
func (t *Tracker) Observe(ok bool) bool {
	before := t.Health()
	if ok {
		t.failures = 0
		t.passedAny = true
		t.state = node.HealthPassing
	} else {
		t.failures++
		th := t.Threshold
		if th <= 0 {
			th = DefaultFailures
		}
		if t.failures >= th {
			t.state = node.HealthFailing
		}
	}
	return t.Health() != before
}

// Health is passing, failing or unknown (no verdict yet).
func (t *Tracker) Health() string {
	if t.state == "" {
		return node.HealthUnknown
	}
	return t.state
}

// PassedAny reports whether any probe has succeeded.
func (t *Tracker) PassedAny() bool { return t.passedAny }

// Config configures a Prober.
type Config struct {
	Client   *http.Client                    // nil means a client that follows no redirects and keeps no idle connections
	Logger   *slog.Logger                    // nil means slog.Default()
	OnChange func(workloadID, health string) // called from a probe goroutine when a health value changes; nil means none
}

// Prober runs one probe goroutine per workload. It is safe for concurrent use.
type Prober struct {
	cfg    Config
	mu     sync.Mutex
	probes map[string]*probe // mu must be held
	wg     sync.WaitGroup
}

type probe struct {
	target  Target
	cancel  context.CancelFunc
	mu      sync.Mutex
	tracker Tracker
	// fail is the last failed probe (mu must be held); Kind "" while the
	// probe has not failed since it last passed.
	fail node.Failure
}

// New returns a Prober with no targets.
func New(cfg Config) *Prober {
	if cfg.Client == nil {
		cfg.Client = &http.Client{
			Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil},
			CheckRedirect: func(*http.Request, []*http.Request) error {
				return http.ErrUseLastResponse
			},
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Prober{cfg: cfg, probes: map[string]*probe{}}
}

// Set starts probing workloadID at t, replacing (and resetting) an existing
// probe only when its target differs. The probe runs until Remove or Close.
func (p *Prober) Set(workloadID string, t Target) {
	if t.FastInterval <= 0 {
		t.FastInterval = DefaultFastInterval
	}
	if t.Interval <= 0 {
		t.Interval = DefaultInterval
	}
	if t.Timeout <= 0 {
		t.Timeout = DefaultTimeout
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if old, ok := p.probes[workloadID]; ok {
		if old.target == t {
			return
		}
		old.cancel()
	}
	ctx, cancel := context.WithCancel(context.Background())
	pr := &probe{target: t, cancel: cancel, tracker: Tracker{Threshold: t.Failures}}
	p.probes[workloadID] = pr
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.run(ctx, workloadID, pr)
	}()
}

// Remove stops probing workloadID; its health becomes unknown.
func (p *Prober) Remove(workloadID string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pr, ok := p.probes[workloadID]; ok {
		pr.cancel()
		delete(p.probes, workloadID)
	}
}

// IDs returns the workloads being probed.
func (p *Prober) IDs() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]string, 0, len(p.probes))
	for id := range p.probes {
		out = append(out, id)
	}
	return out
}

// Health returns the health of workloadID: unknown when it is not probed or
// has no verdict yet.
func (p *Prober) Health(workloadID string) string {
	p.mu.Lock()
	pr, ok := p.probes[workloadID]
	p.mu.Unlock()
	if !ok {
		return node.HealthUnknown
	}
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return pr.tracker.Health()
}

// Failure returns the failure of workloadID's probe while its health is
// failing (docs/node-protocol.md section 5.3.1): kind probe, the URL, the
// HTTP status it answered (0 when it did not answer, with the error as
// message), when the current run of failed probes began, and how many times
// the probe went failing since it was set. nil while the workload is not
// probed or not failing.
func (p *Prober) Failure(workloadID string) *node.Failure {
	p.mu.Lock()
	pr, ok := p.probes[workloadID]
	p.mu.Unlock()
	if !ok {
		return nil
	}
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.tracker.Health() != node.HealthFailing || pr.fail.Kind == "" {
		return nil
	}
	f := pr.fail
	return &f
}

// Close stops every probe and waits for their goroutines.
func (p *Prober) Close() {
	p.mu.Lock()
	for id, pr := range p.probes {
		pr.cancel()
		delete(p.probes, id)
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Prober) run(ctx context.Context, id string, pr *probe) {
	timer := time.NewTimer(0) // the first probe right away
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		status, err := p.check(ctx, pr.target)
		if ctx.Err() != nil {
			return
		}
		pr.mu.Lock()
		changed := pr.tracker.Observe(err == nil)
		h := pr.tracker.Health()
		if err == nil {
			pr.fail.Kind = ""
		} else {
			if pr.fail.Kind == "" {
				pr.fail = node.Failure{Kind: node.FailureProbe, ProbeURL: pr.target.URL, At: time.Now().UTC(), Count: pr.fail.Count}
			}
			pr.fail.ProbeStatus, pr.fail.Message = status, ""
			if status == 0 {
				pr.fail.Message = err.Error()
			}
			if changed && h == node.HealthFailing {
				pr.fail.Count++ // counts the times this run went failing, not each probe
			}
		}
		next := pr.target.Interval
		if !pr.tracker.PassedAny() {
			next = pr.target.FastInterval
		}
		pr.mu.Unlock()
		if changed {
			p.cfg.Logger.Info("workload health changed", "workload_id", id, "health", h, "probe_error", errText(err))
			if p.cfg.OnChange != nil {
				p.cfg.OnChange(id, h)
			}
		}
		timer.Reset(next)
	}
}

// check probes t once: the HTTP status it answered (0 when none) and nil
// for a 2xx or 3xx answer.
func (p *Prober) check(ctx context.Context, t Target) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, t.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.URL, nil)
	if err != nil {
		return 0, fmt.Errorf("build probe request: %w", err)
	}
	req.Header.Set("User-Agent", "berth-agent-health")
	resp, err := p.cfg.Client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("probe %s: %w", t.URL, err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		return resp.StatusCode, fmt.Errorf("probe %s: status %d", t.URL, resp.StatusCode)
	}
	return resp.StatusCode, nil
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
