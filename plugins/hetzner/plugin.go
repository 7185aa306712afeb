package hetzner

import (
	"context"
	"encoding/json"

	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hetznercloud/hcloud-go/v2/hcloud"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/pluginapi"
	"github.com/berthhq/berth/internal/version"
	"github.com/berthhq/berth/sdk/guard"
	"github.com/berthhq/berth/sdk/provider"
)

// idempotencyKeep is how long the records of applied mutations are kept.
const idempotencyKeep = 24 * time.Hour

// cleanupBudget bounds the deletion of a server whose create failed; it
// runs even when the caller's context has ended.
const cleanupBudget = 2 * time.Minute

// Plugin is the Hetzner Cloud provider (docs/plugins-hetzner.md). Apply and
// Delete are fenced and idempotent through sdk/guard, durably when the
// plugin has a state directory. Safe for concurrent use; Close ends its
// background work.
type Plugin struct {
	guards   *guard.Guards
	records  *records
	stateDir string
	log      *slog.Logger
	life     context.Context
	stop     context.CancelFunc

	mu   sync.Mutex
	conn *conn         // nil until Configure; mu must be held
	cfgd chan struct{} // closed at the first Configure; mu must be held
}

// conn is one configuration's API access: the client over the limiter, the
// poller and the catalog.
type conn struct {
	s       settings
	client  *hcloud.Client
	limiter *limiter
	poller  *poller
	catalog *catalog
}

var (
	_ provider.Provider        = (*Plugin)(nil)
	_ provider.Configurer      = (*Plugin)(nil)
	_ pluginapi.HealthReporter = (*Plugin)(nil)
)

// Open returns the plugin with its fencing, idempotency and machine
// records under stateDir (created 0700); an empty stateDir keeps them in
// memory. log receives a line per server created, adopted or deleted and
// per rate-limit pause (never the token or user data); nil discards.
func Open(stateDir string, log *slog.Logger) (*Plugin, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	g, err := guard.OpenPruned(stateDir, idempotencyKeep)
	if err != nil {
		return nil, fmt.Errorf("hetzner state directory: %w", err)
	}
	recs, err := openRecords(stateDir)
	if err != nil {
		return nil, err
	}
	life, stop := context.WithCancel(context.Background())
	return &Plugin{guards: g, records: recs, stateDir: stateDir, log: log, life: life, stop: stop, cfgd: make(chan struct{})}, nil
}

// Close ends the poller; waits in flight return an error.
func (p *Plugin) Close() error {
	p.stop()
	return nil
}

// Describe implements provider.Provider: name "hetzner", one resource type
// with two example states that differ in labels only (the one change made
// in place).
func (p *Plugin) Describe(context.Context) (*provider.DescribeResponse, error) {
	return &provider.DescribeResponse{
		Name:        "hetzner",
		Version:     version.Version,
		APIVersions: []int{provider.APIVersion},
		Capabilities: provider.Capabilities{
			// The servers live in the cloud; with a state directory the
			// fencing, idempotency and machine records survive a restart.
			DurableState: p.stateDir != "",
			ResourceTypes: []provider.ResourceType{{
				Name:      ResourceType,
				ExampleID: "m-example",
				ExampleAttributes: []json.RawMessage{
					json.RawMessage(`{"server_type":"cx22","image":"ubuntu-24.04","location":"fsn1","labels":{"role":"web"}}`),
					json.RawMessage(`{"server_type":"cx22","image":"ubuntu-24.04","location":"fsn1","labels":{"role":"db"}}`),
				},
			}},
		},
	}, nil
}

// ValidateConfig implements provider.Provider (the fields of [Config]). No
// problem quotes the token.
func (p *Plugin) ValidateConfig(_ context.Context, req *provider.ConfigRequest) (*provider.ValidateConfigResponse, error) {
	_, problems := parseConfig(req.Config)
	return &provider.ValidateConfigResponse{Problems: problems}, nil
}

