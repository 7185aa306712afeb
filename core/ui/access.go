package ui

import (
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/berthhq/berth/sdk/client"
)

// The actions of the tokens and users page (docs/ui.md section 2). Each is one call of the
// API's identity routes with the viewer's bearer: issuing a token (POST /tokens, tokens:write,
// the form's Idempotency-Key), revoking one (DELETE /tokens/NAME), creating a user (POST
// /users, admin and a recent login) and turning a user's password login off or ending its
// sessions (POST /users/NAME/credential, a recent login, at the generation the page showed).
// What the API refuses is shown with its code, reauthentication_required with the way to a
// fresh login. A token's bearer is rendered once, on the answer to the form that issued it.

// tokenScopes are the scopes the token form offers (a machine token cannot hold the
// human-only ones, which the API refuses anyway: scope_human_only).
var tokenScopes = []string{"services:read", "service:deploy", "services:write", "nodes:read", "tokens:write",
	"secret:read", "secret:write", "secret:use", "resource:read", "resource:write", "admin"}

// userRoles are the roles the user form offers.
var userRoles = []string{"viewer", "operator", "admin"}

// tokenForm is the token form as typed. ExpiresDays "" means the API's default.
type tokenForm struct {
	Name, Project, Service, ExpiresDays string
	Scopes                              []string
}

// Has reports whether the form selected scope s.
func (f tokenForm) Has(s string) bool {
	return slices.Contains(f.Scopes, s)
}

// tokenFormData is what the token form page shows.
type tokenFormData struct {
	Form    tokenForm
	Scopes  []string
	Problem *client.Problem
	Error   string
	Idem    string
}

// maxTokenDays bounds the form's lifetime in days (the API's bound is one year).
const maxTokenDays = 365

func (h *Handler) newTokenPage(w http.ResponseWriter, r *http.Request, v *viewer) {
	h.renderTokenForm(w, r, v, http.StatusOK, &tokenFormData{Form: tokenForm{Scopes: []string{"services:read"}}})
}

func (h *Handler) renderTokenForm(w http.ResponseWriter, r *http.Request, v *viewer, code int, d *tokenFormData) {
	d.Scopes = tokenScopes
	if d.Idem == "" {
		d.Idem = newFormKey()
	}
	h.render(w, r, code, "newtoken", &pageData{Viewer: v, Title: "Issue a token", Nav: "access", Data: d})
}

// createToken issues the token the form describes through the API with the form's
// Idempotency-Key (a resubmit of the same form is the API's replay of its answer, to the same
// bearer only) and answers the page that shows the bearer, not stored by any cache.
func (h *Handler) createToken(w http.ResponseWriter, r *http.Request, v *viewer) {
	if err := r.ParseForm(); err != nil {
		h.renderError(w, r, http.StatusBadRequest, "The token form could not be read.")
		return
	}
	f := tokenForm{Name: strings.TrimSpace(r.PostFormValue("name")), Project: strings.TrimSpace(r.PostFormValue("project")),
		Service: strings.TrimSpace(r.PostFormValue("service")), ExpiresDays: strings.TrimSpace(r.PostFormValue("expires_days")), Scopes: r.PostForm["scope"]}
	req := client.NewMachineToken{Name: f.Name, Scopes: f.Scopes, Project: f.Project, Service: f.Service}
	if f.ExpiresDays != "" {
		n, err := strconv.Atoi(f.ExpiresDays)
		if err != nil || n < 1 || n > maxTokenDays {
			h.renderTokenForm(w, r, v, http.StatusBadRequest, &tokenFormData{Form: f, Error: "Expires in is a whole number of days from 1 to " + strconv.Itoa(maxTokenDays) + ", or empty."})
			return
		}
		req.ExpiresIn = time.Duration(n) * 24 * time.Hour
	}
	c, ctx := h.client(r, v.Bearer)
	issued, err := c.WithIdempotencyKey(formKey(r)).CreateToken(ctx, req)
	if err != nil {
		if p, ok := h.problemOf(w, r, err); ok {
			h.renderTokenForm(w, r, v, p.Status, &tokenFormData{Form: f, Problem: p})
		}
		return
	}
	h.log.Info("dashboard issued a token", "token", issued.Info.Name, "by", v.Name)
	w.Header().Set("Cache-Control", "no-store")
	h.render(w, r, http.StatusCreated, "token", &pageData{Viewer: v, Title: "Token " + issued.Info.Name, Nav: "access", Data: issued})
}

