package main

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/spf13/cobra"

	"github.com/berthhq/berth/sdk/client"
)

// maxLayoutEntryBytes bounds one file extracted from an image layout tar.
const maxLayoutEntryBytes = 8 << 30

// registryTarget is where the CLI talks to Berth's registry: the API server's host, the
// token as the password, the server's pinned certificate.
type registryTarget struct {
	host    string
	project string
	opts    []remote.Option
}

func (a *app) registryTarget(cmd *cobra.Command) (*registryTarget, error) {
	s, err := a.resolve(cmd)
	if err != nil {
		return nil, err
	}
	if s.Server == "" || s.Token == "" {
		return nil, errors.New("no server or token: pass --server and --token, set BERTH_SERVER and BERTH_TOKEN, or run berth login")
	}
	u, err := url.Parse(s.Server)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("server %q is not a URL", s.Server)
	}
	var tr http.RoundTripper = http.DefaultTransport
	if s.Fingerprint != "" {
		hc, err := client.PinnedHTTPClient(s.Fingerprint)
		if err != nil {
			return nil, err
		}
		tr = hc.Transport
	} else if a.httpClient != nil && a.httpClient.Transport != nil {
		tr = a.httpClient.Transport
	}
	return &registryTarget{host: u.Host, project: s.Project, opts: []remote.Option{
		remote.WithAuth(&authn.Basic{Username: "berth", Password: s.Token}),
		remote.WithTransport(tr), remote.WithContext(cmd.Context()),
	}}, nil
}

// repo returns the repository name: "<project>/<name>" for a bare name, as given otherwise.
func (t *registryTarget) repo(ref string) string {
	if strings.Contains(ref, "/") {
		return ref
	}
	return t.project + "/" + ref
}

// pushToRegistry pushes the image or index at src (an OCI image layout directory, a tar of one,
// gzipped or not, or a docker save tarball) to dest ("[project/]name:tag") in Berth's registry
// and returns the pushed reference with its digest.
func (a *app) pushToRegistry(cmd *cobra.Command, src, dest string) (string, error) {
	t, err := a.registryTarget(cmd)
	if err != nil {
		return "", err
	}
	ref, err := name.NewTag(t.host+"/"+t.repo(dest), name.StrictValidation)
	if err != nil {
		return "", fmt.Errorf("destination %q: want [project/]name:tag: %w", dest, err)
	}
	img, idx, cleanup, err := openImage(cmd.Context(), src)
	if err != nil {
		return "", err
	}
	defer cleanup()
	var d v1.Hash
	if idx != nil {
		if err := remote.WriteIndex(ref, idx, t.opts...); err != nil {
			return "", err
		}
		d, err = idx.Digest()
	} else {
		if err := remote.Write(ref, img, t.opts...); err != nil {
			return "", err
		}
		d, err = img.Digest()
	}
	if err != nil {
		return "", err
	}
	return ref.String() + "@" + d.String(), nil
}