// Configure implements provider.Configurer: a configuration with problems is
// refused with validation_failed. It makes no API call.
func (p *Plugin) Configure(_ context.Context, req *provider.ConfigRequest) error {
	s, problems := parseConfig(req.Config)
	if len(problems) > 0 {
		return abierrors.New(abierrors.ValidationFailed, "hetzner configuration: "+strings.Join(problems, "; "))
	}
	c := p.connect(s, http.DefaultTransport)
	p.mu.Lock()
	p.conn = c
	select {
	case <-p.cfgd:
	default:
		close(p.cfgd)
	}
	p.mu.Unlock()
	p.log.Info("hetzner provider configured", "endpoint", s.endpoint, "requests_per_hour", s.perHour, "burst", s.burst,
		"poll_interval", s.pollInterval.String(), "create_timeout", s.createTimeout.String())
	return nil
}

// connect builds the API access of settings s over base.
func (p *Plugin) connect(s settings, base http.RoundTripper) *conn {
	lim := newLimiter(base, s.perHour, s.burst, p.log)
	client := hcloud.NewClient(
		hcloud.WithToken(s.token),
		hcloud.WithEndpoint(s.endpoint),
		hcloud.WithApplication("berth-plugin-hetzner", version.Version),
		hcloud.WithHTTPClient(&http.Client{Transport: lim, Timeout: 2 * time.Minute}),
		// The limiter resends after a 429; everything else is the caller's
		// to retry, with its own backoff.
		hcloud.WithRetryOpts(hcloud.RetryOpts{MaxRetries: 0}),
	)
	return &conn{s: s, client: client, limiter: lim, poller: newPoller(p.life, client, s.pollInterval, p.log), catalog: newCatalog(client)}
}

// connection returns the API access, or unavailable before Configure.
func (p *Plugin) connection() (*conn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn == nil {
		return nil, abierrors.New(abierrors.Unavailable, "the hetzner provider is not configured yet")
	}
	return p.conn, nil
}

// Plan implements provider.Provider: the planned state is the desired one
// in canonical form, after the server type, location and image are checked
// against the API's catalog (cached for an hour), so an unknown one is
// refused provider_invalid_input before anything is created. Over an
// existing server only labels may change; any other change is refused
// validation_failed (it needs a new machine).
func (p *Plugin) Plan(ctx context.Context, req *provider.PlanRequest) (*provider.PlanResponse, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	c, err := p.connection()
	if err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	id := req.Desired.ID
	if err := checkID(req.Desired.Type, id); err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	a, err := parseAttrs(req.Desired.Attributes)
	if err != nil {
		return nil, fmt.Errorf("plan %s: %w", id, err)
	}
	if req.Current != nil {
		cur, err := parseAttrs(req.Current.Attributes)
		if err == nil {
			if err := immutable(cur, a); err != nil {
				return nil, fmt.Errorf("plan %s: %w", id, err)
			}
		}
	}
	if err := c.catalog.check(ctx, a); err != nil {
		return nil, fmt.Errorf("plan %s: %w", id, err)
	}
	planned := resource(id, a)
	return &provider.PlanResponse{Planned: planned, Changes: req.Current == nil || !req.Current.Equal(planned)}, nil
}

// immutable refuses a change of anything but labels. Create-only fields the
// current state does not know (a server adopted without a record) are not
// compared.
func immutable(cur, want Attributes) error {
	type field struct{ name, from, to string }
	fs := []field{{"server_type", cur.ServerType, want.ServerType}, {"image", cur.Image, want.Image}, {"location", cur.Location, want.Location}}
	known := cur.createOnly()
	if len(known.SSHKeys) > 0 || known.Firewall != "" || known.Placement != "" || known.UserData != "" {
		fs = append(fs, field{"ssh_keys", fmt.Sprint(cur.SSHKeys), fmt.Sprint(want.SSHKeys)}, field{"firewall", cur.Firewall, want.Firewall},
			field{"placement_group", cur.Placement, want.Placement}, field{"user_data", hashOf(cur.UserData), hashOf(want.UserData)})
	}
	for _, f := range fs {
		if f.from != f.to {
			return abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("%s cannot change on an existing server (%q to %q): the hetzner provider changes labels only; create a new machine", f.name, f.from, f.to))
		}
	}
	return nil
}

// hashOf shortens user data for a message without showing it.
func hashOf(s string) string {
	if s == "" {
		return ""
	}
	return strconv.Itoa(len(s)) + " bytes of user data"
}

