package ui

import (
	"context"
	"errors"
	"net/http"
	"net/url"

	"github.com/berthhq/berth/sdk/client"
)

// Promoting a release (docs/ui.md section 2): a tag of a service's repository rolls the service
// to the digest the tag names through the API's promote route (POST
// .../services/NAME/releases/TAG/promote, scope service:deploy, the service write's admission),
// as `berth release promote` does. Like an undo it is shown first: the preview names the image
// the service runs, the digest it would run and the service's revision; the button promotes at
// exactly that revision, so a service changed in between is refused (revision_conflict).

// promoteData is what the promote page shows: the service as read, the release the tag names,
// and the API's refusal of the last submit.
type promoteData struct {
	Service *client.Service
	Release *client.ImageRelease
	Problem *client.Problem
	Idem    string
}

// promoteURL is the promote page of tag in the repository of service project/name.
func promoteURL(project, name, tag string) string {
	return serviceURL(project, name) + "/promote/" + url.PathEscape(tag)
}

// loadPromote reads the service and its release tag through the API; a nil release means the
// repository has no such tag.
func loadPromote(ctx context.Context, c *client.Client, project, name, tag string) (*promoteData, error) {
	svc, err := c.GetService(ctx, project, name)
	if err != nil {
		return nil, err
	}
	rels, err := c.ListImageReleases(ctx, project, name)
	if err != nil {
		return nil, err
	}
	d := &promoteData{Service: svc}
	for i := range rels {
		if rels[i].Tag == tag {
			d.Release = &rels[i]
		}
	}
	return d, nil
}

// promotePage shows what a promotion of the tag would change, and the button that does it.
func (h *Handler) promotePage(w http.ResponseWriter, r *http.Request, v *viewer) {
	h.renderPromote(w, r, v, http.StatusOK, nil)
}

// renderPromote renders the promote page as it stands now, with the API's refusal p if any.
func (h *Handler) renderPromote(w http.ResponseWriter, r *http.Request, v *viewer, code int, p *client.Problem) {
	project, name, tag := r.PathValue("project"), r.PathValue("name"), r.PathValue("tag")
	c, ctx := h.client(r, v.Bearer)
	d, err := loadPromote(ctx, c, project, name, tag)
	if err != nil {
		h.apiError(w, r, err)
		return
	}
	if d.Release == nil {
		h.renderError(w, r, http.StatusNotFound, "The repository "+project+"/"+name+" has no tag "+tag+".")
		return
	}
	d.Problem, d.Idem = p, "ui-"+randomToken()
	h.render(w, r, code, "promote", &pageData{Viewer: v, Title: "Promote " + project + "/" + name + ":" + tag, Nav: "registry", Data: d})
}

// promote promotes the tag at the revision the preview showed, with the form's
// Idempotency-Key; the browser then goes to the service's page, whose live region follows the
// rollout. A refusal (a policy's, revision_conflict, release_not_pushed, service_not_container)
// shows the preview again, read anew, with the API's problem and a fresh form.
func (h *Handler) promote(w http.ResponseWriter, r *http.Request, v *viewer) {
	project, name, tag := r.PathValue("project"), r.PathValue("name"), r.PathValue("tag")
	rev, ok := parseRevision(r.PostFormValue("expected_revision"))
	if !ok {
		h.renderError(w, r, http.StatusBadRequest, "The promote form has no revision. Open the promote page again.")
		return
	}
	c, ctx := h.client(r, v.Bearer)
	if _, err := c.WithIdempotencyKey(formKey(r)).PromoteRelease(ctx, project, name, tag, client.PromoteRequest{ExpectedRevision: &rev}); err != nil {
		var apiErr *client.APIError
		if !errors.As(err, &apiErr) || apiErr.Status == http.StatusUnauthorized {
			h.apiError(w, r, err)
			return
		}
		p := apiErr.Problem
		h.renderPromote(w, r, v, apiErr.Status, &p)
		return
	}
	h.log.Info("dashboard promote", "project", project, "service", name, "tag", tag, "by", v.Name)
	http.Redirect(w, r, serviceURL(project, name), http.StatusSeeOther)
}
