package main

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestImageBuildAndPush builds an image of a directory twice (same digest),
// pushes it as a bundle and reads the image digest back from what the
// server stored.
func TestImageBuildAndPush(t *testing.T) {
	t.Parallel()
	api, srv := newFakeAPI(t, "brt_good")
	c := newCLI(t)
	c.env["BERTH_SERVER"] = srv.URL
	c.env["BERTH_TOKEN"] = "brt_good"

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "app"), []byte("#!/bin/sh\necho hi\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	out1 := filepath.Join(t.TempDir(), "a.tar")
	out2 := filepath.Join(t.TempDir(), "b.tar")
	first := c.ok("", "image", "build", dir, "-f", out1, "--entrypoint", "/app/app")
	second := c.ok("", "image", "build", dir, "-f", out2, "--entrypoint", "/app/app")
	digest := strings.Fields(first)[2]
	if !strings.HasPrefix(digest, "sha256:") || strings.Fields(second)[2] != digest {
		t.Fatalf("two builds of one directory: %q and %q; want one digest", first, second)
	}
	out := c.ok("", "image", "push", out1, "--name", "app-image")
	if !strings.Contains(out, "image "+digest) || !strings.Contains(out, "as app-image") {
		t.Errorf("push output %q; want the image digest %s", out, digest)
	}
	api.mu.Lock()
	var stored []byte
	for _, b := range api.bundles {
		stored = b
	}
	api.mu.Unlock()
	zr, err := gzip.NewReader(bytes.NewReader(stored))
	if err != nil {
		t.Fatalf("stored bundle is not gzip: %v", err)
	}
	raw, _ := io.ReadAll(zr)
	want, _ := os.ReadFile(out1)
	if !bytes.Equal(raw, want) {
		t.Errorf("the stored bundle does not hold the image layout tar")
	}

	// A tar that is not an image layout is refused before upload.
	bad := filepath.Join(t.TempDir(), "bad.tar")
	if err := os.WriteFile(bad, make([]byte, 1024), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, errOut, code := c.run("", "image", "push", bad); code != 1 || !strings.Contains(errOut, "OCI image layout") {
		t.Errorf("push of a non-layout: exit %d stderr %q", code, errOut)
	}
}
