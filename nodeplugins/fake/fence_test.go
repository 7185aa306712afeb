package fake_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthhq/berth/abi/pluginapi"
	"github.com/berthhq/berth/nodeplugins/fake"
	"github.com/berthhq/berth/sdk/runtime"
)

// TestLeaseFenceSurvivesRestart: a start fenced by a lease raises the
// lease's highest token durably; after a restart of the driver a start of
// another workload under that lease with a lower token is refused and
// changes nothing, and a repeated key is replayed without a second start.
func TestLeaseFenceSurvivesRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	d1, err := fake.New(fake.Config{StateDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	startA := &runtime.StartRequest{WorkloadID: "wl_a", FenceResource: runtime.FenceLease("lse_1"),
		Mutation: pluginapi.Mutation{IdempotencyKey: "start/wl_a/1", FencingToken: 5}}
	first, err := d1.Start(ctx, startA)
	if err != nil {
		t.Fatal(err)
	}
	_ = d1.Close()

	d2, err := fake.New(fake.Config{StateDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d2.Close() })
	_, err = d2.Start(ctx, &runtime.StartRequest{WorkloadID: "wl_b", FenceResource: runtime.FenceLease("lse_1"),
		Mutation: pluginapi.Mutation{IdempotencyKey: "start/wl_b/1", FencingToken: 4}})
	if !errors.Is(err, pluginapi.ErrStaleFencingToken) {
		t.Fatalf("start under a lower lease token after restart = %v; want stale_fencing_token", err)
	}
	if _, err := d2.Inspect(ctx, &runtime.InspectRequest{WorkloadID: "wl_b"}); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("the refused start left wl_b: %v", err)
	}
	again, err := d2.Start(ctx, startA)
	if err != nil || !again.State.StartedAt.Equal(first.State.StartedAt) {
		t.Fatalf("replayed start = %+v, %v; want the first answer", again, err)
	}
	if _, err := d2.Start(ctx, &runtime.StartRequest{WorkloadID: "wl_b", FenceResource: runtime.FenceLease("lse_1"),
		Mutation: pluginapi.Mutation{IdempotencyKey: "start/wl_b/2", FencingToken: 6}}); err != nil {
		t.Fatalf("start under a higher token: %v", err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, fake.LogFile))
	if err != nil {
		t.Fatal(err)
	}
	log := string(raw)
	if n := strings.Count(log, " start wl_a "); n != 1 {
		t.Fatalf("wl_a started %d times; want 1:\n%s", n, log)
	}
	if !strings.Contains(log, " start wl_b key=start/wl_b/2 fence=lease/lse_1@6") {
		t.Fatalf("driver log lacks the admitted start of wl_b:\n%s", log)
	}
}
