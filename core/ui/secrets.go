package ui

import (
	"context"
	"net/http"

	"github.com/berthhq/berth/sdk/client"
)

// The secrets and access pages (docs/ui.md section 1). The secrets page lists the secrets of
// every project the viewer may read them in (GET /projects/{project}/secrets): names,
// versions, keyed digests and the services that use them. The API never answers a secret's
// value on these routes, so the page has none to show. The access page lists tokens (GET
// /tokens) and users (GET /users) for admins: names, scopes, roles and times, never a bearer
// (the API lists none).

// secretRow is one secret with the name of its project.
type secretRow struct {
	Project string
	Secret  client.Secret
}

// secretsData is what the secrets page shows. Denied counts the projects whose secrets the
// viewer may not read; Off says the API serves no secrets.
type secretsData struct {
	Rows   []secretRow
	Denied int
	Off    bool
}

// loadSecrets lists the secrets of every project the viewer may read through the API.
func loadSecrets(ctx context.Context, c *client.Client) (*secretsData, error) {
	projects, err := c.ListProjects(ctx)
	if err != nil {
		return nil, err
	}
	d := &secretsData{}
	for _, p := range projects {
		secs, err := c.ListSecrets(ctx, p.Name)
		if client.IsCode(err, "forbidden") {
			d.Denied++
			continue
		}
		if apiStatus(err) == http.StatusNotFound && !client.IsCode(err, "project_not_found") {
			return &secretsData{Off: true}, nil
		}
		if err != nil {
			return nil, err
		}
		for _, s := range secs {
			d.Rows = append(d.Rows, secretRow{Project: p.Name, Secret: s})
		}
	}
	return d, nil
}

// currentDigest is the keyed digest of a secret's current version; "" when the list does not
// carry it.
func currentDigest(s client.Secret) string {
	for _, v := range s.Versions {
		if v.Version == s.Current {
			return v.Digest
		}
	}
	return ""
}

// accessData is what the access page shows: the tokens and the users the viewer may list,
// and for each list the API's refusal when it refused (only an admin lists users, and tokens
// need tokens:write).
type accessData struct {
	Tokens       []client.MachineToken
	TokensDenied string
	Users        []client.User
	UsersDenied  string
}

// loadAccess lists the tokens and users the viewer may read through the API.
func loadAccess(ctx context.Context, c *client.Client) (*accessData, error) {
	d := &accessData{}
	var err error
	if d.Tokens, err = c.ListTokens(ctx); client.IsCode(err, "forbidden") {
		d.TokensDenied = errText(err)
	} else if err != nil {
		return nil, err
	}
	if d.Users, err = c.ListUsers(ctx); client.IsCode(err, "forbidden") {
		d.UsersDenied = errText(err)
	} else if err != nil {
		return nil, err
	}
	return d, nil
}

func (h *Handler) secretsPage(w http.ResponseWriter, r *http.Request, v *viewer) {
	h.page(w, r, v, "secrets", "Secrets", nil)
}

func (h *Handler) accessPage(w http.ResponseWriter, r *http.Request, v *viewer) {
	h.page(w, r, v, "access", "Tokens and users", nil)
}
