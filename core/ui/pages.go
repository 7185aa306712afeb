package ui

import (
	"cmp"
	"context"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/berthhq/berth/sdk/client"
)

// failingService is a service whose verdict is refused or waiting, with the reason and, when
// the rollout names one, the slot it waits on and that slot's last failure.
type failingService struct {
	Service     client.Service
	State       string
	Reason      string
	Since       time.Time
	WaitingOn   string
	LastFailure string
}

// rolloutRow is a service whose verdict is converging, with its rollout's progress when the
// overview read it (the first detailLimit of them).
type rolloutRow struct {
	Service client.Service
	Status  *client.RolloutStatus
}

// detailLimit is how many failing services and how many rollouts in progress the overview
// reads the rollout detail of (one API read each); the rest are listed from the service list
// alone, so a fleet-wide rollout costs a bounded number of reads.
const detailLimit = 20

// crashingWorkload is a workload that should run and does not stay up.
type crashingWorkload struct {
	Workload client.Workload
	Failure  string
}

// overviewData is what the overview shows, failing things first.
type overviewData struct {
	Failing  []failingService
	Crashing []crashingWorkload
	BadNodes []nodeAttention
	Rollouts []rolloutRow
	// More counts the failing services and rollouts listed without their per-slot detail
	// (beyond detailLimit of each).
	More int
	// FailingHidden and RolloutsHidden count the rows beyond overviewRows of each list: the
	// overview shows them as a count with a link to the services page, so its size (and its
	// time to render) does not grow with a fleet-wide rollout.
	FailingHidden, RolloutsHidden int
	Latest                        []client.Service
	NodeCount                     []statusCount
	Services                      int
	// JobRuns are the runs of the last 24 hours of the first jobDetailLimit jobs, newest
	// first, at most jobRunRows; FailedRuns those of them that failed, timed out or were
	// missed (listed among the failing things too). HasJobs says jobs exist at all: the jobs
	// section is shown only then.
	JobRuns    []jobRunRow
	FailedRuns []jobRunRow
	HasJobs    bool
}

// jobRunRow is one run of a job with the name of its project.
type jobRunRow struct {
	Project string
	Job     string
	Run     client.JobRun
}

// jobRunWindow is how far back the overview lists job runs.
const jobRunWindow = 24 * time.Hour

// jobDetailLimit is how many jobs the overview reads the runs of (one API read each), and
// jobRunRows how many runs it lists at most, so a fleet of jobs costs a bounded number of reads.
const (
	jobDetailLimit = 20
	jobRunRows     = 20
)

// nodeAttention is a node that is not serving as a member should, with its fencing state:
// leases it failed to fence and those that wait for an operator's fence-ack.
type nodeAttention struct {
	Node          client.Node
	FenceFailures int
	AckPending    int
}

// statusCount is how many nodes have one status.
type statusCount struct {
	Status string
	Count  int
}

// crashRestarts is the restart count from which a running workload counts as crash-looping.
const crashRestarts = 3

// overviewRows is how many failing services and how many rollouts in progress the overview
// lists at most; the rest are counted.
const overviewRows = 50

// latestDeployments is how many recently changed services the overview lists.
const latestDeployments = 10

