package client

import (
	"context"
	"net/http"
	"net/url"
	"strings"
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
	// Follow is where deploy on push stands for the digest the tag names; nil when no service
	// follows the tag (or nothing was pushed to it).
	Follow   *ReleaseFollow `json:"follow,omitempty"`
	Revision int64          `json:"revision"`
}

// Follow states of [ReleaseFollow] (docs/registry.md section 8).
const (
	FollowPending  = "pending"  // owed: the push is recorded, the services not rolled yet
	FollowFollowed = "followed" // every service that follows the tag runs the digest
	FollowRefused  = "refused"  // admission refused the change; Reason says why
	FollowFailed   = "failed"   // the follow failed after its retries; Reason is the last error
)

// ReleaseFollow is the deploy-on-push outcome of a release: the services that follow its tag
// roll to Digest after the push is answered, retried on failure.
type ReleaseFollow struct {
	State  string `json:"state"`
	Digest string `json:"digest"`
	// Reason: "policy: <the policy's reasons>" for a refusal, the error for a failure (and, while
	// pending after a failed attempt, that attempt's error).
	Reason    string    `json:"reason,omitempty"`
	Attempts  int       `json:"attempts"`
	NextAt    time.Time `json:"next_at,omitzero"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Summary is the follow in one word, as berth release list shows it: "followed", "pending",
// "refused(policy)" (the part of Reason before its first colon), "failed(<reason>)", or "" for
// a nil follow.
func (f *ReleaseFollow) Summary() string {
	if f == nil {
		return ""
	}
	switch f.State {
	case FollowRefused:
		kind, _, _ := strings.Cut(f.Reason, ":")
		if kind == "" {
			return f.State
		}
		return f.State + "(" + kind + ")"
	case FollowFailed:
		if f.Reason == "" {
			return f.State
		}
		return f.State + "(" + f.Reason + ")"
	}
	return f.State
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

// PromoteRequest is the optional body of POST .../releases/{tag}/promote: ExpectedRevision
// (nil: the revision the server reads) promotes only while the service is at that revision.
type PromoteRequest struct {
	ExpectedRevision *int64 `json:"expected_revision,omitempty"`
}

// PromoteRelease rolls service to the digest its repository's tag names:
// POST .../services/{service}/releases/{tag}/promote (docs/registry.md section 8). It returns the
// service after the write (Changed false when it already ran that digest). Errors:
// image_release_not_found (404), release_not_pushed, service_not_container, revision_conflict
// (409).
func (c *Client) PromoteRelease(ctx context.Context, project, service, tag string, req PromoteRequest) (*Service, error) {
	var out Service
	if err := c.doJSON(ctx, http.MethodPost, servicePath(project, service)+"/releases/"+url.PathEscape(tag)+"/promote", req, true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