// Apply implements provider.Provider: the server of the machine is found by
// its label, or created (docs/plugins-hetzner.md section 4), and its labels
// set to the planned ones. Fenced and idempotent.
func (p *Plugin) Apply(ctx context.Context, req *provider.ApplyRequest) (*provider.ApplyResponse, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("apply: %w", err)
	}
	c, err := p.connection()
	if err != nil {
		return nil, fmt.Errorf("apply: %w", err)
	}
	id := req.Planned.ID
	if err := checkID(req.Planned.Type, id); err != nil {
		return nil, fmt.Errorf("apply: %w", err)
	}
	a, err := parseAttrs(req.Planned.Attributes)
	if err != nil {
		return nil, fmt.Errorf("apply %s: %w", id, err)
	}
	return guard.Mutate(ctx, p.guards, ResourceType+"/"+id, req.Mutation, req, func() (*provider.ApplyResponse, error) {
		if err := p.ensure(ctx, c, id, a); err != nil {
			return nil, fmt.Errorf("apply %s: %w", id, err)
		}
		if err := p.records.put(id, a.createOnly()); err != nil {
			return nil, fmt.Errorf("apply %s: %w", id, err)
		}
		if err := p.prune(); err != nil {
			return nil, fmt.Errorf("apply %s: %w", id, err)
		}
		return &provider.ApplyResponse{State: resource(id, a)}, nil
	})
}

func (p *Plugin) prune() error {
	if p.stateDir == "" {
		return nil
	}
	_, err := p.guards.Idempotency.Prune(time.Now().Add(-idempotencyKeep))
	return err
}

// ensure makes machine id's server exist, booted, with a's labels.
func (p *Plugin) ensure(ctx context.Context, c *conn, id string, a Attributes) error {
	sv, err := p.find(ctx, c, id)
	if err != nil {
		return err
	}
	if sv == nil {
		if sv, err = p.create(ctx, c, id, a); err != nil {
			return err
		}
	} else if sv.Status != hcloud.ServerStatusRunning {
		// An earlier attempt created it: finish what it started.
		p.log.Info("hetzner server adopted", "machine", id, "server", sv.ID, "status", string(sv.Status))
		if err := p.settle(ctx, c, sv); err != nil {
			return err
		}
	}
	want := serverLabels(id, a)
	if maps.Equal(sv.Labels, want) {
		return nil
	}
	if _, _, err := c.client.Server.Update(ctx, sv, hcloud.ServerUpdateOpts{Labels: want}); err != nil {
		return apiErr(fmt.Sprintf("set the labels of server %d", sv.ID), err)
	}
	return nil
}

// find returns machine id's server, found by its berth-machine label, or
// nil.
func (p *Plugin) find(ctx context.Context, c *conn, id string) (*hcloud.Server, error) {
	list, err := c.client.Server.AllWithOpts(ctx, hcloud.ServerListOpts{ListOpts: hcloud.ListOpts{LabelSelector: LabelMachine + "=" + id}})
	if err != nil {
		return nil, apiErr("look up the server of machine "+id, err)
	}
	if len(list) == 0 {
		return nil, nil
	}
	slices.SortFunc(list, func(a, b *hcloud.Server) int { return int(a.ID - b.ID) })
	return list[0], nil
}

