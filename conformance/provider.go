package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/pluginapi"
	providerv1 "github.com/berthhq/berth/abi/proto/provider/v1"
	"github.com/berthhq/berth/abi/provider"
)

// ProviderConfig says which provider to check and with what. Exactly one of
// Binary and Factory is set.
type ProviderConfig struct {
	// Binary is a built plugin. Each case launches it afresh over go-plugin
	// (subprocess mode), with a fresh state directory.
	Binary string
	// Args returns the binary's arguments for a case's state directory;
	// nil means none.
	Args func(stateDir string) []string
	// Factory returns a fresh provider on stateDir, served in process over a
	// real gRPC connection. Cases that need a process (handshake, crash,
	// durability) are skipped.
	Factory func(stateDir string) (provider.Provider, error)
	// PluginConfig is given to ValidateConfig and Configure; nil means {}.
	// Case validate_config expects it to be accepted.
	PluginConfig json.RawMessage
	// Samples are two desired states of one resource (same type and id,
	// different attributes) of a type the plugin advertises. Zero with a
	// Binary means the launch case takes them from Describe: the first
	// resource type that declares two examples (ExampleID and
	// ExampleAttributes), and says so; otherwise required.
	Samples [2]provider.Resource
	// Stderr receives the plugin's stderr in subprocess mode; nil discards it.
	Stderr io.Writer
	// Reset, when set, runs before every case (launch included) with the
	// case's name, and puts back in its first state whatever the plugin
	// keeps outside its state directory: the zone of a DNS server, the
	// databases of a shared server, a vendor's test account. An error
	// fails the case without running it. The CLI's --reset-command runs a
	// shell command here (docs/plugins.md 6.3).
	Reset func(ctx context.Context, caseName string) error
	// RequireCapabilities names capabilities (of [ProviderCapabilities])
	// whose cases must run: a case skipped because the plugin does not
	// advertise one of them fails instead. The CLI's --require-capability.
	RequireCapabilities []string
}

func (c ProviderConfig) validate() error {
	if (c.Binary == "") == (c.Factory == nil) {
		return errors.New("conformance: set exactly one of Binary and Factory")
	}
	if err := checkRequired("provider", c.RequireCapabilities, ProviderCapabilities); err != nil {
		return err
	}
	if c.Binary != "" && c.noSamples() {
		return nil // from Describe, in the launch case
	}
	if c.Factory != nil && c.noSamples() {
		return errors.New("conformance: Samples are required with a Factory (only a Binary takes them from Describe's examples): give two different states of one resource (same type and id)")
	}
	return checkSamples(c.Samples)
}

// noSamples reports whether c gives no samples at all.
func (c ProviderConfig) noSamples() bool {
	return c.Samples[0].Type == "" && c.Samples[0].ID == "" && c.Samples[1].Type == "" && c.Samples[1].ID == ""
}

func checkSamples(s [2]provider.Resource) error {
	a, b := s[0], s[1]
	if a.Type == "" || a.ID == "" || a.Type != b.Type || a.ID != b.ID || a.Equal(b) {
		return errors.New("conformance: Samples must be two different states of one resource (same type and id)")
	}
	return nil
}

var providerKind = kind{
	cookie:  pluginapi.ProviderCookieValue,
	name:    pluginapi.ProviderPluginName,
	version: provider.APIVersion,
	newClient: func(life context.Context, conn grpc.ClientConnInterface) any {
		return provider.NewClient(life, conn)
	},
	register: func(s *grpc.Server, impl any) {
		providerv1.RegisterProviderServer(s, provider.NewServer(impl.(provider.Provider)))
	},
}

// RunProvider runs the provider suite as subtests of t and returns the
// report of what they did: each case's outcome and messages, and for a case
// skipped because the plugin does not advertise a capability, that
// capability ([Result.Capability], [Report.SkippedForCapability]). It fails
// t at once when cfg is invalid.
func RunProvider(t *testing.T, cfg ProviderConfig) *Report {
	t.Helper()
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	return &Report{Suite: "provider", Plugin: cfg.Binary, Results: runTesting(t, cfg.cases())}
}

