package bench

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"github.com/berthhq/berth/core/idempotency"
	"github.com/berthhq/berth/core/rollout"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/berthhq/berth/core/api"
	"github.com/berthhq/berth/core/bundles"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/services"
)

// idempotencyBacklog is how many recorded keys the collection holds before the keyed runs.
const idempotencyBacklog = 1000

type nopHinter struct{}

func (nopHinter) Hint(string) {}

// BenchmarkIdempotencyKey measures what Idempotency-Key costs a mutating request of the real API
// over loopback HTTP on the embedded store (docs/api.md section 1.7): PUT /projects/{p} of an
// existing project without a key, with a fresh key each time (one claim insert and one
// compare-and-set that records the answer), and the replay of one key (one read by _id), with
// idempotencyBacklog records already stored.
func BenchmarkIdempotencyKey(b *testing.B) {
	ctx := context.Background()
	st := openStore(b)
	tokens := identity.NewTokens(st)
	_, admin, err := tokens.EnsureAdmin(ctx, b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	cat := services.NewCatalog(st, nil)
	if err := cat.EnsureIndexes(ctx); err != nil {
		b.Fatal(err)
	}
	bs, err := bundles.New(filepath.Join(b.TempDir(), "blobs"), st.Collection("bundles"), 1<<20)
	if err != nil {
		b.Fatal(err)
	}
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	srv := httptest.NewServer(api.New(api.Config{Runtime: rollout.NewStore(st, cat, nil), Idempotency: idempotency.New(st), Catalog: cat, Nodes: nodes.NewRegistry(st, nil), Bundles: bs, Tokens: tokens,
		Hinter: nopHinter{}, PublicURL: "http://127.0.0.1:1", ClusterID: "cls_bench", ClusterPublicKey: pub}))
	b.Cleanup(srv.Close)
	put := func(b *testing.B, key string, want int) {
		req, _ := http.NewRequest(http.MethodPut, srv.URL+"/api/v1/projects/bench", bytes.NewReader([]byte(`{}`)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+admin)
		if key != "" {
			req.Header.Set(api.HeaderIdempotencyKey, key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != want {
			b.Fatalf("PUT /projects/bench: %d, want %d", resp.StatusCode, want)
		}
	}
	put(b, "", 201)
	b.Run("no_key", func(b *testing.B) {
		for b.Loop() {
			put(b, "", 200)
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "requests/s")
	})
	for i := range idempotencyBacklog {
		put(b, fmt.Sprintf("backlog-%d", i), 200)
	}
	b.Run(fmt.Sprintf("fresh_key_%d_recorded", idempotencyBacklog), func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			put(b, fmt.Sprintf("fresh-%s-%d", b.Name(), i), 200)
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "requests/s")
	})
	b.Run(fmt.Sprintf("replay_%d_recorded", idempotencyBacklog), func(b *testing.B) {
		put(b, "replayed", 200)
		for b.Loop() {
			put(b, "replayed", 200)
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "replays/s")
	})
}