// loadOverview reads the overview through the API as v. Jobs are not services here: they
// are neither listed nor counted (the jobs page has them).
func (h *Handler) loadOverview(ctx context.Context, c *client.Client) (*overviewData, error) {
	svcs, err := allServices(ctx, c)
	if err != nil {
		return nil, err
	}
	var jobSvcs []client.Service
	for _, s := range svcs {
		if s.Kind == "job" {
			jobSvcs = append(jobSvcs, s)
		}
	}
	svcs = withoutJobs(svcs)
	d := &overviewData{Services: len(svcs), HasJobs: len(jobSvcs) > 0}
	d.JobRuns, d.FailedRuns = recentJobRuns(ctx, c, jobSvcs, h.cfg.Now().Add(-jobRunWindow))
	// The last failure of the workload each failing rollout waits on, by workload id: the
	// node's own words, which the workload list does not carry.
	lastFailure := map[string]string{}
	for _, s := range svcs {
		if s.Verdict == nil {
			continue
		}
		switch s.Verdict.State {
		case "refused", "waiting":
			f := failingService{Service: s, State: s.Verdict.State, Reason: s.Verdict.Reason, Since: s.Verdict.ChangedAt}
			if len(d.Failing) >= detailLimit {
				d.More++
				d.Failing = append(d.Failing, f)
				continue
			}
			if ro, err := c.Rollout(ctx, s.Project, s.Name); err == nil && ro.WaitingOn != nil {
				f.WaitingOn = ro.WaitingOn.Replica + ": " + ro.WaitingOn.Reason
				if ro.WaitingOn.LastFailure != nil {
					f.LastFailure = ro.WaitingOn.LastFailure.String()
					lastFailure[ro.WaitingOn.WorkloadID] = f.LastFailure
				}
			}
			d.Failing = append(d.Failing, f)
		case "converging":
			row := rolloutRow{Service: s}
			if len(d.Rollouts) < detailLimit {
				if ro, err := c.Rollout(ctx, s.Project, s.Name); err == nil {
					row.Status = ro
				}
			} else {
				d.More++
			}
			d.Rollouts = append(d.Rollouts, row)
		}
	}
	// Refused before waiting, then the longest-standing first.
	slices.SortStableFunc(d.Failing, func(a, b failingService) int {
		if a.State != b.State {
			return cmp.Compare(stateRank(a.State), stateRank(b.State))
		}
		return a.Since.Compare(b.Since)
	})
	wls, err := c.ListWorkloads(ctx, "")
	if err != nil {
		return nil, err
	}
	for _, w := range wls {
		if w.DesiredStatus != "running" {
			continue
		}
		if w.ObservedStatus == "crashed" || w.RestartCount >= crashRestarts {
			f := cmp.Or(lastFailure[w.ID], w.Message, w.ObservedStatus)
			d.Crashing = append(d.Crashing, crashingWorkload{Workload: w, Failure: f})
		}
	}
	if len(d.Failing) > overviewRows {
		d.FailingHidden = len(d.Failing) - overviewRows
		d.Failing = d.Failing[:overviewRows]
	}
	if len(d.Rollouts) > overviewRows {
		d.RolloutsHidden = len(d.Rollouts) - overviewRows
		d.Rollouts = d.Rollouts[:overviewRows]
	}
	slices.SortStableFunc(d.Crashing, func(a, b crashingWorkload) int { return cmp.Compare(b.Workload.RestartCount, a.Workload.RestartCount) })
	nodes, err := c.ListNodes(ctx)
	if err != nil && !client.IsCode(err, "forbidden") {
		return nil, err
	}
	counts := map[string]int{}
	for _, n := range nodes {
		counts[n.Status]++
		if nodeNeedsAttention(n) {
			a := nodeAttention{Node: n}
			// Only a node that lost its session has leases to fence. Without the lease
			// subsystem the fence endpoint does not exist (404): no fencing to show.
			if n.Status == "disconnected" {
				if f, err := c.NodeFence(ctx, n.ID); err == nil {
					a.FenceFailures, a.AckPending = len(f.FenceFailure), len(f.FenceAckPending)
				}
			}
			d.BadNodes = append(d.BadNodes, a)
		}
	}
	for st, n := range counts {
		d.NodeCount = append(d.NodeCount, statusCount{Status: st, Count: n})
	}
	slices.SortFunc(d.NodeCount, func(a, b statusCount) int { return strings.Compare(a.Status, b.Status) })
	latest := slices.Clone(svcs)
	slices.SortFunc(latest, func(a, b client.Service) int { return b.UpdatedAt.Compare(a.UpdatedAt) })
	d.Latest = latest[:min(len(latest), latestDeployments)]
	return d, nil
}

