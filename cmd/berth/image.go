package main

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/berthhq/berth/nodeplugins/containerd/ociimage"
	"github.com/berthhq/berth/sdk/bundle"
)

// maxIndexBytes bounds the index.json read from an image layout.
const maxIndexBytes = 4 << 20

func newImageCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "image push|ls|build",
		RunE:  groupRunE,
		Short: "Manage container images",
	}
	var name string
	push := &cobra.Command{
		Use:   "push FILE|DIR [[PROJECT/]NAME:TAG | --name NAME]",
		Short: "Push an image to Berth's registry, or upload an OCI image layout as a bundle",
		Long: `With a destination, push pushes the image at FILE|DIR (an OCI image layout
directory, a tar of one, gzipped or not, or a docker save tarball) to Berth's
registry as [PROJECT/]NAME:TAG (NAME alone means the current project's), with
the token as the registry password, and prints the pushed reference with its
digest (docs/registry.md). A layout holding several images is pushed as its
index.

Without one, push uploads an OCI image layout (a directory, or a tar of one, gzipped or
not) to the project as a bundle, for services that run on the containerd runtime.
It prints the bundle's digest and the digest of every image in the layout's
index.json. A service runs it with:

  runtime: containerd
  bundle: <bundle digest or --name>
  image: <image digest>

(docs/plugins.md section 3, "The containerd driver").`,
		Example: `  berth image push hello.tar web:v1.2.3
  berth image push hello.tar --name hello-image`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 2 {
				if name != "" {
					return errors.New("image push: --name names a bundle; a registry push names its destination instead")
				}
				ref, err := a.pushToRegistry(cmd, args[0], args[1])
				if err != nil {
					return fmt.Errorf("image push %s %s: %w", args[0], args[1], err)
				}
				if a.output == outputJSON {
					return printJSON(a.stdout, map[string]string{"image": ref})
				}
				fmt.Fprintf(a.stdout, "pushed %s\n", ref)
				return nil
			}
			ctx := cmd.Context()
			c, s, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			src := args[0]
			f, err := os.CreateTemp("", "berth-image-*.tar.gz")
			if err != nil {
				return fmt.Errorf("image push: %w", err)
			}
			defer os.Remove(f.Name())
			defer f.Close()
			if err := imageBundle(ctx, src, f); err != nil {
				return fmt.Errorf("image push %s: %w", src, err)
			}
			if _, err := f.Seek(0, io.SeekStart); err != nil {
				return fmt.Errorf("image push: %w", err)
			}
			images, err := layoutImages(f)
			if err != nil {
				return fmt.Errorf("image push %s: %w", src, err)
			}
			if err := seekValidate(cmd, f); err != nil {
				return fmt.Errorf("image push %s: %w", src, err)
			}
			st, err := f.Stat()
			if err != nil {
				return fmt.Errorf("image push: %w", err)
			}
			up := &uploadReader{r: f, h: sha256.New(), total: st.Size(), w: a.stderr}
			b, err := c.PushBundle(ctx, s.Project, name, up)
			if err != nil {
				return fmt.Errorf("image push %s: %w", src, err)
			}
			if local := "sha256:" + hex.EncodeToString(up.h.Sum(nil)); b.Digest != local {
				return fmt.Errorf("image push %s: the server stored digest %s, but the upload hashes to %s", src, b.Digest, local)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, map[string]any{"bundle": b, "images": images})
			}
			fmt.Fprintf(a.stdout, "pushed bundle %s (%s) to project %s", b.Digest, humanBytes(b.Size), s.Project)
			if b.Name != "" {
				fmt.Fprintf(a.stdout, " as %s", b.Name)
			}
			fmt.Fprintln(a.stdout)
			for _, im := range images {
				fmt.Fprintf(a.stdout, "image %s\n", im)
			}
			return nil
		},
	}
	push.Flags().StringVar(&name, "name", "", "name services can use instead of the bundle digest")
	cmd.AddCommand(push, newImageLsCmd(a), newImageBuildCmd(a))
	return cmd
}