// openImage opens src: a directory holding an OCI image layout, a tar of one (gzipped or
// not, extracted to a temporary directory that cleanup removes), or a docker save tarball
// (manifest.json). A layout with one image gives that image; with several, its index.
func openImage(ctx context.Context, src string) (v1.Image, v1.ImageIndex, func(), error) {
	nop := func() {}
	info, err := os.Stat(src)
	if err != nil {
		return nil, nil, nop, err
	}
	dir := src
	cleanup := nop
	if !info.IsDir() {
		tmp, err := os.MkdirTemp("", "berth-image-layout-")
		if err != nil {
			return nil, nil, nop, err
		}
		cleanup = func() { _ = os.RemoveAll(tmp) }
		isLayout, err := extractTar(ctx, src, tmp)
		if err != nil {
			cleanup()
			return nil, nil, nop, fmt.Errorf("read %s: %w", src, err)
		}
		if !isLayout {
			cleanup()
			img, err := tarball.ImageFromPath(src, nil)
			if err != nil {
				return nil, nil, nop, fmt.Errorf("%s is neither an OCI image layout nor a docker save tarball: %w", src, err)
			}
			return img, nil, nop, nil
		}
		dir = tmp
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		cleanup()
		return nil, nil, nop, fmt.Errorf("%s is not an OCI image layout: %w", src, err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		cleanup()
		return nil, nil, nop, fmt.Errorf("%s: index.json: %w", src, err)
	}
	switch {
	case len(m.Manifests) == 0:
		cleanup()
		return nil, nil, nop, fmt.Errorf("%s: the layout lists no image", src)
	case len(m.Manifests) == 1 && m.Manifests[0].MediaType.IsImage():
		img, err := idx.Image(m.Manifests[0].Digest)
		if err != nil {
			cleanup()
			return nil, nil, nop, err
		}
		return img, nil, cleanup, nil
	case len(m.Manifests) == 1 && m.Manifests[0].MediaType.IsIndex():
		child, err := idx.ImageIndex(m.Manifests[0].Digest)
		if err != nil {
			cleanup()
			return nil, nil, nop, err
		}
		return nil, child, cleanup, nil
	}
	return nil, idx, cleanup, nil
}

// extractTar extracts the tar (gzipped or not) at path into dir and reports whether it held
// an OCI image layout (oci-layout and index.json). Entries that are not regular files or
// directories, or whose path leaves dir, are skipped.
func extractTar(ctx context.Context, path, dir string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	var r io.Reader = f
	if zr, err := gzip.NewReader(f); err == nil {
		defer zr.Close()
		r = zr
	} else if _, err := f.Seek(0, io.SeekStart); err != nil {
		return false, err
	}
	tr := tar.NewReader(r)
	var sawLayout, sawIndex bool
	for {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return false, err
		}
		clean := filepath.Clean(hdr.Name)
		if filepath.IsAbs(clean) || clean == ".." || strings.HasPrefix(clean, "../") {
			continue
		}
		target := filepath.Join(dir, clean)
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				return false, err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return false, err
			}
			out, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
			if err != nil {
				return false, err
			}
			_, err = io.Copy(out, io.LimitReader(tr, maxLayoutEntryBytes))
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return false, err
			}
			switch clean {
			case "oci-layout":
				sawLayout = true
			case "index.json":
				sawIndex = true
			}
		}
	}
	return sawLayout && sawIndex, nil
}

func newImageLsCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "ls [[PROJECT/]REPOSITORY]",
		Short: "List the registry's repositories, or a repository's tags with their digests",
		Long: `ls lists the repositories of Berth's registry the token may read, or, given a
repository ("web" means <project>/web), its tags and the digest each names
(docs/registry.md).`,
		Example: `  berth image ls
  berth image ls shop/web`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			t, err := a.registryTarget(cmd)
			if err != nil {
				return err
			}
			if len(args) == 0 {
				reg, err := name.NewRegistry(t.host)
				if err != nil {
					return err
				}
				repos, err := remote.Catalog(cmd.Context(), reg, t.opts...)
				if err != nil {
					return fmt.Errorf("image ls: %w", err)
				}
				sort.Strings(repos)
				if a.output == outputJSON {
					return printJSON(a.stdout, map[string]any{"repositories": repos})
				}
				fmt.Fprintln(a.stdout, "REPOSITORY")
				for _, r := range repos {
					fmt.Fprintln(a.stdout, r)
				}
				return nil
			}
			repo, err := name.NewRepository(t.host+"/"+t.repo(args[0]), name.StrictValidation)
			if err != nil {
				return fmt.Errorf("repository %q: %w", args[0], err)
			}
			tags, err := remote.List(repo, t.opts...)
			if err != nil {
				return fmt.Errorf("image ls %s: %w", args[0], err)
			}
			type tagRow struct {
				Tag    string `json:"tag"`
				Digest string `json:"digest"`
			}
			rows := []tagRow{}
			for _, tag := range tags {
				desc, err := remote.Head(repo.Tag(tag), t.opts...)
				if err != nil {
					return fmt.Errorf("image ls %s:%s: %w", args[0], tag, err)
				}
				rows = append(rows, tagRow{tag, desc.Digest.String()})
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, map[string]any{"repository": t.repo(args[0]), "tags": rows})
			}
			tw := newTable(a.stdout)
			row(tw, "TAG", "DIGEST")
			for _, r := range rows {
				row(tw, r.Tag, r.Digest)
			}
			return tw.Flush()
		},
	}
}