// recentJobRuns reads the runs of the first jobDetailLimit of jobs (GET .../jobs/NAME/runs, one
// read each) and returns those fired or ended since since, newest first, at most jobRunRows,
// and the failed, timed-out and missed ones among them. A job whose runs the API does not give
// (no jobs controller, a credential that may not read them) is left out: the overview shows
// what it may read and the jobs page says why the rest is missing.
func recentJobRuns(ctx context.Context, c *client.Client, jobs []client.Service, since time.Time) (all, failed []jobRunRow) {
	for i, j := range jobs {
		if i >= jobDetailLimit {
			break
		}
		runs, err := c.JobRuns(ctx, j.Project, j.Name)
		if err != nil {
			continue
		}
		for _, r := range runs {
			if r.FireTime.Before(since) && r.EndedAt.Before(since) {
				continue
			}
			all = append(all, jobRunRow{Project: j.Project, Job: j.Name, Run: r})
		}
	}
	slices.SortStableFunc(all, func(a, b jobRunRow) int { return b.Run.FireTime.Compare(a.Run.FireTime) })
	all = all[:min(len(all), jobRunRows)]
	for _, r := range all {
		switch r.Run.State {
		case "failed", "timed_out", "missed":
			failed = append(failed, r)
		}
	}
	return all, failed
}

// stateRank orders verdict states for the failing list.
func stateRank(state string) int {
	if state == "refused" {
		return 0
	}
	return 1
}

// nodeNeedsAttention reports whether node n is not serving as a member should: disconnected,
// draining, not yet connected, or retired.
func nodeNeedsAttention(n client.Node) bool {
	return n.Status != "connected" && n.Status != "removed" || n.Retirement != ""
}

// withoutJobs returns svcs without the jobs (kind "job"), in place: the services and overview
// pages list what is kept running; jobs have their own page.
func withoutJobs(svcs []client.Service) []client.Service {
	return slices.DeleteFunc(svcs, func(s client.Service) bool { return s.Kind == "job" })
}

// allServices lists the services of every project the viewer may read, jobs included (the
// API lists both as services).
func allServices(ctx context.Context, c *client.Client) ([]client.Service, error) {
	projects, err := c.ListProjects(ctx)
	if err != nil {
		return nil, err
	}
	var out []client.Service
	for _, p := range projects {
		svcs, err := c.ListServices(ctx, p.Name)
		if client.IsCode(err, "forbidden") {
			continue // a token bound to another project
		}
		if err != nil {
			return nil, err
		}
		out = append(out, svcs...)
	}
	slices.SortFunc(out, func(a, b client.Service) int {
		return cmp.Or(strings.Compare(a.Project, b.Project), strings.Compare(a.Name, b.Name))
	})
	return out, nil
}

// serviceData is what a service's page shows.
type serviceData struct {
	Service  *client.Service
	Rollout  *client.RolloutStatus
	Slots    []client.SlotView
	Releases []client.ImageRelease
	// Spec is the service's runtime spec (what the scale form writes); nil when the API did
	// not give it.
	Spec *client.RuntimeSpecDoc
	// Idem is the Idempotency-Key the page's action forms send: a repeated submit of the same
	// rendered form is the same request to the API.
	Idem string
}

func (h *Handler) loadService(ctx context.Context, c *client.Client, project, name string) (*serviceData, error) {
	svc, err := c.GetService(ctx, project, name)
	if err != nil {
		return nil, err
	}
	d := &serviceData{Service: svc, Idem: newFormKey()}
	if d.Rollout, err = c.Rollout(ctx, project, name); err != nil {
		return nil, err
	}
	if d.Slots, err = c.ServiceSlots(ctx, project, name); err != nil {
		return nil, err
	}
	rels, err := c.ListImageReleases(ctx, project, name)
	if err == nil {
		d.Releases = rels
	}
	if spec, err := c.GetRuntimeSpec(ctx, project, name); err == nil {
		d.Spec = spec
	}
	return d, nil
}

// specRevisionField is the scale form's expected spec revision: "" while the spec is derived
// from the service (no operator spec was read), the revision otherwise.
func specRevisionField(d *client.RuntimeSpecDoc) string {
	if d == nil || d.Source != "operator" {
		return ""
	}
	return strconv.FormatInt(d.Spec.Revision, 10)
}

// maxScale bounds the replica count the scale form accepts (the API has its own bounds).
const maxScale = 1000

