package api

import (
	"errors"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/jobs"
	"github.com/berthhq/berth/core/services"
)

// registerJobs adds the job routes (docs/jobs.md section 7).
func (s *Server) registerJobs(v1 *echo.Group) {
	v1.GET("/projects/:project/jobs", s.listJobs, s.auth(identity.ScopeServicesRead))
	v1.GET("/projects/:project/jobs/:name/runs", s.jobRuns, s.auth(identity.ScopeServicesRead))
	v1.POST("/projects/:project/jobs/:name/run", s.runJob, s.auth(identity.ScopeServiceDeploy))
	v1.POST("/projects/:project/jobs/:name/suspend", s.suspendJob(true), s.auth(identity.ScopeServiceDeploy))
	v1.POST("/projects/:project/jobs/:name/resume", s.suspendJob(false), s.auth(identity.ScopeServiceDeploy))
	v1.GET("/projects/:project/job-runs/:run", s.getJobRun, s.auth(identity.ScopeServicesRead))
	v1.POST("/projects/:project/job-runs/:run/cancel", s.cancelJobRun, s.auth(identity.ScopeServiceDeploy))
	v1.POST("/projects/:project/services/:name/run", s.runCommand, s.auth(identity.ScopeServiceDeploy))
	if s.cfg.NodeOps != nil {
		v1.GET("/projects/:project/job-runs/:run/logs", s.jobRunLogs, s.auth(identity.ScopeServicesRead))
	}
}

// jobView is one job as GET .../jobs lists it.
type jobView struct {
	Name        string    `json:"name"`
	Revision    int64     `json:"revision"`
	Schedule    string    `json:"schedule,omitempty"`
	TimeZone    string    `json:"time_zone,omitempty"`
	Concurrency string    `json:"concurrency"`
	TimeoutS    int       `json:"timeout_s,omitempty"`
	Retries     int       `json:"retries,omitempty"`
	Suspended   bool      `json:"suspended,omitempty"`
	LastRun     *jobs.Run `json:"last_run,omitempty"`
}

// listJobs serves GET /api/v1/projects/{p}/jobs: every job of the project with its newest run.
func (s *Server) listJobs(c echo.Context) error {
	p, err := s.project(c, false)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	svcs, err := s.cfg.Catalog.ListServices(ctx, p)
	if err != nil {
		return err
	}
	out := []jobView{}
	for i := range svcs {
		svc := &svcs[i]
		if !svc.IsJob() || svc.Job == nil {
			continue
		}
		v := jobView{Name: svc.Name, Revision: svc.Revision, Schedule: svc.Job.Schedule, TimeZone: svc.Job.TimeZone,
			Concurrency: svc.Job.Concurrency, TimeoutS: svc.Job.TimeoutS, Retries: svc.Job.Retries, Suspended: svc.Job.Suspended}
		runs, err := s.cfg.Jobs.Runs(ctx, jobs.JobKey(p.Name, svc.Name))
		if err != nil {
			return err
		}
		if len(runs) > 0 {
			v.LastRun = &runs[len(runs)-1]
		}
		out = append(out, v)
	}
	return c.JSON(http.StatusOK, map[string]any{"jobs": out})
}

// namedJob reads the job of the request's :project and :name; a service of kind service is
// 404 not_found.
func (s *Server) namedJob(c echo.Context) (*services.Project, *services.Service, error) {
	p, svc, err := s.namedService(c)
	if err != nil {
		return nil, nil, err
	}
	if !svc.IsJob() {
		return nil, nil, problem(abierrors.NotFound, "no job "+svc.Name+" in project "+p.Name+": it is a service")
	}
	return p, svc, nil
}

// jobRuns serves GET /api/v1/projects/{p}/jobs/{name}/runs: its runs, oldest first; of a
// service, the runs of its one-off commands (docs/jobs.md section 9).
func (s *Server) jobRuns(c echo.Context) error {
	p, svc, err := s.namedService(c)
	if err != nil {
		return err
	}
	runs, err := s.cfg.Jobs.Runs(c.Request().Context(), jobs.JobKey(p.Name, svc.Name))
	if err != nil {
		return err
	}
	if runs == nil {
		runs = []jobs.Run{}
	}
	return c.JSON(http.StatusOK, map[string]any{"runs": runs})
}

// runJob serves POST /api/v1/projects/{p}/jobs/{name}/run (berth job run): a manual run,
// placed at once when a node fits; 201 with the run.
func (s *Server) runJob(c echo.Context) error {
	_, svc, err := s.namedJob(c)
	if err != nil {
		return err
	}
	if svc.Deleting {
		return serviceError(services.ErrServiceDeleting)
	}
	run, err := s.cfg.Jobs.Trigger(c.Request().Context(), svc)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, run)
}

