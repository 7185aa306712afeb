package api

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"github.com/berthhq/berth/core/idempotency"
	"github.com/berthhq/berth/core/rollout"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/bindings"
	"github.com/berthhq/berth/core/bundles"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/events"
	"github.com/berthhq/berth/core/fencing"
	"github.com/berthhq/berth/core/jobs"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/operations"
	"github.com/berthhq/berth/core/registry"
	"github.com/berthhq/berth/core/resources"
	"github.com/berthhq/berth/core/secrets"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/session"
	"github.com/berthhq/berth/core/store/storetest"
	"github.com/berthhq/berth/host/plugin"
)

type stubRotator struct{}

func (stubRotator) RotateSigningKey(context.Context) (KeyRotation, error) { return KeyRotation{}, nil }

type stubCommander struct{}

func (stubCommander) Command(context.Context, string, node.Command) (*node.CommandResult, error) {
	return nil, nil
}
func (stubCommander) OpenStream(context.Context, string, string, any) (*session.Stream, error) {
	return nil, nil
}

// fullServer is an API with every optional part configured, so that every route is registered.
func fullServer(t *testing.T) *Server {
	t.Helper()
	st := storetest.Open(t)
	bs, err := bundles.New(filepath.Join(t.TempDir(), "blobs"), st.Collection("bundles"), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	kr, _, err := secrets.LoadOrCreateKeyring(filepath.Join(t.TempDir(), secrets.KeyringFile), true)
	if err != nil {
		t.Fatal(err)
	}
	secStore := secrets.NewStore(st, kr, nil)
	ops := operations.NewQueue(st, operations.Config{})
	cat := services.NewCatalog(st, nil)
	jc, err := jobs.NewController(jobs.ControllerConfig{Store: st, Catalog: cat, Nodes: nodes.NewRegistry(st, nil)})
	if err != nil {
		t.Fatal(err)
	}
	return New(Config{Jobs: jc, Platform: jobs.NewPlatform(st, nil), Runtime: rollout.NewStore(st, cat, nil), Idempotency: idempotency.New(st), Backups: testBackups(t, st, ops), Secrets: &SecretsConfig{Store: secStore}, Catalog: cat, Nodes: nodes.NewRegistry(st, nil), Bundles: bs,
		Tokens: testTokens(st), Hinter: nopHinter{}, Events: events.New(st, nil), Changelog: changelog.New(st, 1, nil),
		Sessions: http.NotFoundHandler(), NodeOps: stubCommander{}, PublicURL: "http://127.0.0.1:1", ClusterID: "cls_test",
		ClusterPublicKey: pub, Orchestration: &Orchestration{Transport: true}, KeyRotator: stubRotator{}, RegistryGC: stubGC,
		Leases: fencing.New(st, fencing.Config{}), Guard: fencing.NewGuard(st, nil),
		ImageReleases: registry.NewReleases(st, nil),
		Bindings:      bindings.New(bindings.Config{Store: st, Queue: operations.NewQueue(st, operations.Config{}), Secrets: secStore}),
		Resources:     &ResourcesConfig{Manager: resources.New(resources.Config{Store: st, Queue: ops, Types: plugin.NewTypes()}), Types: plugin.NewTypes().List}})
}

// TestRouteScopeTable walks the router and fails on a route that docs/api.md's route table
// (section "Identity") does not list with its scope, or on a row for a route that is gone.
func TestRouteScopeTable(t *testing.T) {
	t.Parallel()
	s := fullServer(t)
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "api.md"))
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `([A-Z]+) (/[^`]*)` \\| `?([a-z:_.-]+)`? \\|")
	table := map[string]string{}
	for _, m := range row.FindAllStringSubmatch(string(doc), -1) {
		table[m[1]+" "+m[2]] = m[3]
	}
	if len(table) == 0 {
		t.Fatalf("docs/api.md has no route table rows")
	}
	seen := map[string]bool{}
	for _, r := range s.e.Routes() {
		if !slices.Contains([]string{"GET", "PUT", "POST", "DELETE", "PATCH", "HEAD"}, r.Method) || strings.HasSuffix(r.Path, "/*") {
			continue
		}
		key := r.Method + " " + r.Path
		seen[key] = true
		if _, ok := table[key]; !ok {
			t.Errorf("route %s is not in docs/api.md's route table", key)
		}
	}
	for key := range table {
		if !seen[key] {
			t.Errorf("docs/api.md lists %s, which the router does not serve", key)
		}
	}
}
