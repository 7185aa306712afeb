package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/berthhq/berth/internal/wasmtest"
	"github.com/berthhq/berth/sdk/client"
)

// craneBinary finds crane (make test installs it).
func craneBinary(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("crane"); err == nil {
		return p
	}
	out, err := exec.Command("go", "env", "GOPATH").Output()
	if err == nil {
		p := filepath.Join(strings.TrimSpace(string(out)), "bin", "crane")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Fatal("crane is not installed: go install github.com/google/go-containerregistry/cmd/crane@v0.22.1 (make test does)")
	return ""
}

// TestCranePushesToBerthRegistry logs a real crane in with a Berth token,
// pushes a multi-layer image to berthd's /v2 and reads it back by tag and by
// digest; a wrong token is refused.
func TestCranePushesToBerthRegistry(t *testing.T) {
	t.Parallel()
	crane := craneBinary(t)
	cl := newCluster(t)
	img, err := random.Image(4096, 3)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := img.Digest()
	tar := filepath.Join(t.TempDir(), "img.tar")
	tag, _ := name.NewTag("shop/web:v1")
	if err := tarball.WriteToFile(tar, tag, img); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, error) {
		cmd := exec.Command(crane, append(args, "--insecure")...)
		cmd.Env = append(os.Environ(), "HOME="+cl.dir, "DOCKER_CONFIG="+filepath.Join(cl.dir, "docker"))
		out, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	if out, err := run("auth", "login", cl.api, "-u", "berth", "-p", cl.token); err != nil {
		t.Fatalf("crane auth login: %v\n%s", err, out)
	}
	ref := cl.api + "/shop/web:v1"
	if out, err := run("push", tar, ref); err != nil {
		t.Fatalf("crane push: %v\n%s", err, out)
	}
	got, err := run("digest", ref)
	if err != nil || got != want.String() {
		t.Fatalf("crane digest %s = %q (%v), want %s", ref, got, err, want)
	}
	m, err := run("manifest", cl.api+"/shop/web@"+want.String())
	if err != nil || strings.Count(m, `"digest"`) != 4 { // config and three layers
		t.Fatalf("manifest by digest (%v): %s", err, m)
	}
	if out, err := run("ls", cl.api+"/shop/web"); err != nil || out != "v1" {
		t.Fatalf("crane ls: %q %v", out, err)
	}
	// A reserved release tag: reserved with the CLI, pushed once by the
	// reserver, then listed with its digest.
	if _, err := cl.c.PutProject(context.Background(), "default"); err != nil {
		t.Fatal(err)
	}
	if out := cl.cli(t, "release", "reserve", "web", "v1.0.0"); !strings.Contains(out, "default/web:v1.0.0 reserved") {
		t.Fatalf("release reserve: %q", out)
	}
	if out, err := run("push", tar, cl.api+"/default/web:v1.0.0"); err != nil {
		t.Fatalf("crane push to the reserved tag: %v\n%s", err, out)
	}
	out := cl.cli(t, "release", "list", "web")
	listed := false
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		listed = listed || len(f) >= 2 && f[0] == "v1.0.0" && f[1] == want.String()
	}
	if !listed {
		t.Fatalf("release list: %q", out)
	}

	// A wrong token is refused.
	if out, err := run("auth", "login", cl.api, "-u", "berth", "-p", "brt_"+strings.Repeat("x", 43)); err != nil {
		t.Fatalf("crane auth login: %v\n%s", err, out)
	}
	if out, err := run("digest", ref); err == nil || !strings.Contains(out, "UNAUTHORIZED") {
		t.Fatalf("a wrong token read %s: %v %s", ref, err, out)
	}
}

// TestCranePushIsFollowedAfterItIsAnswered: a container service follows default/web:main
// (deploy_on_push). crane pushes a new image to the tag and exits 0; berthd then rolls the
// service to the pushed digest, and berth release list shows the tag's follow as followed (a
// tag no service follows shows -); with a bound policy that refuses, the next push is still answered
// and its follow shows refused(policy) while the service keeps its digest.
func TestCranePushIsFollowedAfterItIsAnswered(t *testing.T) {
	t.Parallel()
	crane := craneBinary(t)
	cl := newCluster(t)
	ctx := context.Background()
	if _, err := cl.c.PutProject(ctx, "default"); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, error) {
		cmd := exec.Command(crane, append(args, "--insecure")...)
		cmd.Env = append(os.Environ(), "HOME="+cl.dir, "DOCKER_CONFIG="+filepath.Join(cl.dir, "docker"))
		out, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	if out, err := run("auth", "login", cl.api, "-u", "berth", "-p", cl.token); err != nil {
		t.Fatalf("crane auth login: %v\n%s", err, out)
	}
	push := func(tag string) string {
		t.Helper()
		img, err := random.Image(1024, 1)
		if err != nil {
			t.Fatal(err)
		}
		d, _ := img.Digest()
		tar := filepath.Join(t.TempDir(), "img.tar")
		ref, _ := name.NewTag("default/web:" + tag)
		if err := tarball.WriteToFile(tar, ref, img); err != nil {
			t.Fatal(err)
		}
		if out, err := run("push", tar, cl.api+"/default/web:"+tag); err != nil {
			t.Fatalf("crane push %s: %v\n%s", tag, err, out)
		}
		return d.String()
	}
	push("main")
	if _, err := cl.c.ApplyService(ctx, "default", "web", client.ServiceSpec{
		Container: client.Container{Runtime: "containerd", Image: "default/web:main", DeployOnPush: true},
	}); err != nil {
		t.Fatalf("apply: %v", err)
	}
	d2 := push("main")
	other := push("other")
	waitFor(t, 60*time.Second, "web follows the pushed digest and the release shows it", func() (bool, string) {
		svc, err := cl.c.GetService(ctx, "default", "web")
		if err != nil {
			return false, err.Error()
		}
		out := cl.cli(t, "release", "list", "web")
		follows := map[string]string{}
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) == 4 {
				follows[f[0]+" "+f[1]] = f[3]
			}
		}
		ok := strings.HasSuffix(svc.Container.Image, "@"+d2) && follows["main "+d2] == "followed" && follows["other "+other] == "-"
		return ok, svc.Container.Image + "\n" + out
	})

	// A bound service.apply policy refuses every change: the next push is still answered (crane
	// exits 0: the manifest is stored), its follow is refused, berth release list says so, and
	// the service keeps the digest it ran (docs/deploy.md section 3).
	path := filepath.Join(cl.dir, "refuse-all.wasm")
	deny := `{"decision":"deny","reasons":["pushed images wait for review"]}`
	if err := os.WriteFile(path, wasmtest.Policy(wasmtest.PolicyOptions{Name: "refuse-all", Answer: deny}), 0o600); err != nil {
		t.Fatal(err)
	}
	var m client.Module
	if err := json.Unmarshal([]byte(cl.cli(t, "module", "push", path, "-o", "json")), &m); err != nil {
		t.Fatal(err)
	}
	cl.cli(t, "module", "bind", m.Digest, "--hook", "service.apply")
	d3 := push("main")
	waitFor(t, 60*time.Second, "the follow of the refused push shows refused(policy)", func() (bool, string) {
		out := cl.cli(t, "release", "list", "web")
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) == 4 && f[0] == "main" && f[1] == d3 {
				return f[3] == "refused(policy)", out
			}
		}
		return false, out
	})
	svc, err := cl.c.GetService(ctx, "default", "web")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(svc.Container.Image, "@"+d2) {
		t.Fatalf("after a refused follow web runs %s, want the digest it ran, %s", svc.Container.Image, d2)
	}
}
