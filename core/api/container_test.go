package api

import (
	"strings"
	"testing"
)

// TestContainerService: a containerd service from a registry needs neither
// bundle nor command, and its container fields come back as stored.
func TestContainerService(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	image := "registry.example.com/shop/web@sha256:" + strings.Repeat("cd", 32)
	code, out := f.json("PUT", "/api/v1/projects/default/services/web", map[string]any{
		"runtime": "containerd", "image": image, "user": "1000", "memory_mb": 128, "cpu_millis": 500,
	})
	if code != 201 {
		t.Fatalf("create a container service: %d %v", code, out)
	}
	if out["runtime"] != "containerd" || out["image"] != image || out["user"] != "1000" || out["memory_mb"] != float64(128) || out["cpu_millis"] != float64(500) {
		t.Errorf("stored service = %v; want the container fields back", out)
	}
	code, out = f.json("GET", "/api/v1/projects/default/services/web", nil)
	if code != 200 || out["image"] != image {
		t.Errorf("read back: %d %v", code, out)
	}
}