func newImageBuildCmd(a *app) *cobra.Command {
	var out string
	var entrypoint, env []string
	build := &cobra.Command{
		Use:   "build DIR -f FILE.tar [--entrypoint ARG]... [--env K=V]...",
		Short: "Build a single-layer image of a directory (no base image)",
		Long: `build packs every regular file of DIR under /app of a new linux image
without a base (for static binaries), working directory /app, and writes it
as a tar of an OCI image layout for 'berth image push'. The same files give
the same digest, which it prints.`,
		Example: `  berth image build build/bundles/hello -f hello.tar --entrypoint /app/hello`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return errors.New("image build: -f FILE.tar is required")
			}
			cfg := ociimage.Config{Entrypoint: entrypoint, Env: env, WorkingDir: "/app"}
			root := args[0]
			err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
				if err != nil || !d.Type().IsRegular() {
					return err
				}
				info, err := d.Info()
				if err != nil {
					return err
				}
				data, err := os.ReadFile(p)
				if err != nil {
					return err
				}
				rel, err := filepath.Rel(root, p)
				if err != nil {
					return err
				}
				cfg.Files = append(cfg.Files, ociimage.File{Path: filepath.Join("app", rel), Data: data, Mode: int64(info.Mode().Perm())})
				return nil
			})
			if err != nil {
				return fmt.Errorf("image build: %w", err)
			}
			img, err := ociimage.Build(cfg)
			if err != nil {
				return fmt.Errorf("image build: %w", err)
			}
			dg, err := ociimage.WriteArchive(img, out)
			if err != nil {
				return fmt.Errorf("image build: %w", err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, map[string]string{"image": dg, "file": out})
			}
			fmt.Fprintf(a.stdout, "built image %s in %s\n", dg, out)
			return nil
		},
	}
	build.Flags().StringVarP(&out, "output-file", "f", "", "the OCI image layout tar to write")
	build.Flags().StringArrayVar(&entrypoint, "entrypoint", nil, "entrypoint argument (repeat for each)")
	build.Flags().StringArrayVar(&env, "env", nil, "KEY=VALUE in the image's environment (repeatable)")
	return build
}

// seekValidate checks f as a bundle and rewinds it.
func seekValidate(cmd *cobra.Command, f *os.File) error {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	if err := bundle.Validate(cmd.Context(), f, 0); err != nil {
		return err
	}
	_, err := f.Seek(0, io.SeekStart)
	return err
}

// imageBundle writes src as a gzip tar to w: a directory is packed as a
// bundle, a .tar.gz or .tgz is copied, any other file is taken as a tar and
// gzipped (with an empty gzip header, so the same tar gives the same digest).
func imageBundle(ctx context.Context, src string, w io.Writer) error {
	info, err := os.Stat(src)
	if err != nil {
		return err
	}
	if info.IsDir() {
		_, _, err := bundle.Create(ctx, src, w)
		return err
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if strings.HasSuffix(src, ".tar.gz") || strings.HasSuffix(src, ".tgz") {
		_, err := io.Copy(w, in)
		return err
	}
	zw := gzip.NewWriter(w)
	if _, err := io.Copy(zw, in); err != nil {
		return err
	}
	return zw.Close()
}

// layoutImages reads index.json of the gzip tar r and returns the digests
// of the images it lists. A tar without index.json and oci-layout is not an
// OCI image layout.
func layoutImages(r io.Reader) ([]string, error) {
	zr, err := gzip.NewReader(r)
	if err != nil {
		return nil, err
	}
	tr := tar.NewReader(zr)
	var images []string
	var sawLayout, sawIndex bool
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read tar: %w", err)
		}
		switch path.Clean(hdr.Name) {
		case "oci-layout":
			sawLayout = true
		case "index.json":
			sawIndex = true
			var idx struct {
				Manifests []struct {
					Digest string `json:"digest"`
				} `json:"manifests"`
			}
			if err := json.NewDecoder(io.LimitReader(tr, maxIndexBytes)).Decode(&idx); err != nil {
				return nil, fmt.Errorf("index.json: %w", err)
			}
			for _, m := range idx.Manifests {
				images = append(images, m.Digest)
			}
		}
	}
	if !sawLayout || !sawIndex || len(images) == 0 {
		return nil, errors.New("not an OCI image layout (needs oci-layout and an index.json listing an image)")
	}
	return images, nil
}