// scale sets the replica count of a scheduled service through the runtime spec endpoint
// (PUT .../spec): the spec the form was rendered from, read again and written with the
// form's expected revision and Idempotency-Key, so a change meanwhile is the API's conflict.
func (h *Handler) scale(w http.ResponseWriter, r *http.Request, v *viewer) {
	project, name := r.PathValue("project"), r.PathValue("name")
	n, err := strconv.Atoi(r.PostFormValue("replicas"))
	if err != nil || n < 0 || n > maxScale {
		h.renderError(w, r, http.StatusBadRequest, "Replicas must be a whole number from 0 to "+strconv.Itoa(maxScale)+".")
		return
	}
	var expected *int64
	if f := r.PostFormValue("spec_revision"); f != "" {
		rev, ok := parseRevision(f)
		if !ok {
			h.renderError(w, r, http.StatusBadRequest, "The scale form's spec revision is not a number. Reload the page.")
			return
		}
		expected = &rev
	}
	c, ctx := h.client(r, v.Bearer)
	doc, err := c.GetRuntimeSpec(ctx, project, name)
	if err != nil {
		h.apiError(w, r, err)
		return
	}
	if doc.Spec.Placement.Mode != "" && doc.Spec.Placement.Mode != "scheduled" {
		h.renderError(w, r, http.StatusConflict, "Only a service with scheduled placement is scaled by a total; this one places "+doc.Spec.Placement.Mode+".")
		return
	}
	spec := doc.Spec
	spec.Replicas = client.RuntimeReplicas{Total: n}
	c = c.WithIdempotencyKey(formKey(r))
	if _, err := c.PutRuntimeSpec(ctx, project, name, client.SpecWrite{ExpectedRevision: expected, Spec: spec}); err != nil {
		h.apiError(w, r, err)
		return
	}
	http.Redirect(w, r, serviceURL(project, name), http.StatusSeeOther)
}

// loadLive returns what page's live region is rendered from: through the session's cache for
// the pages whose data it may keep ([liveCache]), through the API otherwise.
func (h *Handler) loadLive(ctx context.Context, c *client.Client, v *viewer, page string, q map[string]string) (any, error) {
	if !cached(page) {
		return h.readLive(ctx, c, page, q)
	}
	return h.cache.get(ctx, v.Bearer, page, func(ctx context.Context) (any, error) { return h.readLive(ctx, c, page, q) })
}

// readLive reads what page's live region is rendered from through the API.
func (h *Handler) readLive(ctx context.Context, c *client.Client, page string, q map[string]string) (any, error) {
	switch page {
	case "overview":
		return h.loadOverview(ctx, c)
	case "services":
		svcs, err := allServices(ctx, c)
		return withoutJobs(svcs), err
	case "nodes":
		nodes, err := c.ListNodes(ctx)
		slices.SortFunc(nodes, func(a, b client.Node) int { return strings.Compare(a.Hostname, b.Hostname) })
		return nodes, err
	case "service":
		return h.loadService(ctx, c, q["project"], q["name"])
	case "workloads":
		return workloadRows(ctx, c)
	case "workload":
		return loadWorkloadStatus(ctx, c, q["id"])
	case "node":
		return loadNode(ctx, c, q["id"])
	case "operations":
		return loadOperations(ctx, c, q["state"])
	case "changelog":
		return loadChangelog(ctx, c, changelogFilterFrom(q))
	case "domains":
		return loadDomains(ctx, c)
	case "registry":
		return loadRegistry(ctx, c)
	case "secrets":
		return loadSecrets(ctx, c)
	case "jobs":
		return loadJobs(ctx, c)
	case "access":
		return loadAccess(ctx, c)
	case "plugins":
		return loadPlugins(ctx, c)
	case "backups":
		return loadBackups(ctx, c)
	}
	return nil, errNoPage
}

var errNoPage = errors.New("ui: no such page")

func (h *Handler) overview(w http.ResponseWriter, r *http.Request, v *viewer) {
	h.page(w, r, v, "overview", "Overview", nil)
}

func (h *Handler) servicesPage(w http.ResponseWriter, r *http.Request, v *viewer) {
	h.page(w, r, v, "services", "Services", nil)
}

