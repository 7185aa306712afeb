package client

import (
	"context"
	"net/http"
)

// PutProject creates the project name, or returns it when it exists
// (PUT /projects/{name}); it is idempotent.
func (c *Client) PutProject(ctx context.Context, name string) (*Project, error) {
	var out Project
	if err := c.doJSON(ctx, http.MethodPut, "/projects/"+pathEscape(name), struct{}{}, true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListProjects lists the projects the token can see (GET /projects).
func (c *Client) ListProjects(ctx context.Context) ([]Project, error) {
	var out List[Project]
	if err := c.do(ctx, http.MethodGet, "/projects", nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return nonNil(out.Items), nil
}
