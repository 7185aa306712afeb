package client

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"time"
)

// ResourceType is one resource type a provider plugin of berthd declares
// (GET /api/v1/resource-types, docs/resources.md section 5).
type ResourceType struct {
	Name   string `json:"name"`
	Plugin string `json:"plugin"`
	// Role names the part of berthd that writes resources of the type; empty for a type
	// operators declare.
	Role string `json:"role,omitempty"`
	// Schema is the type's JSON Schema, absent when it declares none.
	Schema json.RawMessage `json:"schema,omitempty"`
	// DriftIntervalSeconds is the type's own drift interval; zero means berthd's.
	DriftIntervalSeconds int `json:"drift_interval_seconds,omitempty"`
}

// ResourceApply is the body of PUT /projects/{p}/resources/{type}/{name} and of its plan.
type ResourceApply struct {
	Spec    json.RawMessage `json:"spec"`
	OnDrift string          `json:"on_drift,omitempty"` // report (default) | reconcile
}

// Resource is a declared resource as the API returns it (docs/resources.md section 3).
type Resource struct {
	Type              string          `json:"type"`
	Name              string          `json:"name"`
	Project           string          `json:"project"`
	Spec              json.RawMessage `json:"spec"`
	OnDrift           string          `json:"on_drift"`
	Generation        int64           `json:"generation"`
	AppliedGeneration int64           `json:"applied_generation"`
	Applied           json.RawMessage `json:"applied,omitempty"`
	Status            string          `json:"status"` // ready | progressing | failed | drifted | deleting
	Reason            string          `json:"reason,omitempty"`
	Message           string          `json:"message,omitempty"`
	OperationID       string          `json:"operation_id,omitempty"`
	// Outputs are the provider's outputs published as project secrets, by output key
	// (docs/resources.md section 8): names and versions, never values.
	Outputs    map[string]ResourceOutput `json:"outputs,omitempty"`
	Drifts     int64                     `json:"drifts,omitempty"`
	ObservedAt time.Time                 `json:"observed_at,omitzero"`
	UpdatedAt  time.Time                 `json:"updated_at"`
}

// ResourceOutput names the project secret holding one output of a resource, and its version.
type ResourceOutput struct {
	Secret  string `json:"secret"`
	Version int    `json:"version"`
}

// ResourcePlan is what an apply would do (POST .../plan): the provider's current and planned
// states and their difference, one line per changed field.
type ResourcePlan struct {
	Type       string          `json:"type"`
	Name       string          `json:"name"`
	Current    json.RawMessage `json:"current,omitempty"`
	Planned    json.RawMessage `json:"planned"`
	Changes    bool            `json:"changes"`
	Diff       []string        `json:"diff"`
	Generation int64           `json:"generation"`
}

func resourcePath(project, typ, name string) string {
	return "/projects/" + url.PathEscape(project) + "/resources/" + url.PathEscape(typ) + "/" + url.PathEscape(name)
}

// ResourceTypes lists the resource types of berthd's provider plugins.
func (c *Client) ResourceTypes(ctx context.Context) ([]ResourceType, error) {
	var out List[ResourceType]
	err := c.do(ctx, http.MethodGet, "/resource-types", nil, nil, "", true, &out)
	return out.Items, err
}

// ApplyResource declares a resource; the answer is the stored resource (202).
func (c *Client) ApplyResource(ctx context.Context, project, typ, name string, in ResourceApply) (*Resource, error) {
	var out Resource
	if err := c.doJSON(ctx, http.MethodPut, resourcePath(project, typ, name), in, true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// PlanResource asks what applying in would do; it changes nothing.
func (c *Client) PlanResource(ctx context.Context, project, typ, name string, in ResourceApply) (*ResourcePlan, error) {
	var out ResourcePlan
	if err := c.doJSON(ctx, http.MethodPost, resourcePath(project, typ, name)+"/plan", in, true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// GetResource returns one resource.
func (c *Client) GetResource(ctx context.Context, project, typ, name string) (*Resource, error) {
	var out Resource
	if err := c.do(ctx, http.MethodGet, resourcePath(project, typ, name), nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListResources returns a project's resources.
func (c *Client) ListResources(ctx context.Context, project string) ([]Resource, error) {
	var out List[Resource]
	err := c.do(ctx, http.MethodGet, "/projects/"+url.PathEscape(project)+"/resources", nil, nil, "", true, &out)
	return out.Items, err
}

// DeleteResource asks for a resource's deletion (with purge, its data too); 202.
func (c *Client) DeleteResource(ctx context.Context, project, typ, name string, purge bool) (*Resource, error) {
	q := url.Values{}
	if purge {
		q.Set("purge", "true")
	}
	var out Resource
	if err := c.do(ctx, http.MethodDelete, resourcePath(project, typ, name), q, nil, "", true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
