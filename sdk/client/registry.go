package client

import (
	"context"
	"net/http"
	"time"
)

// RegistryGCItem is one deletion of a registry retention pass: Kind "tag" (Repository and
// Tag), "manifest" (Repository) or "blob" (Size in bytes), each by Digest.
type RegistryGCItem struct {
	Kind       string `json:"kind"`
	Repository string `json:"repository,omitempty"`
	Tag        string `json:"tag,omitempty"`
	Digest     string `json:"digest"`
	Size       int64  `json:"size,omitempty"`
}

// RegistryGCReport is the answer of POST /api/v1/registry/gc (docs/registry.md section 10):
// what the pass deleted, or with DryRun what it would delete, and why work remains.
type RegistryGCReport struct {
	DryRun        bool             `json:"dry_run"`
	MarkedAt      time.Time        `json:"marked_at"`
	Deletions     []RegistryGCItem `json:"deletions"`
	KeptManifests int              `json:"kept_manifests"`
	KeptBlobs     int              `json:"kept_blobs"`
	BlobsSkipped  string           `json:"blobs_skipped,omitempty"`
	Skipped       []string         `json:"skipped,omitempty"`
	Failures      []string         `json:"failures,omitempty"`
	Remaining     bool             `json:"remaining"`
}

// RegistryGC runs one retention pass of Berth's registry (admin scope); with dryRun it
// deletes nothing and answers what a pass would delete now.
func (c *Client) RegistryGC(ctx context.Context, dryRun bool) (*RegistryGCReport, error) {
	var out RegistryGCReport
	if err := c.doJSON(ctx, http.MethodPost, "/registry/gc", map[string]bool{"dry_run": dryRun}, true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