// problemOf returns the API's problem in err (with its status) for a page to show beside its
// form. An error that is no problem, or a session the API no longer accepts, is answered here
// (the error page, or the login page) and ok is false.
func (h *Handler) problemOf(w http.ResponseWriter, r *http.Request, err error) (*client.Problem, bool) {
	var apiErr *client.APIError
	if !errors.As(err, &apiErr) || apiErr.Status == http.StatusUnauthorized && apiErr.Problem.Code == "unauthenticated" {
		h.apiError(w, r, err)
		return nil, false
	}
	p := apiErr.Problem
	p.Status = apiErr.Status
	return &p, true
}

// confirmData is what a confirmation page shows: the question, what the action does, and one
// form per button posting to Action with Fields, the button's op and its own Idempotency-Key.
type confirmData struct {
	Question, Text, Action, Back string
	Fields                       map[string]string
	Buttons                      []confirmButton
}

// confirmButton is one button of a confirmation page: its label, the op it posts ("" for none)
// and the Idempotency-Key of its form.
type confirmButton struct {
	Label, Op, Idem string
}

// revokeTokenPage asks before a token is revoked: the access page links it, so the action's
// form is never inside a live region a re-render could replace under the pointer.
func (h *Handler) revokeTokenPage(w http.ResponseWriter, r *http.Request, v *viewer) {
	name := r.PathValue("name")
	d := &confirmData{Question: "Revoke the token " + name + "?",
		Text:   "Every request with it is refused from then on, a dashboard session logged in with it too. A revoked token cannot be restored; issue a new one instead.",
		Action: "/ui/access/tokens/" + url.PathEscape(name) + "/revoke", Back: "/ui/access",
		Buttons: []confirmButton{{Label: "Revoke " + name, Idem: newFormKey()}}}
	h.render(w, r, http.StatusOK, "confirm", &pageData{Viewer: v, Title: "Revoke " + name, Nav: "access", Data: d})
}

// credentialPage offers a user's credential actions at the generation read now (GET /users
// through the API, admin only): turning password login off and ending the sessions.
func (h *Handler) credentialPage(w http.ResponseWriter, r *http.Request, v *viewer) {
	name := r.PathValue("name")
	c, ctx := h.client(r, v.Bearer)
	users, err := c.ListUsers(ctx)
	if err != nil {
		h.apiError(w, r, err)
		return
	}
	var u *client.User
	for i := range users {
		if users[i].Name == name {
			u = &users[i]
		}
	}
	if u == nil {
		h.renderError(w, r, http.StatusNotFound, "There is no user "+name+".")
		return
	}
	d := &confirmData{Question: "Change how " + name + " logs in?",
		Text: "Turning password login off ends every session of " + name + " and refuses the password until one is set again (berth user passwd). " +
			"Ending the sessions logs " + name + " out everywhere; the password keeps working. From a password login, the API asks for one within the last 5 minutes for either.",
		Action: "/ui/access/users/" + url.PathEscape(name) + "/credential", Back: "/ui/access",
		Fields: map[string]string{"expected_generation": strconv.FormatInt(u.Generation, 10)},
		Buttons: []confirmButton{{Label: "Turn password login off", Op: "revoke_password", Idem: newFormKey()},
			{Label: "End the sessions", Op: "revoke_sessions", Idem: newFormKey()}}}
	h.render(w, r, http.StatusOK, "confirm", &pageData{Viewer: v, Title: "Password login of " + name, Nav: "access", Data: d})
}

