package ui

import (
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/berthhq/berth/sdk/client"
)

// The deploy form (docs/ui.md sections 1 and 2): a new service written through the API's own
// service write (PUT /api/v1/projects/{project}/services/{name}, scope service:deploy), the
// route `berth apply` uses, with its admission, its validation and the form's Idempotency-Key.
// The dashboard checks nothing of the spec itself: what the API refuses is shown in its words.

// deployForm is what the deploy form holds, as typed: rendered back unchanged after a refusal.
// It has no environment field: the dashboard renders no environment value, and a form that
// echoed one back would.
type deployForm struct {
	Project    string
	Name       string
	Runtime    string // "process" (a bundle) or "containerd" (an image)
	Bundle     string
	Image      string
	Command    string // one argument per line
	Replicas   string
	Port       string
	HealthPath string
}

// deployData is what the deploy page shows: the form, the projects the viewer may name, a
// fresh Idempotency-Key, and the API's refusal of the last submit (Problem, with its HTTP
// status) or the dashboard's own (Error: a number that is not one).
type deployData struct {
	Form     deployForm
	Projects []string
	Idem     string
	Problem  *client.Problem
	Error    string
}

// maxDeployArgs bounds the command lines the form takes (the API bounds their size).
const maxDeployArgs = 256

// deployPage shows the deploy form, empty but for the default project and one replica.
func (h *Handler) deployPage(w http.ResponseWriter, r *http.Request, v *viewer) {
	h.renderDeploy(w, r, v, http.StatusOK, &deployData{Form: deployForm{Project: "default", Runtime: "process", Replicas: "1"}})
}

// renderDeploy renders the deploy page with d, a fresh Idempotency-Key and the viewer's
// projects (for the project field's suggestions; a failed list suggests none).
func (h *Handler) renderDeploy(w http.ResponseWriter, r *http.Request, v *viewer, code int, d *deployData) {
	c, ctx := h.client(r, v.Bearer)
	if ps, err := c.ListProjects(ctx); err == nil {
		for _, p := range ps {
			d.Projects = append(d.Projects, p.Name)
		}
	}
	d.Idem = newFormKey()
	h.render(w, r, code, "deploy", &pageData{Viewer: v, Title: "Deploy a service", Nav: "services", Data: d})
}

// deploy creates the service the form describes through the API's service write, with
// expected_revision 0 (the service must not exist yet: the form never replaces one) and the
// form's Idempotency-Key, so a form submitted twice is one write. On success the browser goes
// to the service's page, whose live region follows the rollout; a refusal renders the form
// again with what was typed and the API's problem (status, detail, code, a policy's reasons).
func (h *Handler) deploy(w http.ResponseWriter, r *http.Request, v *viewer) {
	f := deployForm{
		Project: strings.TrimSpace(r.PostFormValue("project")), Name: strings.TrimSpace(r.PostFormValue("name")),
		Runtime: r.PostFormValue("runtime"), Bundle: strings.TrimSpace(r.PostFormValue("bundle")),
		Image: strings.TrimSpace(r.PostFormValue("image")), Command: r.PostFormValue("command"),
		Replicas: strings.TrimSpace(r.PostFormValue("replicas")), Port: strings.TrimSpace(r.PostFormValue("port")),
		HealthPath: strings.TrimSpace(r.PostFormValue("health_path")),
	}
	spec, err := f.spec()
	if err != nil {
		h.renderDeploy(w, r, v, http.StatusBadRequest, &deployData{Form: f, Error: err.Error()})
		return
	}
	if f.Project == "" || f.Name == "" {
		h.renderDeploy(w, r, v, http.StatusBadRequest, &deployData{Form: f, Error: "Name the project and the service."})
		return
	}
	c, ctx := h.client(r, v.Bearer)
	c = c.WithIdempotencyKey(formKey(r))
	if _, err := c.ApplyService(ctx, f.Project, f.Name, spec); err != nil {
		var apiErr *client.APIError
		if !errors.As(err, &apiErr) {
			h.apiError(w, r, err)
			return
		}
		if apiErr.Status == http.StatusUnauthorized && apiErr.Problem.Code == "unauthenticated" {
			h.toLogin(w, r)
			return
		}
		p := apiErr.Problem
		if p.Code == "revision_conflict" {
			p.Detail = "A service " + f.Project + "/" + f.Name + " exists already; this form only creates services. " + p.Detail
		}
		h.renderDeploy(w, r, v, apiErr.Status, &deployData{Form: f, Problem: &p})
		return
	}
	h.log.Info("dashboard deploy", "project", f.Project, "service", f.Name, "by", v.Name)
	http.Redirect(w, r, serviceURL(f.Project, f.Name), http.StatusSeeOther)
}

// spec is the service spec the form describes. Only what the form cannot say in a spec is
// refused here (a count that is not a whole number); every value is the API's to judge.
func (f deployForm) spec() (client.ServiceSpec, error) {
	var s client.ServiceSpec
	zero := int64(0)
	s.ExpectedRevision = &zero
	for _, line := range strings.Split(f.Command, "\n") {
		if arg := strings.TrimRight(line, "\r"); strings.TrimSpace(arg) != "" {
			s.Command = append(s.Command, arg)
		}
	}
	if len(s.Command) > maxDeployArgs {
		return s, errors.New("The command has more than " + strconv.Itoa(maxDeployArgs) + " arguments.")
	}
	switch f.Runtime {
	case "", "process":
		s.Bundle = f.Bundle
	case "containerd":
		s.Runtime, s.Image, s.Bundle = "containerd", f.Image, f.Bundle
	default:
		return s, errors.New("The runtime is process or containerd.")
	}
	if f.Replicas != "" {
		n, err := strconv.Atoi(f.Replicas)
		if err != nil {
			return s, errors.New("Replicas must be a whole number.")
		}
		s.Replicas = &n
	}
	if f.Port != "" {
		n, err := strconv.Atoi(f.Port)
		if err != nil {
			return s, errors.New("The port must be a whole number.")
		}
		s.Port = n
	}
	s.HealthCheck.Path = f.HealthPath
	return s, nil
}
