package api

import (
	"archive/tar"
	"strings"
	"testing"
)

// TestApplyRefusesNULBytes: a NUL byte in any string the node hands to exec or to the kernel
// as a path (a command argument, an env name or value, a volume path, the health-check path,
// a container image reference) is refused at apply with 422 validation_failed naming the
// field, and the refused apply changes nothing; without the NUL the same spec applies.
func TestApplyRefusesNULBytes(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	good := tarGz(t, &tar.Header{Name: "app", Typeflag: tar.TypeReg, Mode: 0o755})
	if code, out := f.do(req{method: "POST", path: "/api/v1/projects/default/bundles?name=app", ctype: "application/gzip", token: f.admin, body: good}); code != 201 {
		t.Fatalf("push bundle: %d %v", code, out)
	}
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	base := func() map[string]any {
		return map[string]any{"bundle": "app", "command": []string{"./app", "-v"}, "env": map[string]string{"A": "1"}}
	}
	for _, tc := range []struct {
		name  string
		mut   func(m map[string]any)
		field string // what the detail must name
	}{
		{"command argument", func(m map[string]any) { m["command"] = []string{"./app", "a\x00b"} }, "command argument 1"},
		{"command", func(m map[string]any) { m["command"] = []string{"./app\x00"} }, "command argument 0"},
		{"env value", func(m map[string]any) { m["env"] = map[string]string{"GREETING": "hi\x00there"} }, `"GREETING"`},
		{"env name", func(m map[string]any) { m["env"] = map[string]string{"A\x00B": "1"} }, "env name"},
		{"volume path", func(m map[string]any) {
			m["volumes"] = []map[string]string{{"name": "data", "path": "/data\x00/x"}}
		}, `volume "data"`},
		{"health-check path", func(m map[string]any) { m["health_check"] = map[string]any{"path": "/healthz\x00"} }, "health_check.path"},
		{"image", func(m map[string]any) {
			delete(m, "bundle")
			m["runtime"], m["image"] = "containerd", "registry.example\x00/shop/web@"+digest
		}, "image"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f.changelogCleared() // the bundle push's change-log entry is moved out of its outbox after its answer
			before := f.snapshot()
			m := base()
			tc.mut(m)
			code, out := f.json("PUT", "/api/v1/projects/default/services/nul", m)
			detail, _ := out["detail"].(string)
			if code != 422 || out["code"] != "validation_failed" || !strings.Contains(detail, tc.field) || !strings.Contains(detail, "NUL") {
				t.Fatalf("a NUL byte in the %s: %d %v; want 422 validation_failed naming %s and the NUL", tc.name, code, out, tc.field)
			}
			if after := f.snapshot(); after != before {
				t.Fatalf("a refused apply changed the store:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}
	if code, out := f.json("PUT", "/api/v1/projects/default/services/nul", base()); code != 201 {
		t.Fatalf("the same spec without NUL bytes: %d %v", code, out)
	}
}
