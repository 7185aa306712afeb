package api

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/core/bundles"
	"github.com/berthhq/berth/core/certs"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/deploy"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/jobs"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/rollout"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/sdk/bundle"
	"github.com/berthhq/berth/sdk/client"
)

type serviceSpec = client.ServiceSpec

func toAPIService(s *services.Service, ready int) client.Service {
	out := client.Service{
		ID: s.ID, Project: s.Project, Name: s.Name, Revision: s.Revision, Bundle: s.Bundle, BundleDigest: s.BundleDigest,
		Command: s.Command, Env: s.Env, SecretSets: s.SecretSets, Port: s.Port, Domains: s.Domains, DNS: s.DNS, Replicas: s.Replicas,
		HealthCheck: client.HealthCheck(s.HealthCheck), CreatedAt: s.CreatedAt, UpdatedAt: s.UpdatedAt, Ready: ready,
		Labels: s.Labels, CapacityUnits: s.CapacityUnits, PlacementMode: services.PlacementPortable,
		Resources: replicaResources(s.ReplicaResources()), Scheduling: client.Scheduling(s.Scheduling),
		ProgressDeadlineS: s.ProgressDeadlineS, AutoRollback: s.AutoRollback, RollbackOf: s.RollbackOf,
		Rollout: apiRollout(s.Rollout), RolloutPaused: s.RolloutPaused, RestartGeneration: s.RestartGeneration,
		Container: client.Container{Runtime: s.Runtime, Image: s.Image, User: s.User, MemoryMB: s.MemoryMB, CPUMillis: s.CPUMillis,
			DeployOnPush: s.DeployOnPush, ImageTag: s.ImageTag},
		Deleting: s.Deleting, PurgeVolumes: s.PurgeVolumes, Timeouts: s.Timeouts, TLS: client.TLS(s.TLS), Stream: s.Stream,
	}
	if len(s.Secrets) > 0 {
		out.Secrets = map[string]client.SecretRef{}
		for k, r := range s.Secrets {
			out.Secrets[k] = client.SecretRef(r)
		}
	}
	if len(s.ResolvedSecrets) > 0 {
		out.ResolvedSecrets = map[string]client.SecretRef{}
		for k, r := range s.ResolvedSecrets {
			out.ResolvedSecrets[k] = client.SecretRef(r)
		}
	}
	if s.Stateful() {
		out.PlacementMode = services.PlacementStateful
		out.Lease = &client.LeaseSpec{Mode: s.LeaseMode, DurationMS: s.LeaseDurationMS}
	}
	for _, v := range s.Volumes {
		out.Volumes = append(out.Volumes, client.Volume(v))
	}
	for _, b := range s.Bindings {
		out.Bindings = append(out.Bindings, client.BindingSpec{Name: b.Name, Kind: b.Kind})
	}
	if s.Backup != nil {
		out.Backup = &client.BackupSpec{Cron: s.Backup.Cron, Keep: s.Backup.Keep, Drill: s.Backup.Drill}
	}
	if s.IsJob() && s.Job != nil {
		j := s.Job
		out.Kind, out.Suspended = s.Kind, j.Suspended
		out.Job = &client.JobSpec{Schedule: j.Schedule, TimeZone: j.TimeZone, Concurrency: j.Concurrency, TimeoutS: j.TimeoutS,
			Retries: j.Retries, StartingDeadlineS: j.StartingDeadlineS, KeepHistory: j.KeepHistory}
		if j.Schedule != "" && !j.Suspended {
			if next := jobs.Next(jobs.Schedule{Cron: j.Schedule, TimeZone: j.TimeZone}, time.Now()); !next.IsZero() {
				out.NextFire = &next
			}
		}
	}
	return out
}

func toAPIWorkload(w *services.Workload) client.Workload {
	return client.Workload{
		ID: w.ID, Project: w.Project, Service: w.Service, Slot: w.Slot, NodeID: w.NodeID,
		DesiredStatus: w.DesiredStatus, ObservedStatus: w.ObservedStatus, Health: w.Health,
		Address: w.Address, RestartCount: w.RestartCount, Message: w.Message, CreatedAt: w.CreatedAt, ObservedAt: w.ObservedAt,
		LastFailure: rollout.APIFailure(w.LastFailure),
	}
}

