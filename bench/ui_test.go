package bench

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"github.com/berthhq/berth/core/certs"
	"github.com/berthhq/berth/core/idempotency"
	"github.com/berthhq/berth/core/rollout"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/berthhq/berth/core/api"
	"github.com/berthhq/berth/core/bundles"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/ui"
)

// BenchmarkDashboardOverview measures the dashboard's overview on the embedded store with
// 1,000 services in 10 projects and 300 nodes (297 connected, 3 disconnected), wired as berthd
// wires it (the change generation of the read view): the p50 and p95 time to the first byte of
// GET /ui/ while nothing changes (the session's data read once per change: whoami and the
// render), and the p95 of a GET right after a service was written (every read through the
// in-process API: whoami, projects, services per project, workloads, nodes, and the rollout of
// the first 20 services in progress, since without a reconciler every service reads converging).
func BenchmarkDashboardOverview(b *testing.B) {
	ctx := context.Background()
	st := openStore(b)
	tokens := identity.NewTokens(st)
	reg := nodes.NewRegistry(st, nil)
	cat := services.NewCatalog(st, nil)
	if err := reg.EnsureIndexes(ctx); err != nil {
		b.Fatal(err)
	}
	if err := cat.EnsureIndexes(ctx); err != nil {
		b.Fatal(err)
	}
	const projects, perProject, fleet, fleetDown = 10, 100, 300, 3
	for p := range projects {
		proj, _, err := cat.EnsureProject(ctx, fmt.Sprintf("p%02d", p))
		if err != nil {
			b.Fatal(err)
		}
		for s := range perProject {
			svc := &services.Service{Name: fmt.Sprintf("svc-%03d", s), Bundle: "app", BundleDigest: "sha256:" + fmt.Sprintf("%064x", p*perProject+s),
				Command: []string{"./app"}, Replicas: 2, Port: 8080}
			if _, _, err := cat.PutService(ctx, proj, svc, nil); err != nil {
				b.Fatal(err)
			}
		}
	}
	for i := range fleet {
		jt, _, err := reg.CreateJoinToken(ctx, time.Hour)
		if err != nil {
			b.Fatal(err)
		}
		pub, _, _ := ed25519.GenerateKey(rand.Reader)
		n, _, err := reg.Enroll(ctx, nodes.EnrollRequest{JoinToken: jt, PublicKey: base64.StdEncoding.EncodeToString(pub),
			Hostname: fmt.Sprintf("node-%03d", i), Region: "r1", CPUs: 4, MemoryMB: 8192})
		if err != nil {
			b.Fatal(err)
		}
		session := fmt.Sprintf("sess-%03d", i)
		if err := reg.SessionStarted(ctx, n.ID, session, "bench", []string{"process"}); err != nil {
			b.Fatal(err)
		}
		if i < fleetDown {
			if err := reg.SessionEnded(ctx, n.ID, session); err != nil {
				b.Fatal(err)
			}
		}
	}
	token, err := tokens.Create(ctx, identity.KindAdmin, "bench-admin", []identity.Scope{identity.ScopeAdmin}, 0)
	if err != nil {
		b.Fatal(err)
	}
	bs, err := bundles.New(filepath.Join(b.TempDir(), "blobs"), st.Collection("bundles"), 1<<20)
	if err != nil {
		b.Fatal(err)
	}
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	apiSrv := api.New(api.Config{Catalog: cat, Nodes: reg, Bundles: bs, Tokens: tokens, Hinter: noHints{},
		PublicURL: "http://127.0.0.1:1", ClusterID: "cls_bench", ClusterPublicKey: pub,
		Runtime: rollout.NewStore(st, cat, nil), Idempotency: idempotency.New(st), Certificates: certs.NewStatusReader(st)})
	dash := ui.New(ui.Config{API: apiSrv, Generation: ui.Generation(st.View(), "services", "workloads", "slots", "runtime_status", "nodes")})
	srv := httptest.NewServer(dash)
	b.Cleanup(srv.Close)

	get := func() time.Duration {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/ui/", nil)
		req.AddCookie(&http.Cookie{Name: "berth_session", Value: token})
		start := time.Now()
		resp, err := srv.Client().Do(req)
		if err != nil {
			b.Fatal(err)
		}
		first := time.Since(start) // headers are written after the page is rendered
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("GET /ui/: %d", resp.StatusCode)
		}
		return first
	}
	get() // warm the read view
	proj, _, err := cat.EnsureProject(ctx, "p00")
	if err != nil {
		b.Fatal(err)
	}
	var d, changed []time.Duration
	i := 0
	for b.Loop() {
		d = append(d, get())
		// Every fourth request follows a write of one service (untimed): the read after a change.
		if i++; i%4 == 0 {
			svc := &services.Service{Name: "svc-000", Bundle: "app", BundleDigest: "sha256:" + fmt.Sprintf("%064x", 0),
				Command: []string{"./app"}, Replicas: 2 + i/4%2, Port: 8080}
			if _, _, err := cat.PutService(ctx, proj, svc, nil); err != nil {
				b.Fatal(err)
			}
			changed = append(changed, get())
		}
	}
	ms := func(d []time.Duration, q float64) float64 {
		if len(d) == 0 {
			return 0
		}
		slices.Sort(d)
		return float64(d[int(q*float64(len(d)-1))].Microseconds()) / 1000
	}
	b.ReportMetric(ms(d, 0.5), "first_byte_p50_ms")
	b.ReportMetric(ms(d, 0.95), "first_byte_p95_ms")
	b.ReportMetric(ms(changed, 0.95), "first_byte_after_change_p95_ms")
	b.ReportMetric(0, "ns/op")
}