// create creates machine id's server and waits for it to boot. A name
// clash adopts the server of that name when it carries the machine's label;
// a create whose answer was lost (a 5xx or a broken connection) looks the
// label up once and adopts what it finds.
func (p *Plugin) create(ctx context.Context, c *conn, id string, a Attributes) (*hcloud.Server, error) {
	keys, fws, pg, err := c.catalog.createRefs(ctx, a)
	if err != nil {
		return nil, err
	}
	start := true
	res, _, err := c.client.Server.Create(ctx, hcloud.ServerCreateOpts{
		Name: id, ServerType: &hcloud.ServerType{Name: a.ServerType}, Image: &hcloud.Image{Name: a.Image},
		Location: &hcloud.Location{Name: a.Location}, SSHKeys: keys, UserData: a.UserData, StartAfterCreate: &start,
		Labels: serverLabels(id, a), Firewalls: fws, PlacementGroup: pg,
	})
	switch {
	case hcloud.IsError(err, hcloud.ErrorCodeUniquenessError):
		sv, _, gerr := c.client.Server.GetByName(ctx, id)
		if gerr != nil {
			return nil, apiErr("look up the server named "+id+" after a name clash", gerr)
		}
		if sv == nil {
			return nil, abierrors.New(abierrors.Unavailable, fmt.Sprintf("hetzner: the name %s clashed, yet no server has it now; try again", id))
		}
		if sv.Labels[LabelMachine] != id {
			return nil, abierrors.New(abierrors.ProviderNameTaken, fmt.Sprintf("hetzner: server %d is named %s but is not labelled %s=%s: Berth did not create it and will not adopt it", sv.ID, id, LabelMachine, id))
		}
		p.log.Info("hetzner server adopted after a name clash", "machine", id, "server", sv.ID, "status", string(sv.Status))
		return sv, p.settle(ctx, c, sv)
	case err != nil && ctx.Err() != nil:
		// The outcome is unknown and there is no time left to look: the
		// next attempt finds the server by its label, if it was created.
		return nil, apiErr("create the server of machine "+id, err)
	case err != nil:
		cerr := apiErr("create the server of machine "+id, err)
		if abierrors.CodeOf(cerr) != abierrors.Unavailable {
			return nil, cerr
		}
		sv, ferr := p.find(ctx, c, id)
		if ferr != nil || sv == nil {
			return nil, cerr
		}
		p.log.Info("hetzner server adopted after a lost create answer", "machine", id, "server", sv.ID)
		return sv, p.settle(ctx, c, sv)
	}
	p.log.Info("hetzner server created", "machine", id, "server", res.Server.ID, "type", a.ServerType, "location", a.Location)
	ids := []int64{res.Action.ID}
	for _, na := range res.NextActions {
		ids = append(ids, na.ID)
	}
	return res.Server, p.await(ctx, c, res.Server, ids)
}

// settle waits for the actions still running on an adopted server, and
// deletes it when one of its actions failed.
func (p *Plugin) settle(ctx context.Context, c *conn, sv *hcloud.Server) error {
	if sv.Status == hcloud.ServerStatusRunning {
		return nil
	}
	acts, err := c.client.Server.Action.AllFor(ctx, sv, hcloud.ActionListOpts{})
	if err != nil {
		return apiErr(fmt.Sprintf("list the actions of server %d", sv.ID), err)
	}
	var running []int64
	for _, a := range acts {
		switch a.Status {
		case hcloud.ActionStatusError:
			return p.failed(ctx, c, sv, a)
		case hcloud.ActionStatusRunning:
			running = append(running, a.ID)
		}
	}
	if len(running) == 0 {
		return nil
	}
	return p.await(ctx, c, sv, running)
}

// await waits, bounded by the create timeout, for the actions ids of server
// sv. A failed action, or the timeout, deletes the server. When ctx ends
// first the server is left for the next attempt to adopt.
func (p *Plugin) await(ctx context.Context, c *conn, sv *hcloud.Server, ids []int64) error {
	wctx, cancel := context.WithTimeout(ctx, c.s.createTimeout)
	defer cancel()
	failed, err := c.poller.Wait(wctx, ids...)
	switch {
	case err != nil && (ctx.Err() != nil || p.life.Err() != nil):
		return fmt.Errorf("hetzner: waiting for server %d (%s) to boot: %w", sv.ID, sv.Name, err)
	case err != nil:
		derr := p.destroy(ctx, c, sv)
		msg := fmt.Sprintf("hetzner: server %d (%s) did not finish booting within %s; it was deleted", sv.ID, sv.Name, c.s.createTimeout)
		if derr != nil {
			msg = fmt.Sprintf("hetzner: server %d (%s) did not finish booting within %s, and deleting it failed (the orphan sweep will retry): %v", sv.ID, sv.Name, c.s.createTimeout, derr)
		}
		return abierrors.New(abierrors.ProviderResourceUnavailable, msg)
	case failed != nil:
		return p.failed(ctx, c, sv, failed)
	}
	return nil
}