func ready(w *services.Workload) bool { return w.ObservedStatus == "running" && w.Health == "passing" }

// project returns the named project; with create, an admin creates it on first use.
func (s *Server) project(c echo.Context, create bool) (*services.Project, error) {
	name := c.Param("project")
	if err := checkName("project", name); err != nil {
		return nil, err
	}
	ctx := c.Request().Context()
	if create && principal(c).Has(identity.ScopeAdmin) {
		wctx, done := s.changeCtx(c)
		p, created, err := s.cfg.Catalog.EnsureProject(wctx, name)
		done()
		if created {
			s.log.Info("project created on first use", "project", name, "project_id", p.ID)
			s.awaitChange(c, "projects", p.ID, p.LogOutbox)
		}
		return p, err
	}
	p, err := s.cfg.Catalog.GetProject(ctx, name)
	if errors.Is(err, services.ErrProjectNotFound) {
		return nil, problem(abierrors.ProjectNotFound, fmt.Sprintf("no project %q", name))
	}
	return p, err
}

func apiProject(p *services.Project) client.Project {
	return client.Project{ID: p.ID, Name: p.Name, CreatedAt: p.CreatedAt}
}

func (s *Server) putProject(c echo.Context) error {
	var body struct{}
	if err := s.bindOptional(c, &body); err != nil {
		return err
	}
	name := c.Param("project")
	if err := checkName("project", name); err != nil {
		return err
	}
	wctx, done := s.changeCtx(c)
	p, created, err := s.cfg.Catalog.EnsureProject(wctx, name)
	done()
	if err != nil {
		return err
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
		s.log.Info("project created", "project", name, "project_id", p.ID)
		s.awaitChange(c, "projects", p.ID, p.LogOutbox)
	}
	return c.JSON(status, apiProject(p))
}

func (s *Server) getProject(c echo.Context) error {
	p, err := s.project(c, false)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, apiProject(p))
}

func (s *Server) listProjects(c echo.Context) error {
	ps, err := s.cfg.Catalog.ListProjects(c.Request().Context())
	if err != nil {
		return err
	}
	out := client.List[client.Project]{Items: []client.Project{}}
	for i := range ps {
		out.Items = append(out.Items, apiProject(&ps[i]))
	}
	return c.JSON(http.StatusOK, out)
}

func serviceError(err error) error {
	switch {
	case errors.Is(err, services.ErrServiceNotFound):
		return abierrors.Wrap(abierrors.ServiceNotFound, deploy.TrimSentinel(err), nil)
	case errors.Is(err, services.ErrRevisionConflict):
		return abierrors.Wrap(abierrors.RevisionConflict, deploy.TrimSentinel(err), nil)
	case errors.Is(err, services.ErrDomainTaken):
		return abierrors.Wrap(abierrors.AlreadyExists, deploy.TrimSentinel(err), nil)
	case errors.Is(err, services.ErrPlacementModeImmutable):
		return abierrors.Wrap(abierrors.PlacementModeImmutable, deploy.TrimSentinel(err), nil)
	case errors.Is(err, services.ErrServiceDeleting):
		return abierrors.Wrap(abierrors.ServiceDeleting, deploy.TrimSentinel(err), nil)
	case errors.Is(err, changelog.ErrEntryTooLarge):
		return abierrors.Wrap(abierrors.ChangeTooLarge, deploy.TrimSentinel(err)+"; make the service smaller (env values, command)", nil)
	}
	return err
}

func (s *Server) putService(c echo.Context) error {
	name := c.Param("name")
	if err := checkName("project", c.Param("project")); err != nil {
		return err
	}
	if err := checkName("service", name); err != nil {
		return err
	}
	var spec serviceSpec
	if err := s.bind(c, &spec); err != nil {
		return err
	}
	if err := deploy.ValidateSpec(name, &spec); err != nil {
		return err
	}
	p, err := s.project(c, true)
	if err != nil {
		return err
	}
	ch := s.change(c, deploy.CauseAPIPut, p, name, spec.ExpectedRevision)
	ch.Spec = &spec
	wctx, done := s.changeCtx(c)
	res, err := s.deployer.Apply(wctx, ch)
	done()
	s.policyWarnings(c, res.Warnings)
	if err != nil {
		return deployError(err)
	}
	out := res.Service
	if !res.Changed() {
		// Nothing was written, so nothing is recorded in the change log and no pass is asked for.
		s.log.Info("service unchanged", "project", p.Name, "service", name, "revision", out.Revision)
		return c.JSON(http.StatusOK, appliedService(out, false))
	}
	s.log.Info("service applied", "project", p.Name, "service", name, "revision", out.Revision, "replicas", out.Replicas, "bundle", out.BundleDigest)
	// The write is committed with its reconcile request: its work starts while the change log
	// records it.
	s.awaitChange(c, "services", out.ID, out.LogOutbox)
	status := http.StatusOK
	if res.Outcome == services.PutCreated {
		status = http.StatusCreated
	}
	return c.JSON(status, appliedService(out, true))
}

