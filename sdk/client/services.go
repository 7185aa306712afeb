package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
)

// ApplyService creates or replaces the service name of project
// (PUT /projects/{project}/services/{name}) and returns it with its new
// revision. With spec.ExpectedRevision set the write is a compare-and-set and
// a stale revision fails with code "revision_conflict". A spec identical to the
// stored service writes nothing: the answer carries the current revision and
// Changed false (docs/api.md section 4). The policy warnings of the answer are in
// PolicyWarnings.
func (c *Client) ApplyService(ctx context.Context, project, name string, spec ServiceSpec) (*Service, error) {
	var out Service
	hdr, err := c.doJSONHeader(ctx, http.MethodPut, servicePath(project, name), spec, true, &out)
	if err != nil {
		return nil, err
	}
	out.PolicyWarnings = hdr.Values(HeaderPolicyWarning)
	return &out, nil
}

// GetService reads one service (GET /projects/{project}/services/{name}); a
// missing one fails with code "service_not_found".
func (c *Client) GetService(ctx context.Context, project, name string) (*Service, error) {
	var out Service
	if err := c.do(ctx, http.MethodGet, servicePath(project, name), nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListServices lists the services of project (GET /projects/{project}/services).
func (c *Client) ListServices(ctx context.Context, project string) ([]Service, error) {
	var out List[Service]
	if err := c.do(ctx, http.MethodGet, "/projects/"+pathEscape(project)+"/services", nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return nonNil(out.Items), nil
}

// DeleteService begins the deletion of a service (DELETE
// /projects/{project}/services/{name}, answered 202 with the service marked
// deleting): its routes are withdrawn at once and the service is removed once
// its slots settled (docs/reconciliation.md section 9). A non-nil expectedRevision is sent as the query parameter
// expected_revision and makes the delete a compare-and-set. Deleting a missing
// service fails with code "service_not_found"; a caller that wants idempotent
// cleanup checks [IsCode] for it. With [WithPurgeVolumes] the deletion also removes the
// service's volumes (query parameter purge_volumes=true; docs/api.md section 4); without it
// they are kept.
func (c *Client) DeleteService(ctx context.Context, project, name string, expectedRevision *int64, opts ...DeleteOption) error {
	var o deleteOptions
	for _, opt := range opts {
		opt(&o)
	}
	q := url.Values{}
	if expectedRevision != nil {
		q.Set("expected_revision", strconv.FormatInt(*expectedRevision, 10))
	}
	if o.purgeVolumes {
		q.Set("purge_volumes", "true")
	}
	return c.do(ctx, http.MethodDelete, servicePath(project, name), q, nil, "", true, nil)
}

// ListWorkloads lists the workloads of project (GET /projects/{project}/workloads),
// or of every project when project is "" (GET /workloads).
func (c *Client) ListWorkloads(ctx context.Context, project string) ([]Workload, error) {
	p := "/workloads"
	if project != "" {
		p = "/projects/" + pathEscape(project) + "/workloads"
	}
	var out List[Workload]
	if err := c.do(ctx, http.MethodGet, p, nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return nonNil(out.Items), nil
}

// DeleteOption is an option of [Client.DeleteService].
type DeleteOption func(*deleteOptions)

type deleteOptions struct{ purgeVolumes bool }

// WithPurgeVolumes makes [Client.DeleteService] remove the service's volumes too, on the nodes
// that hold its workloads while it settles (docs/node-protocol.md section 6.7).
func WithPurgeVolumes() DeleteOption { return func(o *deleteOptions) { o.purgeVolumes = true } }

func servicePath(project, name string) string {
	return "/projects/" + pathEscape(project) + "/services/" + pathEscape(name)
}