// suspendJob serves POST .../jobs/{name}/suspend and /resume through the deployer (cause
// job.control).
func (s *Server) suspendJob(suspended bool) echo.HandlerFunc {
	return func(c echo.Context) error {
		p, svc, err := s.namedJob(c)
		if err != nil {
			return err
		}
		ch := s.change(c, "", p, svc.Name, nil)
		wctx, done := s.changeCtx(c)
		res, err := s.deployer.SuspendJob(wctx, ch, suspended)
		done()
		s.policyWarnings(c, res.Warnings)
		if err != nil {
			return deployError(err)
		}
		if res.Changed() {
			s.awaitChange(c, "services", res.Service.ID, res.Service.LogOutbox)
		}
		return c.JSON(http.StatusOK, map[string]any{"name": svc.Name, "suspended": suspended, "revision": res.Service.Revision})
	}
}

// runOf reads the run named by :run ("<job>@<instant>") of the request's project.
func (s *Server) runOf(c echo.Context) (*jobs.Run, error) {
	p, err := s.project(c, false)
	if err != nil {
		return nil, err
	}
	name := c.Param("run")
	job, _, ok := strings.Cut(name, "@")
	if !ok || checkName("job", job) != nil {
		return nil, problem(abierrors.ValidationFailed, "a run is named <job>@<instant>, as berth job runs prints it")
	}
	r, err := s.cfg.Jobs.Get(c.Request().Context(), p.Name+"/"+name)
	if errors.Is(err, jobs.ErrRunNotFound) {
		return nil, problem(abierrors.NotFound, "no run "+name+" in project "+p.Name)
	}
	return r, err
}

// getJobRun serves GET /api/v1/projects/{p}/job-runs/{run}.
func (s *Server) getJobRun(c echo.Context) error {
	r, err := s.runOf(c)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, r)
}

// cancelJobRun serves POST /api/v1/projects/{p}/job-runs/{run}/cancel: a live run is stopped
// and recorded cancelled; an ended one is answered as it is.
func (s *Server) cancelJobRun(c echo.Context) error {
	r, err := s.runOf(c)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	if err := s.cfg.Jobs.Cancel(ctx, r.ID, "cancelled by an operator"); err != nil {
		return err
	}
	if r, err = s.cfg.Jobs.Get(ctx, r.ID); err != nil {
		return err
	}
	return c.JSON(http.StatusOK, r)
}

// commandRequest is the body of POST .../services/{name}/run.
type commandRequest struct {
	Command  []string `json:"command"`
	TimeoutS int      `json:"timeout_s"`
}

// runCommand serves POST /api/v1/projects/{p}/services/{name}/run (berth run): a one-off
// command in the environment of a service or job (docs/jobs.md section 9), admitted by the
// service.apply policies (cause job.command), then recorded and placed as a run; 201 with the
// run. Errors: validation_failed, secret_use_forbidden, policy_denied, not found.
func (s *Server) runCommand(c echo.Context) error {
	var req commandRequest
	if err := s.bind(c, &req); err != nil {
		return err
	}
	cr := jobs.CommandRequest{Command: req.Command, TimeoutS: req.TimeoutS}
	if err := cr.Validate(); err != nil {
		return err
	}
	p, svc, err := s.namedService(c)
	if err != nil {
		return err
	}
	ctx, done := s.changeCtx(c)
	defer done()
	svc, warnings, err := s.deployer.AdmitCommand(ctx, s.change(c, "", p, svc.Name, nil), cr.Command)
	s.policyWarnings(c, warnings)
	if err != nil {
		return deployError(err)
	}
	run, err := s.cfg.Jobs.RunCommand(ctx, svc, cr)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, run)
}

// jobRunLogs serves GET /api/v1/projects/{p}/job-runs/{run}/logs?tail=N[&follow=true]: the
// run's output read from its node through the workload logs path (the run's workload id), once
// or followed. Errors: not_found for a run that never ran, unavailable while it is not placed
// yet or its node has no live session.
func (s *Server) jobRunLogs(c echo.Context) error {
	r, err := s.runOf(c)
	if err != nil {
		return err
	}
	if r.WorkloadID == "" || r.NodeID == "" {
		if r.State.Final() {
			return problem(abierrors.NotFound, "run "+r.Name()+" never ran ("+string(r.State)+"): it has no output")
		}
		return problem(abierrors.Unavailable, "run "+r.Name()+" is not placed on a node yet; try again when it runs")
	}
	return s.logs(c, r.NodeID, r.WorkloadID)
}

// listPlatformJobs serves GET /api/v1/platform-jobs: every platform task (registry garbage
// collection, the expiry of idempotency records, backup schedules) with its last pass and the
// passes kept before it (docs/jobs.md section 10).
func (s *Server) listPlatformJobs(c echo.Context) error {
	tasks, err := s.cfg.Platform.List(c.Request().Context())
	if err != nil {
		return err
	}
	if tasks == nil {
		tasks = []jobs.PlatformTask{}
	}
	return c.JSON(http.StatusOK, map[string]any{"platform_jobs": tasks})
}