// appliedService is the answer of PUT /projects/{p}/services/{s}: the service with changed
// saying whether the apply wrote it (docs/api.md section 4).
func appliedService(svc *services.Service, changed bool) client.Service {
	out := toAPIService(svc, 0)
	out.Changed = &changed
	return out
}

func (s *Server) getService(c echo.Context) error {
	if err := checkName("service", c.Param("name")); err != nil {
		return err
	}
	p, err := s.project(c, false)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	svc, err := s.cfg.Catalog.GetService(ctx, p, c.Param("name"))
	if err != nil {
		return serviceError(err)
	}
	wls, err := s.cfg.Catalog.FindWorkloads(ctx, services.WorkloadFilter{ServiceID: svc.ID})
	if err != nil {
		return err
	}
	n := 0
	for i := range wls {
		if ready(&wls[i]) {
			n++
		}
	}
	out := toAPIService(svc, n)
	if err := s.views().Annotate(ctx, svc, &out); err != nil {
		return err
	}
	if svc.TLS.Mode == certs.ModeACME || svc.TLS.Mode == certs.ModeManual {
		cs, err := s.certificateStatuses(ctx, svc.Domains)
		if err != nil {
			return err
		}
		for _, d := range svc.Domains {
			if st, ok := cs[d]; ok {
				out.Certificates = append(out.Certificates, st)
			} else {
				out.Certificates = append(out.Certificates, client.CertificateStatus{Hostname: d, State: string(certs.StatePending)})
			}
		}
	}
	return c.JSON(http.StatusOK, out)
}

func (s *Server) listServices(c echo.Context) error {
	p, err := s.project(c, false)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	svcs, err := s.cfg.Catalog.ListServices(ctx, p)
	if err != nil {
		return err
	}
	wls, err := s.cfg.Catalog.FindWorkloads(ctx, services.WorkloadFilter{ProjectID: p.ID})
	if err != nil {
		return err
	}
	readyBy := map[string]int{}
	for i := range wls {
		if ready(&wls[i]) {
			readyBy[wls[i].ServiceID]++
		}
	}
	out := client.List[client.Service]{Items: []client.Service{}}
	for i := range svcs {
		a := toAPIService(&svcs[i], readyBy[svcs[i].ID])
		if err := s.views().Annotate(ctx, &svcs[i], &a); err != nil {
			return err
		}
		out.Items = append(out.Items, a)
	}
	return c.JSON(http.StatusOK, out)
}

func (s *Server) deleteService(c echo.Context) error {
	if err := checkName("service", c.Param("name")); err != nil {
		return err
	}
	var expected *int64
	if v := c.QueryParam("expected_revision"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return problem(abierrors.BadRequest, "expected_revision must be a non-negative integer")
		}
		expected = &n
	}
	var purge bool
	switch v := c.QueryParam("purge_volumes"); v {
	case "", "false":
	case "true":
		purge = true
	default:
		return problem(abierrors.BadRequest, "purge_volumes must be true or false")
	}
	p, err := s.project(c, false)
	if err != nil {
		return err
	}
	if err := s.admitDelete(c, p, c.Param("name")); err != nil {
		return err
	}
	wctx, done := s.changeCtx(c)
	gone, err := s.cfg.Catalog.MarkDeletingWith(wctx, p, c.Param("name"), expected, purge)
	done()
	if err != nil {
		return serviceError(err)
	}
	s.log.Info("service deleting: its routes are withdrawn and its slots settle before it is removed", "project", p.Name, "service", c.Param("name"))
	s.awaitChange(c, "services", gone.ID, gone.LogOutbox)
	return c.JSON(http.StatusAccepted, toAPIService(gone, 0))
}

