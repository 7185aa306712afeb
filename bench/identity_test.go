package bench

import (
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
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/berthhq/berth/core/api"
	"github.com/berthhq/berth/core/bundles"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/services"
)

// cpuTime is the user and system CPU time this process has used so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

type noHints struct{}

func (noHints) Hint(string) {}

// BenchmarkIdentity measures identity on the embedded store with the production argon2id
// parameters (docs/api.md section 9): the login p50 (one argon2id verification and one session
// insert), the p50 of a login of an unknown user, the bare verification p50, and, in one run, authenticated requests per second with
// a machine token (one digest lookup by _id per request) against unauthenticated /healthz.
func BenchmarkIdentity(b *testing.B) {
	ctx := context.Background()
	st := openStore(b)
	tokens := identity.NewTokens(st)
	const pw = "a benchmark password of enough length"
	if _, err := tokens.CreateUser(ctx, identity.NewUserRequest{Name: "bench", Kind: identity.KindHuman,
		Roles: []identity.Role{identity.RoleAdmin}, Password: pw}); err != nil {
		b.Fatal(err)
	}
	p50 := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Microseconds()) / 1000
	}
	b.Run("login", func(b *testing.B) {
		var d []time.Duration
		for b.Loop() {
			start := time.Now()
			if _, err := tokens.Login(ctx, "bench", pw, 0); err != nil {
				b.Fatal(err)
			}
			d = append(d, time.Since(start))
		}
		b.ReportMetric(p50(d), "p50_ms")
	})
	// An unknown user costs one verification of the dummy verifier: the same time class.
	b.Run("login_unknown_user", func(b *testing.B) {
		var d []time.Duration
		n := 0
		for b.Loop() {
			n++ // a new name each time: one name's failures would put it in backoff
			start := time.Now()
			if _, err := tokens.Login(ctx, fmt.Sprintf("nobody-%d", n), pw, 0); err != identity.ErrUnauthenticated {
				b.Fatal(err)
			}
			d = append(d, time.Since(start))
		}
		b.ReportMetric(p50(d), "p50_ms")
	})
	b.Run("verify", func(b *testing.B) {
		v, err := identity.HashPassword(pw, identity.DefaultArgon2Params)
		if err != nil {
			b.Fatal(err)
		}
		var d []time.Duration
		before := cpuTime(b)
		for b.Loop() {
			start := time.Now()
			if !identity.VerifyPassword(pw, v) {
				b.Fatal("verify failed")
			}
			d = append(d, time.Since(start))
		}
		b.ReportMetric(p50(d), "p50_ms")
		// CPU time per verification: what it costs one core, whatever else the machine runs.
		b.ReportMetric(float64((cpuTime(b)-before).Microseconds())/1000/float64(b.N), "cpu_ms")
	})

	bs, err := bundles.New(filepath.Join(b.TempDir(), "blobs"), st.Collection("bundles"), 1<<20)
	if err != nil {
		b.Fatal(err)
	}
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	srv := httptest.NewServer(api.New(api.Config{Runtime: rollout.NewStore(st, services.NewCatalog(st, nil), nil), Idempotency: idempotency.New(st), Catalog: services.NewCatalog(st, nil), Nodes: nodes.NewRegistry(st, nil),
		Bundles: bs, Tokens: tokens, Hinter: noHints{}, PublicURL: "http://127.0.0.1:1", ClusterID: "cls_bench", ClusterPublicKey: pub}))
	b.Cleanup(srv.Close)
	tok, _, err := tokens.CreateMachine(ctx, identity.MachineTokenRequest{Name: "bench", Scopes: []identity.Scope{identity.ScopeServicesRead}})
	if err != nil {
		b.Fatal(err)
	}
	get := func(b *testing.B, path, token string) {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("GET %s: %d", path, resp.StatusCode)
		}
	}
	b.Run("healthz", func(b *testing.B) {
		for b.Loop() {
			get(b, "/healthz", "")
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "requests/s")
	})
	b.Run("token_whoami", func(b *testing.B) {
		for b.Loop() {
			get(b, "/api/v1/whoami", tok)
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "requests/s")
	})
}
