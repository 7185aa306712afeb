package containerd

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	ctd "github.com/containerd/containerd"
	"github.com/containerd/containerd/archive/compression"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/images"
	"github.com/containerd/containerd/remotes/docker"
	"github.com/distribution/reference"
	digest "github.com/opencontainers/go-digest"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/runtime"
	"github.com/berthhq/berth/sdk/client"
)

// archiveImagePrefix names images imported from an OCI image layout tar: the
// image of digest D is "berth.local/archive@D".
const archiveImagePrefix = "berth.local/archive@"

// ensureImage returns the image ref (pinned by digest) ready to run: found
// in containerd, imported from archive, or pulled with the credential of
// creds for its registry host; then unpacked into the snapshotter. It returns
// an error wrapping ErrInvalidRequest when ref is not pinned by digest, or
// when the archive does not hold it, and one of code image_unavailable when
// the pull fails (the registry refused it, could not be reached, or its
// certificate is not the pinned one).
func (d *Driver) ensureImage(ctx context.Context, ref, archive string, creds []runtime.RegistryCredential) (ctd.Image, error) {
	name, dgst, err := imageName(ref)
	if err != nil {
		return nil, err
	}
	d.imageMu.Lock()
	defer d.imageMu.Unlock()
	var img ctd.Image
	if found, err := d.client.ImageService().Get(ctx, name); err == nil && found.Target.Digest == dgst {
		img = ctd.NewImage(d.client, found)
	} else if err != nil && !errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("image %s: %w", ref, err)
	}
	switch {
	case img != nil:
	case archive != "":
		if img, err = d.importArchive(ctx, archive, name, dgst); err != nil {
			return nil, fmt.Errorf("image %s from %s: %w", ref, archive, err)
		}
	case strings.HasPrefix(name, archiveImagePrefix):
		return nil, fmt.Errorf("image %s: a bare digest needs an image archive: %w", ref, ErrInvalidRequest)
	default:
		if img, err = d.pull(ctx, name, creds); err != nil {
			// The cause names the registry's answer (401, 403 with its
			// reason, a certificate mismatch); it never holds the secret.
			return nil, abierrors.Wrap(abierrors.ImageUnavailable, "pull image "+ref, err)
		}
	}
	unpacked, err := img.IsUnpacked(ctx, d.cfg.Snapshotter)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", ref, err)
	}
	if !unpacked {
		if err := img.Unpack(ctx, d.cfg.Snapshotter); err != nil {
			return nil, fmt.Errorf("unpack image %s: %w", ref, err)
		}
	}
	return img, nil
}

// imageName returns the containerd image name and digest of ref: the
// reference itself for "host/repo@sha256:...", archiveImagePrefix+digest for
// a bare digest.
func imageName(ref string) (string, digest.Digest, error) {
	if strings.HasPrefix(ref, "sha256:") {
		dgst, err := digest.Parse(ref)
		if err != nil {
			return "", "", fmt.Errorf("image %q: %w: %w", ref, ErrInvalidRequest, err)
		}
		return archiveImagePrefix + dgst.String(), dgst, nil
	}
	named, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		return "", "", fmt.Errorf("image %q: %w: %w", ref, ErrInvalidRequest, err)
	}
	canonical, ok := named.(reference.Canonical)
	if !ok {
		return "", "", fmt.Errorf("image %q is not pinned by digest: %w", ref, ErrInvalidRequest)
	}
	// A tag beside the digest is dropped: the digest decides.
	pinned, err := reference.WithDigest(reference.TrimNamed(named), canonical.Digest())
	if err != nil {
		return "", "", fmt.Errorf("image %q: %w: %w", ref, ErrInvalidRequest, err)
	}
	return pinned.String(), canonical.Digest(), nil
}

