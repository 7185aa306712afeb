package ui

import (
	"context"
	"net/http"

	"github.com/berthhq/berth/sdk/client"
)

// The jobs page (docs/ui.md section 1): every job of every project the viewer may read (GET
// /projects/{project}/jobs: schedule, policy, suspension and newest run), then berthd's own
// periodic work (GET /platform-jobs: each task's last pass), as `berth job ls` and `berth job
// ls --platform` show them.

// jobRow is one job with the name of its project.
type jobRow struct {
	Project string
	Job     client.Job
}

// jobsData is what the jobs page shows. Off says the API serves no jobs; PlatformDenied holds
// the API's refusal of the platform list (it needs nodes:read), PlatformOff that it serves none.
type jobsData struct {
	Rows           []jobRow
	Denied         int
	Off            bool
	Platform       []client.PlatformJob
	PlatformDenied string
	PlatformOff    bool
}

// loadJobs lists the jobs of every project the viewer may read, and the platform jobs, through
// the API.
func loadJobs(ctx context.Context, c *client.Client) (*jobsData, error) {
	projects, err := c.ListProjects(ctx)
	if err != nil {
		return nil, err
	}
	d := &jobsData{}
	for _, p := range projects {
		js, err := c.Jobs(ctx, p.Name)
		if client.IsCode(err, "forbidden") {
			d.Denied++
			continue
		}
		if apiStatus(err) == http.StatusNotFound && !client.IsCode(err, "project_not_found") {
			d.Off = true
			break
		}
		if err != nil {
			return nil, err
		}
		for _, j := range js {
			d.Rows = append(d.Rows, jobRow{Project: p.Name, Job: j})
		}
	}
	pj, err := c.PlatformJobs(ctx)
	switch {
	case client.IsCode(err, "forbidden"):
		d.PlatformDenied = err.Error()
	case apiStatus(err) == http.StatusNotFound:
		d.PlatformOff = true
	case err != nil:
		return nil, err
	default:
		d.Platform = pj
	}
	return d, nil
}

func (h *Handler) jobsPage(w http.ResponseWriter, r *http.Request, v *viewer) {
	h.page(w, r, v, "jobs", "Jobs", nil)
}