func (s *Server) listWorkloads(c echo.Context) error {
	var filter services.WorkloadFilter
	if c.Param("project") != "" {
		p, err := s.project(c, false)
		if err != nil {
			return err
		}
		filter.ProjectID = p.ID
	}
	filter.Service = c.QueryParam("service")
	wls, err := s.cfg.Catalog.FindWorkloads(c.Request().Context(), filter)
	if err != nil {
		return err
	}
	out := client.List[client.Workload]{Items: []client.Workload{}}
	for i := range wls {
		out.Items = append(out.Items, toAPIWorkload(&wls[i]))
	}
	return c.JSON(http.StatusOK, out)
}

func (s *Server) apiNode(n *nodes.Node, workloads int) client.Node {
	out := client.Node{
		ID: n.ID, Hostname: n.Hostname, Region: n.Region, Labels: n.Labels, Address: n.Address,
		Capacity: client.Capacity{CPUs: n.CPUs, MemoryMB: n.MemoryMB}, Status: n.ShownStatus(), Session: n.Status,
		DesiredRev: n.DesiredRev, AppliedRev: n.AppliedRev, Workloads: workloads, EnrolledAt: n.EnrolledAt, LastSeenAt: n.LastSeenAt,
		AgentVersion: n.AgentVersion, Allocatable: apiResources(n.Allocatable), Schedulable: apiResources(n.Capacity()),
		ResourceLimits: n.ResourceLimits, Cordoned: n.Cordoned,
	}
	if o := n.CapacityOverride; o != nil {
		r := apiResources(*o)
		out.CapacityOverride = &r
	}
	if r := n.Retirement; r != nil {
		out.Retirement = r.Disposition + "/" + r.State
	}
	// The stored time is written at most every 30 s; a live session here knows the last frame.
	if lf, ok := s.cfg.Sessions.(lastFramer); ok {
		if at, ok := lf.LastFrame(n.ID); ok && (out.LastSeenAt == nil || at.After(*out.LastSeenAt)) {
			out.LastSeenAt = &at
		}
	}
	return out
}

// apiResources is r as the API shows it.
func apiResources(r nodes.Resources) client.Resources {
	return client.Resources{CPUMilli: r.CPUMilli, MemoryMiB: r.MemoryMiB, DiskMiB: r.DiskMiB, Extended: r.Extended}
}

// lastFramer is the optional part of [Config.Sessions] (*session.Server) that knows when a live
// session last sent a frame.
type lastFramer interface {
	LastFrame(nodeID string) (time.Time, bool)
}

func (s *Server) listNodes(c echo.Context) error {
	ctx := c.Request().Context()
	ns, err := s.cfg.Nodes.List(ctx)
	if err != nil {
		return err
	}
	wls, err := s.cfg.Catalog.ListWorkloads(ctx, nil)
	if err != nil {
		return err
	}
	count := map[string]int{}
	for _, w := range wls {
		count[w.NodeID]++
	}
	out := client.List[client.Node]{Items: []client.Node{}}
	for i := range ns {
		n := s.apiNode(&ns[i], count[ns[i].ID])
		if n.Drain, err = s.views().DrainProgress(ctx, &ns[i], s.cfg.Leases, s.now()); err != nil {
			return err
		}
		out.Items = append(out.Items, n)
	}
	return c.JSON(http.StatusOK, out)
}

func (s *Server) getNode(c echo.Context) error {
	ctx := c.Request().Context()
	n, err := s.cfg.Nodes.Get(ctx, c.Param("id"))
	if errors.Is(err, nodes.ErrNotFound) {
		return problem(abierrors.NodeNotFound, fmt.Sprintf("no node %q", c.Param("id")))
	} else if err != nil {
		return err
	}
	wls, err := s.cfg.Catalog.FindWorkloads(ctx, services.WorkloadFilter{NodeID: n.ID})
	if err != nil {
		return err
	}
	out := s.apiNode(n, len(wls))
	if out.Drain, err = s.views().DrainProgress(ctx, n, s.cfg.Leases, s.now()); err != nil {
		return err
	}
	return c.JSON(http.StatusOK, out)
}