// CheckProvider runs the provider suite on cfg outside `go test` and
// returns the report; the error is for an invalid cfg only.
func CheckProvider(ctx context.Context, cfg ProviderConfig) (*Report, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return runReport(ctx, "provider", cfg.Binary, cfg.cases()), nil
}

// cases are the suite's cases for cfg: on a binary, the launch case first
// (docs/plugins.md section 6), which also takes the samples from Describe
// when cfg has none.
func (cfg ProviderConfig) cases() []testCase {
	pc := &cfg
	if cfg.Binary == "" {
		return cfg.withReset(providerCases(pc))
	}
	return gated(func(t T) error {
		if err := cfg.reset(t, "launch"); err != nil {
			return err
		}
		var args []string
		if cfg.Args != nil {
			args = cfg.Args(t.TempDir())
		}
		in, err := startBinary(t, cfg.Binary, args, providerKind, providerKind.cookie, cfg.Stderr)
		if err != nil {
			return err
		}
		defer in.client.Kill()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		if err := checkConfigAccepted(ctx, in, cfg.PluginConfig); err != nil {
			return err
		}
		if !pc.noSamples() {
			return nil
		}
		d, err := in.raw.(*provider.Client).Describe(ctx)
		if err != nil {
			return fmt.Errorf("no samples were given, so the suite asked Describe for examples: %w", err)
		}
		for _, rt := range d.Capabilities.ResourceTypes {
			smp, ok := rt.Examples()
			if !ok {
				continue
			}
			if err := checkSamples(smp); err != nil {
				return fmt.Errorf("the examples Describe declares for %s: %w", rt.Name, err)
			}
			pc.Samples = smp
			t.Logf("no samples were given: the suite uses the first two examples Describe declares for %s (id %s):\n  %s\n  %s",
				rt.Name, rt.ExampleID, smp[0].Attributes, smp[1].Attributes)
			return nil
		}
		return fmt.Errorf("no samples were given, and Describe declares no resource type with two examples " +
			"(ResourceType.ExampleID and ExampleAttributes); declare them, or pass two states of one resource " +
			"(--samples FILE, or ProviderConfig.Samples)")
	}, cfg.withReset(providerCases(pc)))
}

// resetBudget bounds one run of ProviderConfig.Reset.
const resetBudget = 2 * time.Minute

// reset runs cfg.Reset, when set, before the case named name.
func (cfg ProviderConfig) reset(t T, name string) error {
	if cfg.Reset == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(t.Context(), resetBudget)
	defer cancel()
	if err := cfg.Reset(ctx, name); err != nil {
		return &resetError{err: fmt.Errorf("the reset before case %s (--reset-command, or ProviderConfig.Reset) failed, so the case did not run: %w", name, err)}
	}
	return nil
}

// withReset makes each case run cfg.Reset first (launch runs it itself).
func (cfg ProviderConfig) withReset(cases []testCase) []testCase {
	if cfg.Reset == nil {
		return cases
	}
	out := make([]testCase, len(cases))
	for i, c := range cases {
		out[i] = testCase{name: c.name, run: func(t T) {
			if err := cfg.reset(t, c.name); err != nil {
				t.Fatalf("%v", err)
			}
			c.run(t)
		}}
	}
	return out
}

// checkConfigAccepted gives config ({} when empty) to the launched
// provider's ValidateConfig and Configure, as every case does, and returns a
// *configRefusedError saying why when the plugin refuses it.
func checkConfigAccepted(ctx context.Context, in *instance, config json.RawMessage) error {
	conf := &provider.ConfigRequest{Config: config, APIVersion: in.negotiated}
	if len(conf.Config) == 0 {
		conf.Config = json.RawMessage("{}")
	}
	p := in.raw.(*provider.Client)
	shown := strings.TrimSpace(string(conf.Config)) // without a file's final newline
	refused := func(why string) error {
		return &configRefusedError{err: fmt.Errorf("the plugin refused the configuration (--config, or ProviderConfig.PluginConfig), "+
			"so no case can run; every other case is skipped:\n%s", why)}
	}
	v, err := p.ValidateConfig(ctx, conf)
	switch {
	case err != nil:
		return refused(failure("ValidateConfig with "+shown, "no problems", gotErr(err)))
	case len(v.Problems) > 0:
		return refused(failure("ValidateConfig with "+shown, "no problems", fmt.Sprintf("problems %q", v.Problems)))
	}
	if err := p.Configure(ctx, conf); err != nil {
		return refused(failure("Configure with "+shown, "success", gotErr(err)))
	}
	return nil
}

