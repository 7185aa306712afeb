// Package ctrtest is the test harness of the containerd driver and of its
// users: it finds the test containerd, gives each test its own containerd
// namespace, and builds small OCI images from the node's busybox.
//
// A test calls [Address] first. `make test` and `make test-containers` start a
// private containerd and set BERTH_TEST_CONTAINERD to its socket and
// BERTH_REQUIRE_CONTAINERD=1; without the socket a test fails when the second
// is set and is skipped with a message otherwise (docs/plugins.md section 3).
package ctrtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ctd "github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/berthhq/berth/nodeplugins/containerd/ociimage"
)

// Environment variables the Makefile sets for the container tests.
const (
	EnvAddress = "BERTH_TEST_CONTAINERD"                                      // the test containerd's socket
	EnvRequire = "BERTH_REQUIRE_CONTAINERD"                                   // "1": a missing containerd fails the test
	EnvBinDir  = "BERTH_BIN_DIR"                                              // built binaries, as for the other end-to-end tests
	Busybox    = "/bin/busybox"                                               // Debian's busybox-static
	applets    = "sh echo cat sleep httpd dd wget ls id env nc ip true false" // linked in the images
)

// Address returns the test containerd's socket, or fails or skips t as the
// package doc says. It also requires root, which containers and network
// namespaces need.
func Address(t testing.TB) string {
	t.Helper()
	addr := os.Getenv(EnvAddress)
	msg := ""
	switch {
	case addr == "":
		msg = EnvAddress + " is not set: run `make test-containers`, which starts a private containerd"
	case os.Geteuid() != 0:
		msg = "container tests need root"
	}
	if msg == "" {
		if _, err := os.Stat(addr); err != nil {
			msg = fmt.Sprintf("%s=%s: %v", EnvAddress, addr, err)
		}
	}
	if msg != "" {
		if os.Getenv(EnvRequire) == "1" {
			t.Fatalf("containerd is required here (%s=1): %s", EnvRequire, msg)
		}
		t.Skip("skipped: " + msg)
	}
	return addr
}

// Namespace returns a fresh containerd namespace for t and removes, when t
// ends, every task, container, image and the namespace itself.
func Namespace(t testing.TB, addr string) string {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	ns := "berth-test-" + hex.EncodeToString(b[:])
	t.Cleanup(func() { RemoveNamespace(t, addr, ns) })
	return ns
}

// RemoveNamespace deletes everything in ns and then ns, logging what fails.
func RemoveNamespace(t testing.TB, addr, ns string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(namespaces.WithNamespace(context.Background(), ns), 30*time.Second)
	defer cancel()
	c, err := ctd.New(addr, ctd.WithDefaultNamespace(ns))
	if err != nil {
		t.Errorf("cleanup: connect: %v", err)
		return
	}
	defer c.Close()
	cs, _ := c.Containers(ctx)
	for _, ct := range cs {
		if task, err := ct.Task(ctx, nil); err == nil {
			if _, err := task.Delete(ctx, ctd.WithProcessKill); err != nil {
				t.Logf("cleanup: delete task %s: %v", ct.ID(), err)
			}
		}
		if err := ct.Delete(ctx, ctd.WithSnapshotCleanup); err != nil {
			t.Logf("cleanup: delete container %s: %v", ct.ID(), err)
		}
	}
	imgs, _ := c.ImageService().List(ctx)
	for _, im := range imgs {
		_ = c.ImageService().Delete(ctx, im.Name)
	}
	// Content and snapshots go with the garbage collection the deletes above
	// schedule; the namespace can be deleted once it is empty.
	for range 50 {
		if err = c.NamespaceService().Delete(ctx, ns); err == nil || ctx.Err() != nil {
			return
		}
		time.Sleep(100 * time.Millisecond) // waits for containerd's garbage collector
	}
	t.Logf("cleanup: namespace %s is left: %v", ns, err)
}

// Config is what an image built by [Image] runs by default.
type Config struct {
	Entrypoint []string
	Cmd        []string
	Env        []string
	WorkingDir string
	User       string
	// Files are extra files (path inside the image to content), mode 0755.
	Files map[string][]byte
}

// Image builds a linux image of one layer: /bin/busybox with its applets
// as symlinks, /etc/passwd and /etc/group, /tmp, and cfg.Files.
func Image(t testing.TB, cfg Config) v1.Image {
	t.Helper()
	img, err := BuildImage(cfg)
	if err != nil {
		t.Fatalf("build image: %v", err)
	}
	return img
}

// BuildImage is [Image] for callers without a testing.TB.
func BuildImage(cfg Config) (v1.Image, error) {
	bb, err := os.ReadFile(Busybox)
	if err != nil {
		return nil, fmt.Errorf("read busybox (install busybox-static): %w", err)
	}
	ic := ociimage.Config{
		Files: []ociimage.File{
			{Path: "bin/busybox", Data: bb},
			{Path: "etc/passwd", Data: []byte("root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"), Mode: 0o644},
			{Path: "etc/group", Data: []byte("root:x:0:\nnogroup:x:65534:\n"), Mode: 0o644},
		},
		Symlinks:   map[string]string{},
		Entrypoint: cfg.Entrypoint, Cmd: cfg.Cmd, Env: append([]string{"PATH=/bin"}, cfg.Env...),
		WorkingDir: cfg.WorkingDir, User: cfg.User,
	}
	for _, a := range strings.Fields(applets) {
		ic.Symlinks["bin/"+a] = "busybox"
	}
	for p, data := range cfg.Files {
		ic.Files = append(ic.Files, ociimage.File{Path: p, Data: data})
	}
	return ociimage.Build(ic)
}

// Archive writes img as a tar of an OCI image layout under t's temporary
// directory and returns its path and the image's digest ("sha256:<hex>").
func Archive(t testing.TB, img v1.Image) (path, digest string) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "image.tar")
	digest, err := ociimage.WriteArchive(img, path)
	if err != nil {
		t.Fatalf("write image archive: %v", err)
	}
	return path, digest
}