func (s *Server) pushBundle(c echo.Context) error {
	if err := checkName("project", c.Param("project")); err != nil {
		return err
	}
	name := c.QueryParam("name")
	if name != "" && !services.ValidName(name) {
		return problem(abierrors.InvalidName, fmt.Sprintf("bundle name %q must be a DNS label", name))
	}
	want := c.QueryParam("digest")
	if want != "" && !bundles.ValidDigest(want) {
		return problem(abierrors.BadRequest, "digest must be sha256:<64 lower-case hex digits>")
	}
	if ct := c.Request().Header.Get("Content-Type"); ct != "application/gzip" && ct != "application/x-gzip" && ct != "application/octet-stream" {
		return problem(abierrors.UnsupportedMedia, "a bundle is uploaded as application/gzip (a .tar.gz)")
	}
	p, err := s.project(c, true)
	if err != nil {
		return err
	}
	if err := s.checkFencing(c); err != nil {
		return err
	}
	body := http.MaxBytesReader(c.Response(), c.Request().Body, s.cfg.Bundles.MaxBytes())
	wctx, done := s.changeCtx(c)
	m, err := s.cfg.Bundles.Put(wctx, p.ID, p.Name, name, want, body)
	done()
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe), errors.Is(err, bundles.ErrTooLarge):
		return problem(abierrors.BodyTooLarge, fmt.Sprintf("bundle is larger than the limit of %d bytes", s.cfg.Bundles.MaxBytes()))
	case errors.Is(err, bundles.ErrDigestMismatch):
		return problem(abierrors.DigestMismatch, deploy.TrimSentinel(err))
	case errors.Is(err, bundle.ErrInvalid), errors.Is(err, bundle.ErrTooLarge):
		return abierrors.Wrap(abierrors.BundleInvalid, err.Error(), nil)
	case err != nil:
		return err
	}
	s.log.Info("bundle pushed", "project", p.Name, "digest", m.Digest, "size", m.Size, "name", m.Name)
	out := client.Bundle{Digest: m.Digest, Size: m.Size, Name: m.Name, Project: m.Project, CreatedAt: m.CreatedAt}
	s.awaitChange(c, "bundles", m.ID, m.LogOutbox)
	return c.JSON(http.StatusCreated, out)
}

func (s *Server) listBundles(c echo.Context) error {
	p, err := s.project(c, false)
	if err != nil {
		return err
	}
	ms, err := s.cfg.Bundles.List(c.Request().Context(), p.ID)
	if err != nil {
		return err
	}
	out := client.List[client.Bundle]{Items: []client.Bundle{}}
	for _, m := range ms {
		out.Items = append(out.Items, client.Bundle{Digest: m.Digest, Size: m.Size, Name: m.Name, Project: m.Project, CreatedAt: m.CreatedAt})
	}
	return c.JSON(http.StatusOK, out)
}

func (s *Server) downloadBundle(c echo.Context) error {
	digest := c.Param("digest")
	if !bundles.ValidDigest(digest) {
		return problem(abierrors.BadRequest, "digest must be sha256:<64 lower-case hex digits>")
	}
	f, size, err := s.cfg.Bundles.Open(c.Request().Context(), digest)
	if errors.Is(err, bundles.ErrNotFound) {
		return problem(abierrors.BundleNotFound, "no bundle "+digest)
	} else if err != nil {
		return err
	}
	defer f.Close()
	h := c.Response().Header()
	h.Set("Content-Type", "application/gzip")
	h.Set("Content-Length", strconv.FormatInt(size, 10))
	h.Set("Docker-Content-Digest", digest)
	h.Set("Cache-Control", "immutable, max-age=31536000")
	if rs, ok := f.(io.ReadSeeker); ok {
		http.ServeContent(c.Response(), c.Request(), "", time.Time{}, rs)
		return nil
	}
	c.Response().WriteHeader(http.StatusOK)
	_, _ = io.Copy(c.Response(), f)
	return nil
}

// replicaResources is what one replica of a service reserves, as the API shows it.
func replicaResources(r services.Resources) client.Resources {
	return client.Resources{CPUMilli: r.CPUMilli, MemoryMiB: r.MemoryMiB, Extended: r.Extended}
}
