package policy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	abiwasm "github.com/berthhq/berth/abi/wasm"
	"github.com/berthhq/berth/core/bundles"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/store/storetest"
	hostwasm "github.com/berthhq/berth/host/wasm"
	"github.com/berthhq/berth/internal/wasmtest"
)

// TestConcurrentAppliesNotRefusedForTime: 64 concurrent legal applies of
// about 0.9 MiB, then 64 small ones, against the example cap-replicas policy
// and a second independent policy, all within the default deadline: none
// is refused, and none for time; every decision is recorded in the change
// log and the index, as the API records them. Before the fuel check replaced
// WithCloseOnContextDone, 63 of 64 large applies were refused "ran past 1s".
func TestConcurrentAppliesNotRefusedForTime(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t)
	blobs, err := bundles.New(filepath.Join(t.TempDir(), "blobs"), st.Collection("bundles"), 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := hostwasm.New(ctx, hostwasm.Config{CacheDir: wasmtest.CacheDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Close(context.Background()) })
	clog := changelog.New(st, 1, nil) // as the API runs it: every decision is appended before Admit returns
	e := New(Config{Store: st, Blobs: blobs, Runtime: rt, Changelog: clog})
	if err := e.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	for _, p := range []struct{ dir, config string }{
		{"examples/policies/cap-replicas", `{"max_replicas": 1000, "max_capacity_units": 100000}`},
		{"examples/policies/require-digest", ""},
	} {
		m, err := e.PutModule(ctx, bytes.NewReader(wasmtest.BuildGo(t, p.dir)))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.Bind(ctx, Binding{Hook: abiwasm.HookServiceApply, ModuleDigest: m.Digest, Config: p.config}); err != nil {
			t.Fatal(err)
		}
	}
	input := func(i, envBytes int) abiwasm.PolicyInput {
		env := map[string]string{}
		for k := 0; envBytes > 0; k++ {
			env[fmt.Sprintf("VAR_%05d", k)] = strings.Repeat("v", 1000)
			envBytes -= 1000 + 16
		}
		obj, err := json.Marshal(abiwasm.Service{Project: "shop", Name: fmt.Sprintf("svc-%d", i), Bundle: "sha256:" + strings.Repeat("ab", 32),
			Replicas: 1, CapacityUnits: 1, Env: env})
		if err != nil {
			t.Fatal(err)
		}
		return abiwasm.PolicyInput{Hook: abiwasm.HookServiceApply, Actor: abiwasm.Actor{Kind: "token", ID: "tok_1"},
			Project: &abiwasm.Project{Name: "shop", Services: 1, Replicas: 1, CapacityUnits: 1}, Object: obj}
	}
	for _, size := range []int{900 << 10, 1 << 10} {
		var wg sync.WaitGroup
		verdicts := make([]Verdict, 64)
		errs := make([]error, 64)
		for i := range 64 {
			in := input(i, size) // distinct inputs: nothing is answered from memory
			wg.Go(func() { verdicts[i], errs[i] = e.Admit(ctx, "shop", in) })
		}
		wg.Wait()
		refused := 0
		for i, v := range verdicts {
			if errs[i] != nil {
				t.Fatalf("size %d, apply %d: %v", size, i, errs[i])
			}
			if !v.Allowed {
				refused++
				t.Errorf("size %d, apply %d refused: %q", size, i, v.Reasons)
			}
		}
		if refused > 0 {
			t.Fatalf("%d of 64 legal applies of %d bytes refused", refused, size)
		}
	}
	// Every decision of both bursts (64 applies, 2 bindings, 2 sizes) is in
	// the log once and indexed with its entry.
	entries, err := clog.Range(ctx, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	seqOf := map[string]int64{}
	for _, en := range entries {
		if en.EntityType == DecisionEntityType {
			seqOf[en.EntityID] = en.Seq
		}
	}
	ds, err := e.Decisions(ctx, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 256 || len(seqOf) != 256 {
		t.Fatalf("%d decisions indexed, %d in the log; want 256 each", len(ds), len(seqOf))
	}
	for _, d := range ds {
		if d.Seq == 0 || d.Seq != seqOf[d.ID] {
			t.Fatalf("decision %s indexed with seq %d, its entry is %d", d.ID, d.Seq, seqOf[d.ID])
		}
	}
}
