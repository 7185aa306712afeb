// Package ociimage builds small single-layer OCI images from files, and
// writes them as tars of an OCI image layout for the containerd driver.
//
// It is what `berth image build` and the container tests use; images are
// reproducible: the same files and configuration give the same digest.
package ociimage

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// File is one regular file of the image. Path is relative to the image's
// root ("bin/app"); Mode zero means 0755.
type File struct {
	Path string
	Data []byte
	Mode int64
}

// Config describes an image: its files (parent directories are added),
// symbolic links (path to target) and the runtime configuration.
type Config struct {
	Files      []File
	Symlinks   map[string]string
	Entrypoint []string
	Cmd        []string
	Env        []string // KEY=VALUE; PATH=/bin:/app is set unless given
	WorkingDir string
	User       string
}

// Build returns the linux image of cfg for the running architecture.
func Build(cfg Config) (v1.Image, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	dirs := map[string]bool{}
	var addDir func(string) error
	addDir = func(d string) error {
		if d == "." || d == "" || dirs[d] {
			return nil
		}
		if err := addDir(filepath.Dir(d)); err != nil {
			return err
		}
		dirs[d] = true
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: epoch})
	}
	files := append([]File(nil), cfg.Files...)
	sort.Slice(files, func(i, j int) bool { return files[i].Path < files[j].Path })
	for _, f := range files {
		p := filepath.Clean(f.Path)
		if filepath.IsAbs(p) || strings.HasPrefix(p, "..") {
			return nil, fmt.Errorf("image file %q: want a relative path inside the image", f.Path)
		}
		if err := addDir(filepath.Dir(p)); err != nil {
			return nil, err
		}
		mode := f.Mode
		if mode == 0 {
			mode = 0o755
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: p, Mode: mode, Size: int64(len(f.Data)), ModTime: epoch}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.Data); err != nil {
			return nil, err
		}
	}
	links := make([]string, 0, len(cfg.Symlinks))
	for p := range cfg.Symlinks {
		links = append(links, p)
	}
	sort.Strings(links)
	for _, p := range links {
		if err := addDir(filepath.Dir(p)); err != nil {
			return nil, err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: p, Linkname: cfg.Symlinks[p], Mode: 0o777, ModTime: epoch}); err != nil {
			return nil, err
		}
	}
	if err := addDir("tmp"); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	raw := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(raw)), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("image layer: %w", err)
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.AppendLayers(base, layer)
	if err != nil {
		return nil, fmt.Errorf("image layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Architecture = goruntime.GOARCH
	cf.Config.Entrypoint = cfg.Entrypoint
	cf.Config.Cmd = cfg.Cmd
	cf.Config.Env = cfg.Env
	if !hasEnv(cfg.Env, "PATH") {
		cf.Config.Env = append([]string{"PATH=/bin:/app"}, cfg.Env...)
	}
	cf.Config.WorkingDir = cfg.WorkingDir
	cf.Config.User = cfg.User
	return mutate.ConfigFile(img, cf)
}

func hasEnv(env []string, name string) bool {
	for _, e := range env {
		if strings.HasPrefix(e, name+"=") {
			return true
		}
	}
	return false
}

// WriteArchive writes img as out, a tar of an OCI image layout (staged in a
// temporary directory beside out), and returns the image's digest
// ("sha256:<hex>").
func WriteArchive(img v1.Image, out string) (string, error) {
	stage, err := os.MkdirTemp(filepath.Dir(out), ".layout-")
	if err != nil {
		return "", fmt.Errorf("image layout: %w", err)
	}
	defer os.RemoveAll(stage)
	p, err := layout.Write(stage, empty.Index)
	if err != nil {
		return "", fmt.Errorf("image layout: %w", err)
	}
	if err := p.AppendImage(img); err != nil {
		return "", fmt.Errorf("image layout: %w", err)
	}
	dg, err := img.Digest()
	if err != nil {
		return "", err
	}
	// tar(1) writes the layout exactly as it is on disk.
	if b, err := exec.Command("tar", "-C", stage, "--sort=name", "--mtime=@0", "--owner=0", "--group=0", "--numeric-owner", "-cf", out, ".").CombinedOutput(); err != nil {
		return "", fmt.Errorf("tar the image layout: %w: %s", err, b)
	}
	return dg.String(), nil
}
