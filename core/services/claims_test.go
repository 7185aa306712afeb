package services

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthhq/berth/core/store/storetest"
)

// TestRouteClaimsFirstApplyHoldsTheHostname: the first service to apply a
// hostname holds its claim (one document per hostname); another service is
// refused while the holder declares it, and while a claim its holder dropped
// is younger than the grace an apply in flight needs; after that the claim
// has lapsed and moves, and the holder's deletion releases what it holds
// (docs/routes.md section 2).
func TestRouteClaimsFirstApplyHoldsTheHostname(t *testing.T) {
	st := storetest.Open(t)
	ctx := context.Background()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	cat := NewCatalog(st, func() time.Time { return now })
	shop, _, _ := cat.EnsureProject(ctx, "shop")
	blog, _, _ := cat.EnsureProject(ctx, "blog")
	apply := func(p *Project, name string, domains ...string) error {
		t.Helper()
		var expected *int64
		if cur, err := cat.GetService(ctx, p, name); err == nil {
			expected = &cur.Revision
		}
		_, _, err := cat.ApplyService(ctx, p, &Service{Name: name, BundleDigest: "sha256:1", Command: []string{"./web"}, Port: 8080, Replicas: 1, Domains: domains}, expected)
		return err
	}
	holder := func(host string) string {
		t.Helper()
		cls, err := cat.ListRouteClaims(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cls {
			if c.Hostname == host {
				return c.Project + "/" + c.Service
			}
		}
		return ""
	}
	if err := apply(shop, "web", "shop.example.com", "www.example.com"); err != nil {
		t.Fatal(err)
	}
	if err := apply(shop, "web", "shop.example.com", "www.example.com"); err != nil { // idempotent
		t.Fatal(err)
	}
	if h := holder("shop.example.com"); h != "shop/web" {
		t.Fatalf("holder %q", h)
	}
	if err := apply(blog, "www", "www.example.com"); !errors.Is(err, ErrDomainTaken) {
		t.Fatalf("another service applying a held hostname: %v", err)
	}
	// shop/web drops www: the claim stays fresh for the grace, then lapses.
	if err := apply(shop, "web", "shop.example.com"); err != nil {
		t.Fatal(err)
	}
	if err := apply(blog, "www", "www.example.com"); !errors.Is(err, ErrDomainTaken) {
		t.Fatalf("a claim dropped within the grace: %v", err)
	}
	now = now.Add(claimGrace + time.Second)
	if err := apply(blog, "www", "www.example.com"); err != nil {
		t.Fatalf("taking a lapsed claim: %v", err)
	}
	if h := holder("www.example.com"); h != "blog/www" {
		t.Fatalf("holder after the take-over %q", h)
	}
	// A claim just taken whose service is not written yet (an apply in flight,
	// or one that died) holds for the grace.
	if err := cat.claimDomains(ctx, shop, &Service{Name: "next", Domains: []string{"next.example.com"}}); err != nil {
		t.Fatal(err)
	}
	err := apply(blog, "www", "www.example.com", "next.example.com")
	if !errors.Is(err, ErrDomainTaken) || !strings.Contains(err.Error(), "claimed by shop/next") {
		t.Fatalf("a claim in flight: %v", err)
	}
	now = now.Add(2 * claimGrace)
	if err := apply(blog, "www", "www.example.com", "next.example.com"); err != nil {
		t.Fatalf("after the grace of a claim whose service never came: %v", err)
	}
	// Removing shop/web releases its claims.
	if err := cat.DeleteService(ctx, shop, "web", nil); err != nil {
		t.Fatal(err)
	}
	if h := holder("shop.example.com"); h != "" {
		t.Fatalf("claim left after the service went: %q", h)
	}
}

// TestRouteClaimsRacingAppliesOneWins: two services applying the same new
// hostname at once: exactly one apply succeeds and holds the claim, the
// other is refused ErrDomainTaken, in every round.
func TestRouteClaimsRacingAppliesOneWins(t *testing.T) {
	st := storetest.Open(t)
	ctx := context.Background()
	cat := NewCatalog(st, nil)
	p, _, _ := cat.EnsureProject(ctx, "race")
	for round := range 10 {
		host := fmt.Sprintf("r%d.example.com", round)
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for i, name := range []string{fmt.Sprintf("a%d", round), fmt.Sprintf("b%d", round)} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _, errs[i] = cat.ApplyService(ctx, p, &Service{Name: name, BundleDigest: "sha256:1", Command: []string{"./web"}, Port: 8080, Replicas: 1, Domains: []string{host}}, nil)
			}()
		}
		wg.Wait()
		won := -1
		for i, err := range errs {
			switch {
			case err == nil && won < 0:
				won = i
			case err == nil:
				t.Fatalf("round %d: both applies of %s succeeded", round, host)
			case !errors.Is(err, ErrDomainTaken):
				t.Fatalf("round %d: %v, want ErrDomainTaken", round, err)
			}
		}
		if won < 0 {
			t.Fatalf("round %d: neither apply succeeded: %v", round, errs)
		}
		cls, err := cat.ListRouteClaims(ctx)
		if err != nil {
			t.Fatal(err)
		}
		winner := []string{fmt.Sprintf("a%d", round), fmt.Sprintf("b%d", round)}[won]
		found := false
		for _, c := range cls {
			if c.Hostname == host {
				found = c.Service == winner
			}
		}
		if !found {
			t.Fatalf("round %d: the claim on %s is not %s's: %+v", round, host, winner, cls)
		}
	}
}
