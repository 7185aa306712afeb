package ui

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"github.com/berthhq/berth/sdk/client"
)

// The bindings and backups page (docs/ui.md section 1): every service binding of every project
// the viewer may read (GET /projects/{project}/bindings), its backups newest first with the
// last restore drill of each (GET /projects/{project}/backups), and a restore form per
// restorable backup that posts the API's restore (POST /projects/{project}/backups/{id}/restore),
// as `berth backup ls` and `berth backup restore` do. Bindings never carry a credential on
// these routes; the page shows no secret name either.

// bindingRow is one binding with its project and the backups of it, newest first.
type bindingRow struct {
	Project string
	Binding client.ServiceBinding
	Backups []client.Backup
}

// backupsData is what the bindings and backups page shows. Orphans are backups of a binding the
// binding list does not hold (released since, or bindings unavailable); BindingsOff holds the
// API's answer when this berthd serves no bindings, BackupsOff says it serves no backups, and
// Denied counts the projects the viewer may not read.
type backupsData struct {
	Bindings    []bindingRow
	Orphans     []bindingRow
	BindingsOff string
	BackupsOff  bool
	Denied      int
}

// maxBackupsPerBinding is how many backups of one binding the page lists (the newest).
const maxBackupsPerBinding = 10

// loadBackups lists the bindings and backups of every project the viewer may read through the
// API, one read of each per project.
func loadBackups(ctx context.Context, c *client.Client) (*backupsData, error) {
	projects, err := c.ListProjects(ctx)
	if err != nil {
		return nil, err
	}
	d := &backupsData{}
	for _, p := range projects {
		bs, err := c.ListServiceBindings(ctx, p.Name, "")
		switch {
		case client.IsCode(err, "forbidden"):
			d.Denied++
			continue
		case apiStatus(err) == http.StatusServiceUnavailable:
			d.BindingsOff = errText(err)
			bs = nil
		case err != nil:
			return nil, err
		}
		var bks []client.Backup
		if !d.BackupsOff {
			bks, err = c.ListBackups(ctx, p.Name, "")
			switch {
			case apiStatus(err) == http.StatusNotFound && !client.IsCode(err, "project_not_found"):
				d.BackupsOff = true
			case err != nil:
				return nil, err
			}
		}
		byKey := map[string]int{}
		for _, b := range bs {
			byKey[b.Service+"/"+b.Name] = len(d.Bindings)
			d.Bindings = append(d.Bindings, bindingRow{Project: p.Name, Binding: b})
		}
		orphans := map[string]int{}
		for _, bk := range bks { // newest first, as the API lists them
			k := bk.Service + "/" + bk.Binding
			if i, ok := byKey[k]; ok {
				if len(d.Bindings[i].Backups) < maxBackupsPerBinding {
					d.Bindings[i].Backups = append(d.Bindings[i].Backups, bk)
				}
				continue
			}
			i, ok := orphans[k]
			if !ok {
				i = len(d.Orphans)
				orphans[k] = i
				d.Orphans = append(d.Orphans, bindingRow{Project: p.Name, Binding: client.ServiceBinding{Service: bk.Service, Name: bk.Binding, Kind: bk.Kind}})
			}
			if len(d.Orphans[i].Backups) < maxBackupsPerBinding {
				d.Orphans[i].Backups = append(d.Orphans[i].Backups, bk)
			}
		}
	}
	return d, nil
}

func (h *Handler) backupsPage(w http.ResponseWriter, r *http.Request, v *viewer) {
	h.page(w, r, v, "backups", "Bindings and backups", nil)
}

// restoreForm is what the restore form was sent with: the backup, the target service (empty:
// the backup's own) and where to restore (mode "" the live resource of a stopped service,
// "scratch" a scratch resource beside it, "running" the live resource of a running service).
type restoreForm struct {
	Project, ID, Into, Mode string
}

// restoreData is what the restore page shows: the backup, the form as typed, the API's
// refusal of the last submit or its acceptance.
type restoreData struct {
	Backup   *client.Backup
	Form     restoreForm
	Problem  *client.Problem
	Accepted *client.RestoreAccepted
	Idem     string
}

// restorePage shows the restore form of one backup (the backup read through the API's
// backup list of its service, so a backup the viewer may not read is the API's refusal).
func (h *Handler) restorePage(w http.ResponseWriter, r *http.Request, v *viewer) {
	f := restoreForm{Project: r.PathValue("project"), ID: r.PathValue("id")}
	h.renderRestore(w, r, v, http.StatusOK, &restoreData{Form: f})
}

// renderRestore renders the restore page with d, reading the backup d names.
func (h *Handler) renderRestore(w http.ResponseWriter, r *http.Request, v *viewer, code int, d *restoreData) {
	c, ctx := h.client(r, v.Bearer)
	bk, err := findBackup(ctx, c, d.Form.Project, d.Form.ID)
	if err != nil {
		h.apiError(w, r, err)
		return
	}
	if bk == nil {
		h.renderError(w, r, http.StatusNotFound, "There is no backup "+d.Form.ID+" in project "+d.Form.Project+".")
		return
	}
	d.Backup = bk
	if d.Idem == "" {
		d.Idem = newFormKey()
	}
	h.render(w, r, code, "restore", &pageData{Viewer: v, Title: "Restore " + d.Form.ID, Nav: "backups", Data: d})
}

// findBackup reads backup id of project through the API's backup list; nil when there is none.
func findBackup(ctx context.Context, c *client.Client, project, id string) (*client.Backup, error) {
	bks, err := c.ListBackups(ctx, project, "")
	if err != nil {
		return nil, err
	}
	for i := range bks {
		if bks[i].ID == id {
			return &bks[i], nil
		}
	}
	return nil, nil
}

// restore posts the form's restore to the API with the form's Idempotency-Key. The API's
// answer is shown on the restore page: the operation it queued, or its refusal (such as
// restore_target_running) beside the form as typed.
func (h *Handler) restore(w http.ResponseWriter, r *http.Request, v *viewer) {
	f := restoreForm{Project: r.PathValue("project"), ID: r.PathValue("id"),
		Into: strings.TrimSpace(r.PostFormValue("into")), Mode: r.PostFormValue("mode")}
	req := client.RestoreRequest{Into: f.Into}
	switch f.Mode {
	case "":
	case "scratch":
		req.IntoScratch = true
	case "running":
		req.WhileRunning = true
	default:
		h.renderError(w, r, http.StatusBadRequest, "The restore form's mode is the stopped service, a scratch resource or the running service.")
		return
	}
	key := formKey(r)
	c, ctx := h.client(r, v.Bearer)
	acc, err := c.WithIdempotencyKey(key).RestoreBackup(ctx, f.Project, f.ID, req)
	if err != nil {
		var apiErr *client.APIError
		if !errors.As(err, &apiErr) || apiErr.Status == http.StatusUnauthorized {
			h.apiError(w, r, err)
			return
		}
		// A refusal is not kept for the form: the form shown again carries a fresh key, so
		// its next submit (typed differently, or once the service stopped) is a new request.
		p := apiErr.Problem
		h.renderRestore(w, r, v, apiErr.Status, &restoreData{Form: f, Problem: &p})
		return
	}
	h.log.Info("dashboard restore", "project", f.Project, "backup", f.ID, "operation", acc.OperationID, "by", v.Name)
	h.renderRestore(w, r, v, http.StatusAccepted, &restoreData{Form: f, Accepted: acc, Idem: key})
}