// ProviderCaseNames lists the provider suite's cases in order.
func ProviderCaseNames() []string {
	var out []string
	for _, c := range providerCases(&ProviderConfig{}) {
		out = append(out, c.name)
	}
	return out
}

// provSession is one launched provider of a case.
type provSession struct {
	cfg      ProviderConfig
	in       *instance
	p        *provider.Client
	stateDir string
	next     uint64 // for fresh idempotency keys
}

// launch starts the provider on stateDir and configures it as a host would.
func (cfg ProviderConfig) launch(t T, stateDir string) *provSession {
	t.Helper()
	var in *instance
	var err error
	if cfg.Factory != nil {
		var impl provider.Provider
		if impl, err = cfg.Factory(stateDir); err != nil {
			t.Fatalf("factory: %v", err)
		}
		if c, ok := impl.(interface{ Close() error }); ok {
			t.Cleanup(func() { _ = c.Close() })
		}
		in, err = startInProcess(t, impl, providerKind)
	} else {
		var args []string
		if cfg.Args != nil {
			args = cfg.Args(stateDir)
		}
		in, err = startBinary(t, cfg.Binary, args, providerKind, providerKind.cookie, cfg.Stderr)
	}
	if err != nil {
		t.Fatalf("launch: %v", err)
	}
	s := &provSession{cfg: cfg, in: in, p: in.raw.(*provider.Client), stateDir: stateDir}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	conf := &provider.ConfigRequest{Config: cfg.PluginConfig, APIVersion: in.negotiated}
	if len(conf.Config) == 0 {
		conf.Config = json.RawMessage("{}")
	}
	v, err := s.p.ValidateConfig(ctx, conf)
	if err != nil {
		t.Fatalf("%s", failure("ValidateConfig with the configuration, at launch", "no problems", gotErr(err)))
	}
	if len(v.Problems) > 0 {
		t.Fatalf("%s", failure("ValidateConfig with the configuration "+string(conf.Config)+", at launch", "no problems", fmt.Sprintf("problems %q", v.Problems)))
	}
	if err := s.p.Configure(ctx, conf); err != nil {
		t.Fatalf("%s", failure("Configure with the configuration "+string(conf.Config)+", at launch", "success", gotErr(err)))
	}
	return s
}

func (s *provSession) ctx(t T) context.Context {
	// A guard against hangs, not a contract check: generous, so a loaded
	// machine does not fail a correct plugin (deadlines are checked apart).
	ctx, cancel := context.WithTimeout(t.Context(), callBudget)
	t.Cleanup(cancel)
	return ctx
}

func (s *provSession) key(prefix string) string {
	s.next++
	return fmt.Sprintf("conformance-%s-%d", prefix, s.next)
}

// apply plans desired over current and applies the plan.
func (s *provSession) apply(t T, desired provider.Resource, current *provider.Resource, key string, token uint64) (provider.Resource, provider.Resource, error) {
	t.Helper()
	plan, err := s.p.Plan(s.ctx(t), &provider.PlanRequest{Desired: desired, Current: current})
	if err != nil {
		t.Fatalf("%s", failure("Plan "+show(desired), "a plan", gotErr(err)))
	}
	r, err := s.p.Apply(s.ctx(t), &provider.ApplyRequest{Planned: plan.Planned, Mutation: pluginapi.Mutation{IdempotencyKey: key, FencingToken: token}})
	if err != nil {
		return plan.Planned, provider.Resource{}, err
	}
	return plan.Planned, r.State, nil
}

