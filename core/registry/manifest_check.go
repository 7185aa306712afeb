package registry

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/distribution/distribution/v3"
	"github.com/distribution/distribution/v3/registry/api/errcode"
	"github.com/distribution/reference"
	digest "github.com/opencontainers/go-digest"
)

// Media types whose manifests name a config and layers.
var imageManifestTypes = map[string]bool{
	"application/vnd.oci.image.manifest.v1+json":           true,
	"application/vnd.docker.distribution.manifest.v2+json": true,
}

// checkedDescriptor is what checkManifest reads of a content descriptor.
type checkedDescriptor struct {
	Digest string   `json:"digest"`
	Size   int64    `json:"size"`
	URLs   []string `json:"urls"`
}

// checkedManifest is what checkManifest reads of a manifest or an index.
type checkedManifest struct {
	SchemaVersion *int                `json:"schemaVersion"`
	MediaType     string              `json:"mediaType"`
	Config        *checkedDescriptor  `json:"config"`
	Layers        []checkedDescriptor `json:"layers"`
	Manifests     []checkedDescriptor `json:"manifests"`
	Subject       *checkedDescriptor  `json:"subject"`
}

// errManifestRefused wraps the registry error a manifest is refused with.
type errManifestRefused struct{ e errcode.Error }

func (e errManifestRefused) Error() string { return e.e.Error() }

// checkManifest refuses, before distribution stores anything, a manifest PUT to repo whose body
// (of media type contentType) is not a manifest: not one JSON object (MANIFEST_INVALID), a
// schemaVersion other than 2 (MANIFEST_INVALID), an image manifest without a config
// (MANIFEST_INVALID), a descriptor (config, layers, manifests, subject) whose digest does not
// parse (DIGEST_INVALID), whose size is negative (SIZE_INVALID), or whose size differs from
// that of the blob or manifest of that digest the repository holds (SIZE_INVALID). What the
// repository does not hold is left to distribution (MANIFEST_BLOB_UNKNOWN). It returns an
// errManifestRefused for a refusal, another error when the storage could not be read.
func (r *Registry) checkManifest(ctx context.Context, repo string, body []byte, contentType string) error {
	refuse := func(code errcode.ErrorCode, format string, a ...any) error {
		return errManifestRefused{code.WithMessage(fmt.Sprintf(format, a...))}
	}
	if t := bytes.TrimLeft(body, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		return refuse(errcode.ErrorCodeManifestInvalid, "a manifest is one JSON object")
	}
	var m checkedManifest
	if err := json.Unmarshal(body, &m); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return refuse(errcode.ErrorCodeManifestInvalid, "manifest field %s must be %s, not %s", te.Field, te.Type, te.Value)
		}
		return refuse(errcode.ErrorCodeManifestInvalid, "the manifest is not valid JSON")
	}
	if m.SchemaVersion == nil || *m.SchemaVersion != 2 {
		return refuse(errcode.ErrorCodeManifestInvalid, "schemaVersion must be 2")
	}
	mt := contentType
	if mt == "" {
		mt = m.MediaType
	}
	if imageManifestTypes[mt] && m.Config == nil {
		return refuse(errcode.ErrorCodeManifestInvalid, "an image manifest names its config")
	}
	type named struct {
		where    string
		d        checkedDescriptor
		manifest bool // a manifest of the repository, not a blob
	}
	var all []named
	if m.Config != nil {
		all = append(all, named{where: "config", d: *m.Config})
	}
	for i, l := range m.Layers {
		all = append(all, named{where: fmt.Sprintf("layers[%d]", i), d: l})
	}
	for i, c := range m.Manifests {
		all = append(all, named{where: fmt.Sprintf("manifests[%d]", i), d: c, manifest: true})
	}
	if m.Subject != nil {
		all = append(all, named{where: "subject", d: *m.Subject, manifest: true})
	}
	var repository distribution.Repository
	for _, n := range all {
		d, err := digest.Parse(n.d.Digest)
		if err != nil {
			return refuse(errcode.ErrorCodeDigestInvalid, "%s: digest %q is not <algorithm>:<hex> of a known algorithm", n.where, n.d.Digest)
		}
		if n.d.Size < 0 {
			return refuse(errcode.ErrorCodeSizeInvalid, "%s: size %d is negative", n.where, n.d.Size)
		}
		if len(n.d.URLs) > 0 {
			continue // a foreign layer: not held here
		}
		if repository == nil {
			named, err := reference.WithName(repo)
			if err != nil {
				return refuse(errcode.ErrorCodeNameInvalid, "repository %q", repo)
			}
			if repository, err = r.ns.Repository(ctx, named); err != nil {
				return fmt.Errorf("registry: open %s: %w", repo, err)
			}
		}
		size, held, err := r.heldSize(ctx, repository, d, n.manifest)
		if err != nil {
			return fmt.Errorf("registry: check %s of a manifest of %s: %w", n.where, repo, err)
		}
		if held && size != n.d.Size {
			return refuse(errcode.ErrorCodeSizeInvalid, "%s: size %d, but %s is %d bytes", n.where, n.d.Size, d, size)
		}
	}
	return nil
}

// heldSize returns the size of the blob (or, with manifest, the manifest) d as repo holds it;
// held is false when repo does not hold it.
func (r *Registry) heldSize(ctx context.Context, repo distribution.Repository, d digest.Digest, manifest bool) (size int64, held bool, err error) {
	if manifest {
		ms, err := repo.Manifests(ctx)
		if err != nil {
			return 0, false, err
		}
		ok, err := ms.Exists(ctx, d)
		if isPathNotFound(err) || isRepoUnknown(err) {
			return 0, false, nil
		}
		if err != nil || !ok {
			return 0, false, err
		}
		desc, err := r.ns.BlobStatter().Stat(ctx, d)
		if errors.Is(err, distribution.ErrBlobUnknown) || isPathNotFound(err) {
			return 0, false, nil
		}
		return desc.Size, err == nil, err
	}
	desc, err := repo.Blobs(ctx).Stat(ctx, d)
	if errors.Is(err, distribution.ErrBlobUnknown) || isPathNotFound(err) || isRepoUnknown(err) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	return desc.Size, true, nil
}
