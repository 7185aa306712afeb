package client

import (
	"context"
	"net/http"
	"net/url"
)

// ListServiceBindings lists a project's service bindings, or one service's when service is not
// empty (GET /projects/{p}/bindings; docs/bindings.md). Answers carry no credential.
func (c *Client) ListServiceBindings(ctx context.Context, project, service string) ([]ServiceBinding, error) {
	var q url.Values
	if service != "" {
		q = url.Values{"service": {service}}
	}
	var out List[ServiceBinding]
	if err := c.do(ctx, http.MethodGet, "/projects/"+pathEscape(project)+"/bindings", q, nil, "", true, &out); err != nil {
		return nil, err
	}
	return nonNil(out.Items), nil
}

// DeleteServiceBinding releases a binding the service no longer declares, keeping its data, or
// with purge drops the data (DELETE /projects/{p}/services/{s}/bindings/{b}[?purge=true]). It
// answers the binding as it stands; the work runs as an operation. 409 conflict while the
// service still declares the binding.
func (c *Client) DeleteServiceBinding(ctx context.Context, project, service, name string, purge bool) (*ServiceBinding, error) {
	var q url.Values
	if purge {
		q = url.Values{"purge": {"true"}}
	}
	var out ServiceBinding
	if err := c.do(ctx, http.MethodDelete, "/projects/"+pathEscape(project)+"/services/"+pathEscape(service)+"/bindings/"+pathEscape(name), q, nil, "", true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