func (s *provSession) mustApply(t T, desired provider.Resource, current *provider.Resource, key string, token uint64) provider.Resource {
	t.Helper()
	_, st, err := s.apply(t, desired, current, key, token)
	if err != nil {
		t.Fatalf("%s", failure(fmt.Sprintf("Apply the plan of %s (fencing token %d)", show(desired), token), "success", gotErr(err)))
	}
	return st
}

func (s *provSession) read(t T, r provider.Resource) (provider.Resource, error) {
	t.Helper()
	out, err := s.p.Read(s.ctx(t), &provider.ReadRequest{Type: r.Type, ID: r.ID})
	if err != nil {
		return provider.Resource{}, err
	}
	return out.State, nil
}

func show(r provider.Resource) string { return fmt.Sprintf("%s/%s %s", r.Type, r.ID, r.Attributes) }

// readGot describes what a Read returned.
func readGot(r provider.Resource, err error) string {
	if err != nil {
		return gotErr(err)
	}
	return show(r)
}

func typeNames(ts []provider.ResourceType) []string {
	var out []string
	for _, t := range ts {
		out = append(out, t.Name)
	}
	return out
}

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

func providerCases(cfg *ProviderConfig) []testCase {
	// The samples are read when each case starts: the launch case may have
	// taken them from Describe.
	var a, b provider.Resource
	needProcess := func(t T) {
		if cfg.Factory != nil {
			t.Skipf("needs a plugin process; run the suite on the binary")
		}
	}
	cases := []testCase{
		{"handshake", func(t T) {
			needProcess(t)
			s := cfg.launch(t, t.TempDir())
			if s.in.negotiated != provider.APIVersion {
				t.Errorf("%s", failure("the go-plugin handshake", fmt.Sprintf("API version %d negotiated", provider.APIVersion), fmt.Sprintf("version %d", s.in.negotiated)))
			}
			if _, err := startBinary(t, cfg.Binary, nil, providerKind, pluginapi.RuntimeCookieValue, nil); err == nil {
				t.Errorf("%s", failure("a handshake with the runtime drivers' cookie", "the plugin refuses another kind's cookie", "the handshake completed"))
			}
		}},
		{"describe", func(t T) {
			s := cfg.launch(t, t.TempDir())
			d, err := s.p.Describe(s.ctx(t))
			if err != nil {
				t.Fatalf("%s", failure("Describe", "a description", gotErr(err)))
			}
			if !dnsLabel.MatchString(d.Name) {
				t.Errorf("%s", failure("Describe", "a name that is a DNS label", fmt.Sprintf("name %q", d.Name)))
			}
			if d.Version == "" {
				t.Errorf("%s", failure("Describe", "a version", "none"))
			}
			if !slices.Contains(d.APIVersions, s.in.negotiated) {
				t.Errorf("%s", failure("Describe", fmt.Sprintf("API versions listing the negotiated %d", s.in.negotiated), fmt.Sprintf("%v", d.APIVersions)))
			}
			if !slices.ContainsFunc(d.Capabilities.ResourceTypes, func(rt provider.ResourceType) bool { return rt.Name == a.Type }) {
				t.Errorf("%s", failure("Describe", fmt.Sprintf("the samples' resource type %q among the advertised ones", a.Type), fmt.Sprintf("%v", typeNames(d.Capabilities.ResourceTypes))))
			}
		}},
		{"health", func(t T) { checkHealth(t, cfg.launch(t, t.TempDir()).p) }},
		{"validate_config", func(t T) {
			s := cfg.launch(t, t.TempDir())
			valid := cfg.PluginConfig
			if len(valid) == 0 {
				valid = json.RawMessage("{}")
			}
			v, err := s.p.ValidateConfig(s.ctx(t), &provider.ConfigRequest{Config: valid, APIVersion: s.in.negotiated})
			switch {
			case err != nil:
				t.Errorf("%s", failure("ValidateConfig with the given configuration "+string(valid), "no problems", gotErr(err)))
			case len(v.Problems) > 0:
				t.Errorf("%s", failure("ValidateConfig with the given configuration "+string(valid), "no problems", fmt.Sprintf("problems %q", v.Problems)))
			}
			v, err = s.p.ValidateConfig(s.ctx(t), &provider.ConfigRequest{Config: json.RawMessage(`[1,2]`), APIVersion: s.in.negotiated})
			if err == nil && len(v.Problems) == 0 {
				t.Errorf("%s", failure("ValidateConfig with [1,2], not a JSON object", "problems, or an error", "accepted"))
			}
		}},
		{"plan_equals_apply", func(t T) {
			s := cfg.launch(t, t.TempDir())
			plan, err := s.p.Plan(s.ctx(t), &provider.PlanRequest{Desired: a})
			if err != nil {
				t.Fatalf("%s", failure("Plan "+show(a)+", which does not exist", "a plan", gotErr(err)))
			}
			if !plan.Changes {
				t.Errorf("%s", failure("Plan "+show(a)+", which does not exist", "changes", "no changes"))
			}
			r, err := s.p.Apply(s.ctx(t), &provider.ApplyRequest{Planned: plan.Planned, Mutation: pluginapi.Mutation{IdempotencyKey: s.key("a"), FencingToken: 1}})
			if err != nil {
				t.Fatalf("%s", failure("Apply the plan "+show(plan.Planned), "success", gotErr(err)))
			}
			if !r.State.Equal(plan.Planned) {
				t.Errorf("%s", failure("Apply the plan "+show(plan.Planned), "the planned state", show(r.State)))
			}
			got, err := s.read(t, a)
			if err != nil {
				t.Fatalf("%s", failure("Read "+a.Type+"/"+a.ID+" after Apply", show(r.State), gotErr(err)))
			}
			if !got.Equal(r.State) {
				t.Errorf("%s", failure("Read "+a.Type+"/"+a.ID+" after Apply", show(r.State), show(got)))
			}
		}},
		{"repeated_plan_no_changes", func(t T) {
			s := cfg.launch(t, t.TempDir())
			st := s.mustApply(t, a, nil, s.key("a"), 1)
			plan, err := s.p.Plan(s.ctx(t), &provider.PlanRequest{Desired: a, Current: &st})
			if err != nil {
				t.Fatalf("%s", failure("Plan "+show(a)+" again over its applied state", "a plan", gotErr(err)))
			}
			if plan.Changes || !plan.Planned.Equal(st) {
				t.Errorf("%s", failure("Plan "+show(a)+" again over its applied state", "no changes, planned "+show(st), fmt.Sprintf("changes=%v, planned %s", plan.Changes, show(plan.Planned))))
			}
		}},
		{"idempotent_apply", func(t T) {
			s := cfg.launch(t, t.TempDir())
			key := s.key("a")
			plan, first, err := s.apply(t, a, nil, key, 1)
			if err != nil {
				t.Fatalf("%s", failure("Apply "+show(a), "success", gotErr(err)))
			}
			again, err := s.p.Apply(s.ctx(t), &provider.ApplyRequest{Planned: plan, Mutation: pluginapi.Mutation{IdempotencyKey: key, FencingToken: 1}})
			if err != nil {
				t.Fatalf("%s", failure("Apply again with the same idempotency key", "the recorded result "+show(first), gotErr(err)))
			}
			if !again.State.Equal(first) {
				t.Errorf("%s", failure("Apply again with the same idempotency key", "the recorded result "+show(first), show(again.State)))
			}
			stB := s.mustApply(t, b, &first, s.key("b"), 1)
			// A late replay of the first call must return its recorded
			// result and leave the newer state alone.
			late, err := s.p.Apply(s.ctx(t), &provider.ApplyRequest{Planned: plan, Mutation: pluginapi.Mutation{IdempotencyKey: key, FencingToken: 1}})
			if err != nil {
				t.Fatalf("%s", failure("replay the first Apply after a newer one", "the recorded result "+show(first), gotErr(err)))
			}
			if !late.State.Equal(first) {
				t.Errorf("%s", failure("replay the first Apply after a newer one", "the recorded result "+show(first), show(late.State)))
			}
			got, err := s.read(t, a)
			if err != nil {
				t.Fatalf("%s", failure("Read after the late replay", "the newer state "+show(stB), gotErr(err)))
			}
			if !got.Equal(stB) {
				t.Errorf("%s", failure("Read after the late replay", "the newer state "+show(stB), show(got)))
			}
		}},
		{"stale_fencing_token", func(t T) {
			s := cfg.launch(t, t.TempDir())
			stA := s.mustApply(t, a, nil, s.key("a"), 10)
			_, _, err := s.apply(t, b, &stA, s.key("b"), 5)
			if err == nil {
				t.Errorf("%s", failure("Apply "+show(b)+" with fencing token 5 after 10", "a refusal of code stale_fencing_token", "success"))
			} else if !errors.Is(err, pluginapi.ErrStaleFencingToken) {
				t.Errorf("%s", failure("Apply "+show(b)+" with fencing token 5 after 10", "a refusal of code "+string(abierrors.StaleFencingToken), gotErr(err)))
			}
			_, err = s.p.Delete(s.ctx(t), &provider.DeleteRequest{Type: a.Type, ID: a.ID, Mutation: pluginapi.Mutation{IdempotencyKey: s.key("d"), FencingToken: 4}})
			if err == nil {
				t.Errorf("%s", failure("Delete "+a.Type+"/"+a.ID+" with fencing token 4 after 10", "a refusal of code stale_fencing_token", "success"))
			} else if !errors.Is(err, pluginapi.ErrStaleFencingToken) {
				t.Errorf("%s", failure("Delete "+a.Type+"/"+a.ID+" with fencing token 4 after 10", "a refusal of code "+string(abierrors.StaleFencingToken), gotErr(err)))
			}
			got, err := s.read(t, a)
			if err != nil {
				t.Fatalf("%s", failure("Read "+a.Type+"/"+a.ID+" after the refused Apply and Delete", "the state applied with token 10, "+show(stA), gotErr(err)))
			}
			if !got.Equal(stA) {
				t.Errorf("%s", failure("Read "+a.Type+"/"+a.ID+" after the refused Apply and Delete", "the state applied with token 10, "+show(stA), show(got)))
			}
		}},
		{"delete_then_read", func(t T) {
			s := cfg.launch(t, t.TempDir())
			s.mustApply(t, a, nil, s.key("a"), 1)
			if _, err := s.p.Delete(s.ctx(t), &provider.DeleteRequest{Type: a.Type, ID: a.ID, Mutation: pluginapi.Mutation{IdempotencyKey: s.key("d"), FencingToken: 2}}); err != nil {
				t.Fatalf("%s", failure("Delete "+a.Type+"/"+a.ID, "success", gotErr(err)))
			}
			if got, err := s.read(t, a); !errors.Is(err, provider.ErrNotFound) {
				t.Errorf("%s", failure("Read "+a.Type+"/"+a.ID+" after Delete", "an error of code not_found", readGot(got, err)))
			}
			if _, err := s.p.Delete(s.ctx(t), &provider.DeleteRequest{Type: a.Type, ID: a.ID, Mutation: pluginapi.Mutation{IdempotencyKey: s.key("d"), FencingToken: 2}}); err != nil {
				t.Errorf("%s", failure("Delete "+a.Type+"/"+a.ID+" again, now absent", "success", gotErr(err)))
			}
		}},
		{"deadline", func(t T) {
			s := cfg.launch(t, t.TempDir())
			checkDeadline(t, func(ctx context.Context) error {
				_, err := s.p.Plan(ctx, &provider.PlanRequest{Desired: a})
				return err
			})
		}},
		{"crash_mid_call", func(t T) {
			needProcess(t)
			s := cfg.launch(t, t.TempDir())
			checkCrash(t, s.in, s.p, func(ctx context.Context) error {
				_, err := s.p.Read(ctx, &provider.ReadRequest{Type: a.Type, ID: a.ID})
				return err
			})
		}},
		{"durable_state", func(t T) {
			dir := t.TempDir()
			s := cfg.launch(t, dir)
			d, err := s.p.Describe(s.ctx(t))
			if err != nil {
				t.Fatalf("Describe: %v", err)
			}
			needCapability(t, cfg.RequireCapabilities, "durable_state", d.Capabilities.DurableState)
			needProcess(t)
			stA := s.mustApply(t, a, nil, s.key("a"), 7)
			if err := s.in.crash(); err != nil {
				t.Fatalf("kill the plugin: %v", err)
			}
			<-s.p.Done()
			s2 := cfg.launch(t, dir)
			got, err := s2.read(t, a)
			if err != nil {
				t.Fatalf("%s", failure("Read "+a.Type+"/"+a.ID+" after a kill and relaunch", show(stA), gotErr(err)))
			}
			if !got.Equal(stA) {
				t.Errorf("%s", failure("Read "+a.Type+"/"+a.ID+" after a kill and relaunch", show(stA), show(got)))
			}
			if _, _, err := s2.apply(t, b, &stA, s2.key("b"), 6); !errors.Is(err, pluginapi.ErrStaleFencingToken) {
				t.Errorf("%s", failure("after a relaunch, Apply "+show(b)+" with fencing token 6 after 7", "a refusal of code stale_fencing_token", gotErr(err)))
			}
		}},
	}
	for i := range cases {
		run := cases[i].run
		cases[i].run = func(t T) {
			a, b = cfg.Samples[0], cfg.Samples[1]
			run(t)
		}
	}
	return cases
}

