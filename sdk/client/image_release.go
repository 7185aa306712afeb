package client

import (
	"context"
	"net/http"
	"time"
)

// ImageRelease is a tag of a service's registry repository
// (<project>/<service>) and the digest it names (docs/registry.md section 7).
type ImageRelease struct {
	Repository string    `json:"repository"`
	Tag        string    `json:"tag"`
	Digest     string    `json:"digest,omitempty"`
	PushedBy   string    `json:"pushed_by,omitempty"`
	PushedAt   time.Time `json:"pushed_at,omitempty"`
	ReservedBy string    `json:"reserved_by,omitempty"`
	ReservedAt time.Time `json:"reserved_at,omitempty"`
	History    []struct {
		Digest string    `json:"digest"`
		At     time.Time `json:"at"`
	} `json:"history,omitempty"`
	Revision int64 `json:"revision"`
}

// ReserveRelease reserves tag in the repository of service for the caller:
// POST .../services/{service}/releases. Errors: release_tag_reserved (409),
// release_tag_invalid (422).
func (c *Client) ReserveRelease(ctx context.Context, project, service, tag string) (*ImageRelease, error) {
	var out ImageRelease
	if err := c.doJSON(ctx, http.MethodPost, servicePath(project, service)+"/releases", map[string]string{"tag": tag}, true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListImageReleases lists the releases of service's repository, newest first.
func (c *Client) ListImageReleases(ctx context.Context, project, service string) ([]ImageRelease, error) {
	var out List[ImageRelease]
	if err := c.do(ctx, http.MethodGet, servicePath(project, service)+"/releases", nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return out.Items, nil
}
