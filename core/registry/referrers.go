package registry

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"

	"github.com/distribution/distribution/v3/registry/api/errcode"

	"github.com/berthhq/berth/core/blobs"
)

// The referrers API (OCI distribution-spec 1.1, docs/registry.md section
// 6), which distribution v3 lacks: Berth records, for every manifest pushed
// with a subject, its descriptor under
// registry-referrers/<repo>/sha256/<subject hex>/<manifest hex> in the blob
// store, and answers GET /v2/<repo>/referrers/<digest> from that listing.

const referrersPrefix = "registry-referrers/"

var referrersPath = regexp.MustCompile(`^/v2/(.+)/referrers/([^/]+)$`)

var digestRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// descriptor is an OCI content descriptor as the referrers index lists it.
type descriptor struct {
	MediaType    string            `json:"mediaType"`
	Digest       string            `json:"digest"`
	Size         int64             `json:"size"`
	ArtifactType string            `json:"artifactType,omitempty"`
	Annotations  map[string]string `json:"annotations,omitempty"`
}

// pushedManifest is what the referrers API reads from a pushed manifest.
type pushedManifest struct {
	MediaType    string            `json:"mediaType"`
	ArtifactType string            `json:"artifactType"`
	Config       *descriptor       `json:"config"`
	Subject      *descriptor       `json:"subject"`
	Annotations  map[string]string `json:"annotations"`
}

func referrerKey(repo, subject, manifest string) string {
	return referrersPrefix + repo + "/sha256/" + strings.TrimPrefix(subject, "sha256:") + "/" + strings.TrimPrefix(manifest, "sha256:")
}

// readManifestBody reads a manifest PUT's body (at most the 4 MiB limit
// plus one byte) and puts it back for distribution.
func readManifestBody(req *http.Request) ([]byte, bool) {
	b, err := io.ReadAll(io.LimitReader(req.Body, 4<<20+1))
	req.Body = io.NopCloser(io.MultiReader(bytes.NewReader(b), req.Body))
	if err != nil || len(b) > 4<<20 {
		return nil, false
	}
	return b, true
}

// referrerOf returns the descriptor to record when body names a subject.
func referrerOf(body []byte, contentType string) (subject string, d descriptor, ok bool) {
	var m pushedManifest
	if json.Unmarshal(body, &m) != nil || m.Subject == nil || !digestRE.MatchString(m.Subject.Digest) {
		return "", descriptor{}, false
	}
	sum := sha256.Sum256(body)
	d = descriptor{MediaType: m.MediaType, Digest: "sha256:" + hex.EncodeToString(sum[:]), Size: int64(len(body)), ArtifactType: m.ArtifactType, Annotations: m.Annotations}
	if d.MediaType == "" {
		d.MediaType = contentType
	}
	if d.ArtifactType == "" && m.Config != nil {
		d.ArtifactType = m.Config.MediaType
	}
	return m.Subject.Digest, d, true
}

func (r *Registry) recordReferrer(ctx context.Context, repo, subject string, d descriptor) error {
	raw, err := json.Marshal(d)
	if err != nil {
		return err
	}
	_, err = r.cfg.Referrers.Put(ctx, referrerKey(repo, subject, d.Digest), bytes.NewReader(raw), blobs.PutOptions{Size: int64(len(raw)), ContentType: "application/json"})
	return err
}

// forgetReferrer removes a deleted manifest from every subject's listing.
func (r *Registry) forgetReferrer(ctx context.Context, repo, manifest string) error {
	suffix := "/" + strings.TrimPrefix(manifest, "sha256:")
	var keys []string
	if err := r.cfg.Referrers.List(ctx, referrersPrefix+repo+"/sha256/", func(i blobs.Info) error {
		if strings.HasSuffix(i.Key, suffix) {
			keys = append(keys, i.Key)
		}
		return nil
	}); err != nil {
		return err
	}
	for _, k := range keys {
		if err := r.cfg.Referrers.Delete(ctx, k); err != nil {
			return err
		}
	}
	return nil
}

// serveReferrers answers GET /v2/<repo>/referrers/<digest>[?artifactType=].
func (r *Registry) serveReferrers(w http.ResponseWriter, req *http.Request, repo, subject string) {
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		serveError(w, http.StatusMethodNotAllowed, errcode.ErrorCodeUnsupported.WithMessage("the referrers API takes GET"))
		return
	}
	if !digestRE.MatchString(subject) {
		serveError(w, http.StatusBadRequest, errcode.ErrorCodeDigestInvalid.WithMessage("the subject must be sha256:<64 hex>"))
		return
	}
	filter := req.URL.Query().Get("artifactType")
	out := struct {
		SchemaVersion int          `json:"schemaVersion"`
		MediaType     string       `json:"mediaType"`
		Manifests     []descriptor `json:"manifests"`
	}{SchemaVersion: 2, MediaType: "application/vnd.oci.image.index.v1+json", Manifests: []descriptor{}}
	prefix := referrersPrefix + repo + "/sha256/" + strings.TrimPrefix(subject, "sha256:") + "/"
	err := r.cfg.Referrers.List(req.Context(), prefix, func(i blobs.Info) error {
		rc, _, err := r.cfg.Referrers.Get(req.Context(), i.Key, 0, 64<<10)
		if errors.Is(err, blobs.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		defer rc.Close()
		var d descriptor
		if err := json.NewDecoder(rc).Decode(&d); err != nil {
			return fmt.Errorf("referrer %s: %w", i.Key, err)
		}
		if filter == "" || d.ArtifactType == filter {
			out.Manifests = append(out.Manifests, d)
		}
		return nil
	})
	if err != nil {
		r.log.Error("registry: list referrers", "repository", repo, "subject", subject, "err", err)
		serveError(w, http.StatusServiceUnavailable, errcode.ErrorCodeUnavailable.WithMessage("the registry's storage is unavailable; retry later"))
		return
	}
	if filter != "" {
		w.Header().Set("OCI-Filters-Applied", "artifactType")
	}
	w.Header().Set("Content-Type", out.MediaType)
	_ = json.NewEncoder(w).Encode(out)
}
