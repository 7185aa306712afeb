package guard_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/pluginapi"
	"github.com/berthhq/berth/sdk/guard"
)

func TestMutateFencesAndReplays(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"memory", "durable"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			dir := ""
			if mode == "durable" {
				dir = t.TempDir()
			}
			g, err := guard.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			var runs atomic.Int32
			do := func(key string, token uint64, req string) (string, error) {
				return guard.Mutate(ctx, g, "res/1", pluginapi.Mutation{IdempotencyKey: key, FencingToken: token}, req, func() (string, error) {
					return fmt.Sprintf("result-%d", runs.Add(1)), nil
				})
			}
			if r, err := do("k1", 5, "a"); err != nil || r != "result-1" {
				t.Fatalf("first = %q, %v", r, err)
			}
			if r, err := do("k1", 5, "a"); err != nil || r != "result-1" || runs.Load() != 1 {
				t.Fatalf("replay = %q, %v (runs %d)", r, err, runs.Load())
			}
			if _, err := do("k1", 5, "b"); abierrors.CodeOf(err) != abierrors.IdempotencyKeyReused {
				t.Fatalf("same key, other request err = %v", err)
			}
			if _, err := do("k2", 4, "c"); !errors.Is(err, pluginapi.ErrStaleFencingToken) || runs.Load() != 1 {
				t.Fatalf("stale token err = %v (runs %d)", err, runs.Load())
			}
			if mode == "durable" {
				g2, err := guard.Open(dir)
				if err != nil {
					t.Fatal(err)
				}
				if h, err := g2.Fence.Highest("res/1"); err != nil || h != 5 {
					t.Fatalf("highest after reopen = %d, %v", h, err)
				}
				r, err := guard.Mutate(ctx, g2, "res/1", pluginapi.Mutation{IdempotencyKey: "k1", FencingToken: 5}, "a", func() (string, error) { return "again", nil })
				if err != nil || r != "result-1" {
					t.Fatalf("replay after reopen = %q, %v", r, err)
				}
			}
		})
	}
}

// BenchmarkMutate measures the guards' cost per call: fence check plus
// idempotency record, in memory and on disk (one fsync'd file per new key,
// one per raised token).
func BenchmarkMutate(b *testing.B) {
	for _, mode := range []string{"memory", "durable"} {
		b.Run(mode, func(b *testing.B) {
			dir := ""
			if mode == "durable" {
				dir = b.TempDir()
			}
			g, err := guard.Open(dir)
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			i := 0
			for b.Loop() {
				i++
				_, err := guard.Mutate(ctx, g, "res/1", pluginapi.Mutation{IdempotencyKey: fmt.Sprint("k", i), FencingToken: uint64(i)}, i,
					func() (int, error) { return i, nil })
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestMutateFencedByAnotherResource: calls on two resources fenced by one
// shared resource (a lease over two workloads) share its highest token,
// durably: a lower token is refused for either resource, also after reopen,
// and the resources' own fences stay untouched.
func TestMutateFencedByAnotherResource(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx := context.Background()
	g, err := guard.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	do := func(g *guard.Guards, res string, token uint64) error {
		_, err := guard.MutateFenced(ctx, g, res, "lease/1", pluginapi.Mutation{FencingToken: token}, res, func() (int32, error) {
			return runs.Add(1), nil
		})
		return err
	}
	if err := do(g, "workload/a", 5); err != nil {
		t.Fatal(err)
	}
	if err := do(g, "workload/b", 4); !errors.Is(err, pluginapi.ErrStaleFencingToken) || runs.Load() != 1 {
		t.Fatalf("lower token on another resource under the same fence = %v (runs %d)", err, runs.Load())
	}
	g2, err := guard.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := do(g2, "workload/b", 4); !errors.Is(err, pluginapi.ErrStaleFencingToken) {
		t.Fatalf("after reopen = %v; want stale", err)
	}
	if err := do(g2, "workload/b", 5); err != nil {
		t.Fatalf("equal token after reopen: %v", err)
	}
	if h, err := g2.Fence.Highest("workload/a"); err != nil || h != 0 {
		t.Fatalf("the workload's own fence = %d, %v; want untouched", h, err)
	}
}
