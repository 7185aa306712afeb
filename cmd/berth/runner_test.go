package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	abirunner "github.com/berthhq/berth/abi/runner"
	"github.com/berthhq/berth/core/api"
	"github.com/berthhq/berth/core/leases"
	"github.com/berthhq/berth/core/operations"
	"github.com/berthhq/berth/core/placement"
	"github.com/berthhq/berth/core/runners"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/sdk/client"
	"github.com/berthhq/berth/sdk/runner"
)

type quietHinter struct{}

func (quietHinter) Hint(string) {}

// realAPI serves berthd's real /api/v1 and /api/runner/v1 handlers (core/api) with orchestration on
// a test store over loopback HTTP ([apiOnStore]), and returns its URL and an admin token.
func realAPI(t *testing.T) (string, string) {
	t.Helper()
	_, _, url, admin := apiOnStore(t, func(_ string, st *store.Store, cfg *api.Config) {
		reg := runners.NewRegistry(st, runners.Config{})
		ops := operations.NewQueue(st, operations.Config{})
		if err := ops.EnsureIndexes(context.Background()); err != nil {
			t.Fatal(err)
		}
		cfg.Orchestration = &api.Orchestration{Leases: leases.NewManager(st, leases.Config{Owner: "brd_cli_test"}), Runners: reg,
			Operations: ops, Placement: placement.NewService(st, reg, ops), Transport: true}
	})
	return url, admin
}

// TestRunnerPlacementOperationCommands drives `berth runner enroll-token create|list`,
// `berth placement set|get|delete` and `berth operation create|list` against the real API: the
// enrollment token the CLI prints registers a runner, the placement lands on it, an operation
// converges under its idempotency key, and the delete workflow revokes what is left.
func TestRunnerPlacementOperationCommands(t *testing.T) {
	url, admin := realAPI(t)
	c := newCLI(t)
	c.env["BERTH_SERVER"] = url
	c.env["BERTH_TOKEN"] = admin
	ctx := context.Background()

	out := c.ok("", "runner", "enroll-token", "create", "--node", "west-1", "--region", "us-west", "-o", "json")
	var e client.RunnerEnrollment
	if err := json.Unmarshal([]byte(out), &e); err != nil || !strings.HasPrefix(e.Token, "bre_") || e.NodeID != "west-1" || e.Region != "us-west" {
		t.Fatalf("enroll-token create -o json = %q (%v)", out, err)
	}
	out = c.ok("", "runner", "enroll-token", "create", "--node", "west-2", "--region", "us-west", "--ttl", "15m")
	if !strings.Contains(out, "bre_") || !strings.Contains(out, "shown once") {
		t.Fatalf("enroll-token create = %q", out)
	}
	if _, errOut, code := c.run("", "runner", "enroll-token", "create", "--region", "us-west"); code == 0 || !strings.Contains(errOut, "--node is required") {
		t.Fatalf("create without --node: exit %d, %q", code, errOut)
	}
	if _, errOut, code := c.run("", "runner", "enroll-token", "create", "--node", "Not_A_Label"); code == 0 || !strings.Contains(errOut, "invalid_name") {
		t.Fatalf("create with a bad node id: exit %d, %q", code, errOut)
	}
	rc, err := runner.NewClient(runner.ClientConfig{BaseURL: url})
	if err != nil {
		t.Fatal(err)
	}
	reg, err := rc.Register(ctx, e.Token, "west-1", abirunner.Declaration{Region: "us-west", Capacity: 4, Labels: map[string]string{"isolation": "docker"}})
	if err != nil {
		t.Fatalf("register with the printed token: %v", err)
	}
	out = c.ok("", "runner", "list")
	if !strings.Contains(out, "west-1") || !strings.Contains(out, "us-west") || !strings.Contains(out, "online") {
		t.Fatalf("runner list = %q", out)
	}

	digest := "sha256:" + strings.Repeat("a", 64)
	out = c.ok("", "placement", "set", "--project", "shop", "--release", digest, "--units", "2", "--require-label", "isolation=docker")
	if !strings.Contains(out, "Generation 1 of shop: assigned on \"west-1\"") {
		t.Fatalf("placement set = %q", out)
	}
	out = c.ok("", "placement", "get", "--project", "shop")
	var p client.Placement
	if err := json.Unmarshal([]byte(out), &p); err != nil || p.NodeID != "west-1" || p.CapacityUnits != 2 || p.Release != digest {
		t.Fatalf("placement get = %q (%v)", out, err)
	}
	if _, errOut, code := c.run("", "placement", "set", "--project", "shop", "--release", digest, "--mode", "stateful"); code == 0 || !strings.Contains(errOut, "placement_mode_immutable") {
		t.Fatalf("mode change: exit %d, %q", code, errOut)
	}

	out = c.ok("", "operation", "create", "--project", "shop", "--kind", "backup", "--idempotency-key", "b-1", "--payload", `{"target":"s3"}`)
	if !strings.Contains(out, "(backup) is queued.") || strings.Contains(out, "replayed") {
		t.Fatalf("operation create = %q", out)
	}
	out = c.ok("", "operation", "create", "--project", "shop", "--kind", "backup", "--idempotency-key", "b-1", "--payload", `{"target":"s3"}`)
	if !strings.Contains(out, "replayed") {
		t.Fatalf("operation create replay = %q", out)
	}
	if _, errOut, code := c.run("", "operation", "create", "--project", "shop", "--kind", "backup", "--idempotency-key", "b-1", "--payload", `{"target":"gcs"}`); code == 0 || !strings.Contains(errOut, "idempotency_key_reused") {
		t.Fatalf("same key, other body: exit %d, %q", code, errOut)
	}
	if _, errOut, code := c.run("", "operation", "create", "--project", "shop", "--kind", "delete", "--idempotency-key", "d-1"); code == 0 || !strings.Contains(errOut, "validation_failed") {
		t.Fatalf("caller-made delete: exit %d, %q", code, errOut)
	}
	claimed, err := rc.Claim(ctx, "west-1", reg.Credential, 1)
	if err != nil || len(claimed) != 1 || claimed[0].Kind != "reconcile" {
		t.Fatalf("claim = %+v, %v", claimed, err)
	}
	out = c.ok("", "operation", "list", "--project", "shop", "-o", "json")
	var ops []client.Operation
	if err := json.Unmarshal([]byte(out), &ops); err != nil || len(ops) != 2 || ops[0].State != "leased" || ops[0].NodeID != "west-1" || ops[1].State != "queued" {
		t.Fatalf("operation list -o json = %q (%v)", out, err)
	}
	out = c.ok("", "operation", "list", "--project", "shop")
	if !strings.Contains(out, "reconcile") || !strings.Contains(out, "leased") || !strings.Contains(out, "backup") {
		t.Fatalf("operation list = %q", out)
	}

	out = c.ok("", "placement", "delete", "--project", "shop")
	if !strings.Contains(out, "Placement of shop deleted; 2 operations revoked.") {
		t.Fatalf("placement delete = %q", out)
	}
	if _, errOut, code := c.run("", "placement", "get", "--project", "shop"); code == 0 || !strings.Contains(errOut, "not_found") {
		t.Fatalf("placement get after delete: exit %d, %q", code, errOut)
	}
	out = c.ok("", "runner", "list", "-o", "json")
	var rs []client.Runner
	if err := json.Unmarshal([]byte(out), &rs); err != nil || len(rs) != 1 || rs[0].Reserved != 0 {
		t.Fatalf("runners after delete = %q (%v)", out, err)
	}
}