// revokeToken revokes the named token through the API and returns to the tokens and users page.
func (h *Handler) revokeToken(w http.ResponseWriter, r *http.Request, v *viewer) {
	name := r.PathValue("name")
	c, ctx := h.client(r, v.Bearer)
	if err := c.WithIdempotencyKey(formKey(r)).RevokeToken(ctx, name); err != nil {
		h.apiError(w, r, err)
		return
	}
	h.log.Info("dashboard revoked a token", "token", name, "by", v.Name)
	http.Redirect(w, r, "/ui/access", http.StatusSeeOther)
}

// userForm is the user form as typed; the password is never shown back.
type userForm struct {
	Name, Kind string
	Roles      []string
}

// Has reports whether the form selected role s.
func (f userForm) Has(s string) bool {
	return slices.Contains(f.Roles, s)
}

// userFormData is what the user form page shows.
type userFormData struct {
	Form    userForm
	Roles   []string
	Problem *client.Problem
	Idem    string
}

func (h *Handler) newUserPage(w http.ResponseWriter, r *http.Request, v *viewer) {
	h.renderUserForm(w, r, v, http.StatusOK, &userFormData{Form: userForm{Kind: "human", Roles: []string{"viewer"}}})
}

func (h *Handler) renderUserForm(w http.ResponseWriter, r *http.Request, v *viewer, code int, d *userFormData) {
	d.Roles = userRoles
	if d.Idem == "" {
		d.Idem = newFormKey()
	}
	h.render(w, r, code, "newuser", &pageData{Viewer: v, Title: "Create a user", Nav: "access", Data: d})
}

// createUser creates the user the form describes through the API (admin, a login within the
// last 5 minutes) with the form's Idempotency-Key; a refusal shows the form again as typed,
// without the password.
func (h *Handler) createUser(w http.ResponseWriter, r *http.Request, v *viewer) {
	if err := r.ParseForm(); err != nil {
		h.renderError(w, r, http.StatusBadRequest, "The user form could not be read.")
		return
	}
	f := userForm{Name: strings.TrimSpace(r.PostFormValue("name")), Kind: r.PostFormValue("kind"), Roles: r.PostForm["role"]}
	c, ctx := h.client(r, v.Bearer)
	_, err := c.WithIdempotencyKey(formKey(r)).CreateUser(ctx, client.NewUser{Name: f.Name, Kind: f.Kind, Roles: f.Roles, Password: r.PostFormValue("password")})
	if err != nil {
		if p, ok := h.problemOf(w, r, err); ok {
			h.renderUserForm(w, r, v, p.Status, &userFormData{Form: f, Problem: p})
		}
		return
	}
	h.log.Info("dashboard created a user", "user", f.Name, "by", v.Name)
	http.Redirect(w, r, "/ui/access", http.StatusSeeOther)
}

// changeCredential turns a user's password login off (op revoke_password) or ends its sessions
// (op revoke_sessions) through the API, at the credential generation the page showed.
func (h *Handler) changeCredential(w http.ResponseWriter, r *http.Request, v *viewer) {
	name, op := r.PathValue("name"), r.PostFormValue("op")
	if op != "revoke_password" && op != "revoke_sessions" {
		h.renderError(w, r, http.StatusBadRequest, "The user action is revoke_password or revoke_sessions.")
		return
	}
	gen, ok := parseRevision(r.PostFormValue("expected_generation"))
	if !ok {
		h.renderError(w, r, http.StatusBadRequest, "The user action has no generation. Reload the page.")
		return
	}
	c, ctx := h.client(r, v.Bearer)
	if _, err := c.WithIdempotencyKey(formKey(r)).ChangeCredential(ctx, name, op, gen, ""); err != nil {
		h.apiError(w, r, err)
		return
	}
	h.log.Info("dashboard changed a user's credential", "user", name, "op", op, "by", v.Name)
	http.Redirect(w, r, "/ui/access", http.StatusSeeOther)
}