// importArchive imports the OCI image layout tar at path and returns the
// image of digest dgst, named name.
func (d *Driver) importArchive(ctx context.Context, path, name string, dgst digest.Digest) (ctd.Image, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open archive: %w", err)
	}
	defer f.Close()
	// A bundle is a gzipped tar; a plain tar passes through unchanged.
	r, err := compression.DecompressStream(f)
	if err != nil {
		return nil, fmt.Errorf("read archive: %w", err)
	}
	defer r.Close()
	imgs, err := d.client.Import(ctx, r,
		ctd.WithDigestRef(func(dg digest.Digest) string { return archiveImagePrefix + dg.String() }),
		ctd.WithSkipDigestRef(func(string) bool { return false }),
	)
	if err != nil {
		return nil, fmt.Errorf("import: %w", err)
	}
	for _, im := range imgs {
		if im.Target.Digest == dgst {
			if im.Name != name {
				im.Name = name
				if im, err = d.putImage(ctx, im); err != nil {
					return nil, err
				}
			}
			return ctd.NewImage(d.client, im), nil
		}
	}
	return nil, fmt.Errorf("the archive holds no manifest or index of digest %s: %w", dgst, ErrInvalidRequest)
}

// putImage creates or updates the image record im.
func (d *Driver) putImage(ctx context.Context, im images.Image) (images.Image, error) {
	is := d.client.ImageService()
	out, err := is.Update(ctx, im, "target")
	if errdefs.IsNotFound(err) {
		out, err = is.Create(ctx, im)
	}
	if err != nil {
		return images.Image{}, fmt.Errorf("record image %s: %w", im.Name, err)
	}
	return out, nil
}

// pull fetches name from its registry: with the credential of creds for
// the registry's host when there is one (over HTTPS pinned to its
// fingerprint, or plain HTTP when it says so), else anonymously, over plain
// HTTP for loopback hosts and Config.PlainHTTPRegistries. containerd checks
// every fetched blob against its digest.
func (d *Driver) pull(ctx context.Context, name string, creds []runtime.RegistryCredential) (ctd.Image, error) {
	resolver := docker.NewResolver(docker.ResolverOptions{Hosts: d.registryHosts(creds)})
	return d.client.Pull(ctx, name, ctd.WithResolver(resolver), ctd.WithPullSnapshotter(d.cfg.Snapshotter))
}

// registryHosts configures each registry host: the one a credential of
// creds names gets its authorizer and its TLS pin; the others the defaults.
func (d *Driver) registryHosts(creds []runtime.RegistryCredential) docker.RegistryHosts {
	return func(host string) ([]docker.RegistryHost, error) {
		c := runtime.CredentialFor(creds, host)
		if c == nil {
			return docker.ConfigureDefaultRegistries(docker.WithPlainHTTP(d.plainHTTP))(host)
		}
		tlsCfg, err := client.PinnedTLSConfig(c.Fingerprint)
		if err != nil {
			return nil, fmt.Errorf("registry %s: %w", host, err)
		}
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = tlsCfg
		tr.TLSHandshakeTimeout = 10 * time.Second
		hc := &http.Client{Transport: tr}
		user, secret := c.Username, c.Secret
		auth := docker.NewDockerAuthorizer(docker.WithAuthClient(hc),
			docker.WithAuthCreds(func(string) (string, string, error) { return user, secret, nil }))
		plain := c.PlainHTTP
		return docker.ConfigureDefaultRegistries(docker.WithClient(hc), docker.WithAuthorizer(auth),
			docker.WithPlainHTTP(func(string) (bool, error) { return plain, nil }))(host)
	}
}

// plainHTTP reports whether host is pulled over plain HTTP.
func (d *Driver) plainHTTP(host string) (bool, error) {
	if slices.Contains(d.cfg.PlainHTTPRegistries, host) {
		return true, nil
	}
	h := host
	if hh, _, err := net.SplitHostPort(host); err == nil {
		h = hh
	}
	if h == "localhost" {
		return true, nil
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback(), nil
}