// failed deletes a server whose action a failed and returns the final error
// that says so.
func (p *Plugin) failed(ctx context.Context, c *conn, sv *hcloud.Server, a *hcloud.Action) error {
	p.log.Warn("hetzner server action failed: deleting the server", "server", sv.ID, "machine", sv.Name, "action", a.Command, "code", a.ErrorCode, "message", a.ErrorMessage)
	derr := p.destroy(ctx, c, sv)
	msg := fmt.Sprintf("hetzner: action %s (%d) of server %d (%s) failed: %s (%s); the server was deleted", a.Command, a.ID, sv.ID, sv.Name, a.ErrorMessage, a.ErrorCode)
	if derr != nil {
		msg = fmt.Sprintf("hetzner: action %s (%d) of server %d (%s) failed: %s (%s), and deleting the server failed (the orphan sweep will retry): %v", a.Command, a.ID, sv.ID, sv.Name, a.ErrorMessage, a.ErrorCode, derr)
	}
	return abierrors.New(abierrors.ProviderActionFailed, msg)
}

// destroy deletes a server and waits for the deletion; an absent server is
// success. It runs under its own budget even when ctx has ended.
func (p *Plugin) destroy(ctx context.Context, c *conn, sv *hcloud.Server) error {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupBudget)
	defer cancel()
	return p.remove(dctx, c, sv)
}

// remove deletes server sv and waits for its delete action.
func (p *Plugin) remove(ctx context.Context, c *conn, sv *hcloud.Server) error {
	res, _, err := c.client.Server.DeleteWithResult(ctx, sv)
	if hcloud.IsError(err, hcloud.ErrorCodeNotFound) {
		return nil
	}
	if err != nil {
		return apiErr(fmt.Sprintf("delete server %d (%s)", sv.ID, sv.Name), err)
	}
	p.log.Info("hetzner server deleted", "server", sv.ID, "machine", sv.Labels[LabelMachine])
	if res == nil || res.Action == nil {
		return nil
	}
	failed, err := c.poller.Wait(ctx, res.Action.ID)
	if err != nil {
		return fmt.Errorf("hetzner: waiting for the deletion of server %d: %w", sv.ID, err)
	}
	if failed != nil {
		return abierrors.New(abierrors.ProviderActionFailed, fmt.Sprintf("hetzner: deleting server %d failed: %s (%s)", sv.ID, failed.ErrorMessage, failed.ErrorCode))
	}
	return nil
}

// Read implements provider.Provider: the server's type, image, location and
// labels as the API reports them, with the create-only fields as applied;
// ErrNotFound when no server carries the machine's label.
func (p *Plugin) Read(ctx context.Context, req *provider.ReadRequest) (*provider.ReadResponse, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("read: %w", err)
	}
	c, err := p.connection()
	if err != nil {
		return nil, fmt.Errorf("read: %w", err)
	}
	if err := checkID(req.Type, req.ID); err != nil {
		return nil, fmt.Errorf("read: %w", err)
	}
	sv, err := p.find(ctx, c, req.ID)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", req.ID, err)
	}
	if sv == nil {
		return nil, fmt.Errorf("read %s: no server is labelled %s=%s: %w", req.ID, LabelMachine, req.ID, provider.ErrNotFound)
	}
	a := Attributes{Labels: userLabels(sv.Labels)}
	if sv.ServerType != nil {
		a.ServerType = sv.ServerType.Name
	}
	if sv.Location != nil {
		a.Location = sv.Location.Name
	}
	if sv.Image != nil {
		a.Image = sv.Image.Name
		if a.Image == "" {
			a.Image = strconv.FormatInt(sv.Image.ID, 10)
		}
	}
	rec, ok, err := p.records.get(req.ID)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", req.ID, err)
	}
	if ok {
		a.SSHKeys, a.Firewall, a.Placement, a.UserData = rec.SSHKeys, rec.Firewall, rec.Placement, rec.UserData
	}
	return &provider.ReadResponse{State: resource(req.ID, a)}, nil
}