func (h *Handler) nodesPage(w http.ResponseWriter, r *http.Request, v *viewer) {
	h.page(w, r, v, "nodes", "Nodes", nil)
}

func (h *Handler) servicePage(w http.ResponseWriter, r *http.Request, v *viewer) {
	q := map[string]string{"project": r.PathValue("project"), "name": r.PathValue("name")}
	h.page(w, r, v, "service", q["project"]+"/"+q["name"], q)
}

// page renders a page with a live region: the region's data through the API, and the stream
// URL that keeps it current.
func (h *Handler) page(w http.ResponseWriter, r *http.Request, v *viewer, name, title string, q map[string]string) {
	c, ctx := h.client(r, v.Bearer)
	data, err := h.loadLive(ctx, c, v, name, q)
	if err != nil {
		h.apiError(w, r, err)
		return
	}
	stream := "/ui/stream/" + name
	if q != nil {
		vals := url.Values{}
		for k, v := range q {
			vals.Set(k, v)
		}
		stream += "?" + vals.Encode()
	}
	h.render(w, r, http.StatusOK, name, &pageData{Viewer: v, Title: title, Nav: name, Stream: stream, Data: data, Query: q})
}

// pageData is the data of every page template.
type pageData struct {
	Viewer *viewer
	Title  string
	Nav    string
	Stream string
	Data   any
	Query  map[string]string
	// Notice is a one-line message above the page (the outcome of an action).
	Notice string
}

// undoPreview shows what an undo would change (a dry run through the API) and the form that
// does it at the revision shown.
func (h *Handler) undoPreview(w http.ResponseWriter, r *http.Request, v *viewer) {
	project, name := r.PathValue("project"), r.PathValue("name")
	c, ctx := h.client(r, v.Bearer)
	res, err := c.RolloutUndoWith(ctx, project, name, client.UndoRequest{DryRun: true})
	if err != nil {
		h.apiError(w, r, err)
		return
	}
	h.render(w, r, http.StatusOK, "undo", &pageData{Viewer: v, Title: "Undo " + project + "/" + name, Nav: "services",
		Data: map[string]any{"Result": res, "Idem": newFormKey()}, Query: map[string]string{"project": project, "name": name}})
}

// undo undoes the service's last rollout at the revision the preview showed, with the
// Idempotency-Key the preview's form carries.
func (h *Handler) undo(w http.ResponseWriter, r *http.Request, v *viewer) {
	project, name := r.PathValue("project"), r.PathValue("name")
	rev, ok := parseRevision(r.PostFormValue("expected_revision"))
	if !ok {
		h.renderError(w, r, http.StatusBadRequest, "The undo form has no revision. Open the undo preview again.")
		return
	}
	c, ctx := h.client(r, v.Bearer)
	c = c.WithIdempotencyKey(formKey(r))
	if _, err := c.RolloutUndoWith(ctx, project, name, client.UndoRequest{ExpectedRevision: &rev}); err != nil {
		h.apiError(w, r, err)
		return
	}
	http.Redirect(w, r, serviceURL(project, name), http.StatusSeeOther)
}

// restart restarts the service's rollout (POST .../rollout/restart) with the form's
// Idempotency-Key.
func (h *Handler) restart(w http.ResponseWriter, r *http.Request, v *viewer) {
	project, name := r.PathValue("project"), r.PathValue("name")
	c, ctx := h.client(r, v.Bearer)
	c = c.WithIdempotencyKey(formKey(r))
	if _, err := c.RolloutRestart(ctx, project, name); err != nil {
		h.apiError(w, r, err)
		return
	}
	http.Redirect(w, r, serviceURL(project, name), http.StatusSeeOther)
}

// formKey is the Idempotency-Key a form carries (rendered with the form), or a fresh one.
func formKey(r *http.Request) string {
	k := r.PostFormValue("idempotency_key")
	if k == "" || len(k) > 200 {
		return newFormKey()
	}
	return k
}

// newFormKey is a fresh Idempotency-Key for a form being rendered: "ui-" and a random token.
func newFormKey() string { return "ui-" + randomToken() }