// checkHealth expects a first valid report at once.
func checkHealth(t T, h pluginapi.HealthReporter) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ch, err := h.Health(ctx)
	if err != nil {
		t.Fatalf("Health: %v", err)
	}
	select {
	case r, ok := <-ch:
		if !ok {
			t.Fatalf("Health stream ended without a report")
		}
		if !r.State.Valid() {
			t.Errorf("Health reported state %q; want healthy, unhealthy or undetected", r.State)
		}
		if r.State != pluginapi.Healthy && r.Description == "" {
			t.Errorf("Health reported %s without a description", r.State)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("no Health report within 5 s")
	}
}

// callBudget bounds each call of the suite so a hung plugin fails its case.
const callBudget = 60 * time.Second

// deadlineSlack is how late past its deadline a call may return: scheduling
// on a loaded machine, not plugin work.
const deadlineSlack = 2 * time.Second

// checkDeadline expects a call under an expired deadline to fail with
// DeadlineExceeded at once, and a call under a short deadline to return by it.
func checkDeadline(t T, call func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithDeadline(t.Context(), time.Now().Add(-time.Second))
	defer cancel()
	start := time.Now()
	err := call(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("call under an expired deadline: %v; want DeadlineExceeded", err)
	}
	if d := time.Since(start); d > deadlineSlack {
		t.Errorf("call under an expired deadline took %s", d)
	}
	ctx2, cancel2 := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel2()
	start = time.Now()
	_ = call(ctx2)
	if d := time.Since(start); d > 2*time.Second+deadlineSlack {
		t.Errorf("call under a 2 s deadline returned after %s", d)
	}
}

// checkCrash kills the plugin under an open Health stream and expects the
// stream to end and a following call to fail, both promptly.
func checkCrash(t T, in *instance, h pluginapi.HealthReporter, call func(ctx context.Context) error) {
	t.Helper()
	ch, err := h.Health(t.Context())
	if err != nil {
		t.Fatalf("Health: %v", err)
	}
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatalf("no first Health report")
	}
	if err := in.crash(); err != nil {
		t.Fatalf("kill the plugin: %v", err)
	}
	ended := time.After(10 * time.Second)
	for done := false; !done; {
		select {
		case _, ok := <-ch:
			done = !ok
		case <-ended:
			t.Fatalf("the Health stream did not end within 10 s of the plugin's crash")
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	start := time.Now()
	if err := call(ctx); err == nil {
		t.Errorf("a call to a crashed plugin succeeded")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("a call to a crashed plugin took %s to fail", d)
	}
}