// Delete implements provider.Provider: the server carrying the machine's
// label is deleted and the deletion waited for; an absent server is
// success. Fenced and idempotent.
func (p *Plugin) Delete(ctx context.Context, req *provider.DeleteRequest) (*provider.DeleteResponse, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("delete: %w", err)
	}
	c, err := p.connection()
	if err != nil {
		return nil, fmt.Errorf("delete: %w", err)
	}
	if err := checkID(req.Type, req.ID); err != nil {
		return nil, fmt.Errorf("delete: %w", err)
	}
	return guard.Mutate(ctx, p.guards, ResourceType+"/"+req.ID, req.Mutation, req, func() (*provider.DeleteResponse, error) {
		sv, err := p.find(ctx, c, req.ID)
		if err != nil {
			return nil, fmt.Errorf("delete %s: %w", req.ID, err)
		}
		if sv != nil {
			if err := p.remove(ctx, c, sv); err != nil {
				return nil, fmt.Errorf("delete %s: %w", req.ID, err)
			}
		}
		if err := p.records.drop(req.ID); err != nil {
			return nil, fmt.Errorf("delete %s: %w", req.ID, err)
		}
		if err := p.prune(); err != nil {
			return nil, fmt.Errorf("delete %s: %w", req.ID, err)
		}
		return &provider.DeleteResponse{}, nil
	})
}

// Machine is one server labelled berth-managed=true, as [Plugin.Managed]
// lists it.
type Machine struct {
	MachineID  string            // its berth-machine label
	ServerID   int64             // the API's id
	Name       string            // the server's name
	Status     string            // e.g. "running", "initializing", "off"
	Created    time.Time         // when the API created it
	ServerType string            // e.g. "cx22"
	Location   string            // e.g. "fsn1"
	IPv4       string            // public IPv4, "" without one
	Labels     map[string]string // all its labels
}

// Managed lists every server of the project labelled berth-managed=true,
// oldest first: what the core's orphan sweep compares with its machine
// records. One paginated API call (50 servers a page).
func (p *Plugin) Managed(ctx context.Context) ([]Machine, error) {
	c, err := p.connection()
	if err != nil {
		return nil, fmt.Errorf("list managed servers: %w", err)
	}
	list, err := c.client.Server.AllWithOpts(ctx, hcloud.ServerListOpts{ListOpts: hcloud.ListOpts{LabelSelector: LabelManaged + "=true", PerPage: 50}})
	if err != nil {
		return nil, apiErr("list managed servers", err)
	}
	out := make([]Machine, 0, len(list))
	for _, sv := range list {
		m := Machine{MachineID: sv.Labels[LabelMachine], ServerID: sv.ID, Name: sv.Name, Status: string(sv.Status), Created: sv.Created, Labels: sv.Labels}
		if sv.ServerType != nil {
			m.ServerType = sv.ServerType.Name
		}
		if sv.Location != nil {
			m.Location = sv.Location.Name
		}
		if sv.PublicNet.IPv4.IP != nil {
			m.IPv4 = sv.PublicNet.IPv4.IP.String()
		}
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b Machine) int { return a.Created.Compare(b.Created) })
	return out, nil
}

// Health implements pluginapi.HealthReporter: healthy once configured;
// while the rate limiter pauses every call, the report says until when.
func (p *Plugin) Health(ctx context.Context) (<-chan pluginapi.HealthReport, error) {
	ch := make(chan pluginapi.HealthReport, 1)
	go func() {
		defer close(ch)
		var last *pluginapi.HealthReport
		for {
			r, wake := p.healthNow()
			if last == nil || *last != r {
				select {
				case ch <- r:
				case <-ctx.Done():
					return
				}
				last = &r
			}
			select {
			case <-ctx.Done():
				return
			case <-p.life.Done():
				return
			case <-wake:
			}
		}
	}()
	return ch, nil
}

// healthNow is the current report and a channel that fires when it may
// change.
func (p *Plugin) healthNow() (pluginapi.HealthReport, <-chan struct{}) {
	p.mu.Lock()
	c, cfgd := p.conn, p.cfgd
	p.mu.Unlock()
	if c == nil {
		return pluginapi.HealthReport{State: pluginapi.Undetected, Description: "no configuration yet: the API token comes with Configure"}, cfgd
	}
	until, changed := c.limiter.PausedUntil()
	if until.IsZero() {
		return pluginapi.HealthReport{State: pluginapi.Healthy}, changed
	}
	wake := make(chan struct{})
	go func() {
		t := time.NewTimer(time.Until(until) + 10*time.Millisecond)
		defer t.Stop()
		select {
		case <-t.C:
		case <-changed:
		case <-p.life.Done():
		}
		close(wake)
	}()
	return pluginapi.HealthReport{State: pluginapi.Healthy, Description: fmt.Sprintf(
		"the Hetzner API rate limit is reached: every call waits until %s", until.UTC().Format(time.RFC3339))}, wake
}
