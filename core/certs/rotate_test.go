package certs_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/berthhq/berth/core/certs"
	"github.com/berthhq/berth/core/secrets"
	"github.com/berthhq/berth/core/store/storetest"
)

// TestKeyringRotationRewrapsStoredCertificates stores certificate values sealed under the
// keyring, rotates the keyring with retirement of the old key, and kills the re-wrap of the
// certificates after its first write (a berthd that died mid-way). A second run of the
// rotation finishes the rest and retires the old key; every value still loads, under the live
// keyring and under the keyring file read again, and a further run writes nothing. A value that
// no longer opens is left alone and does not hold the rotation up. Before, the rotation
// re-wrapped secrets only, retired the old key, and every stored certificate and key stopped
// opening (certmagic then saw them as missing and ordered new ones).
func TestKeyringRotationRewrapsStoredCertificates(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t)
	kr := keyring(t)
	old := kr.ActiveKEK()
	stg := certs.NewStorage(st, kr, nil, nil, nil)
	values := map[string]string{}
	for i, key := range []string{"certificates/acme/a.example/a.example.crt", "certificates/acme/a.example/a.example.key", "acme/ca/users/ops/ops.json"} {
		values[key] = fmt.Sprintf("value %d of %s", i, key)
		if err := stg.Store(ctx, key, []byte(values[key])); err != nil {
			t.Fatal(err)
		}
	}
	sec := secrets.NewStore(st, kr, nil)
	if _, err := sec.StartRotation(ctx, true); err != nil {
		t.Fatal(err)
	}
	next := kr.ActiveKEK()

	// The first run dies right after the first certificate value it re-wrapped.
	errDied := errors.New("berthd died")
	dying := &stopAfter{set: stg, writes: 1, err: errDied}
	if err := sec.Rewrap(ctx, secrets.RewrapConfig{PerSecond: -1, Also: []secrets.SealedSet{dying}}); !errors.Is(err, errDied) {
		t.Errorf("the dying run: %v, want it to stop with its pace's error", err)
	}
	if got := len(kr.KEKs()); got != 2 {
		t.Errorf("the dying run left %d keys; the old one must stay until every value moved", got)
	}
	if r, err := sec.RotationStatus(ctx); err != nil || r.State != secrets.RotationRunning {
		t.Errorf("rotation after the dying run: %+v %v; want running", r, err)
	}

	// A value that does not open (sealed under a key this keyring never held) is left alone.
	other := keyring(t)
	lost := certs.NewStorage(st, other, nil, nil, nil)
	if err := lost.Store(ctx, "certificates/acme/lost.example/lost.example.key", []byte("gone")); err != nil {
		t.Fatal(err)
	}

	if err := sec.Rewrap(ctx, secrets.RewrapConfig{PerSecond: -1, Also: []secrets.SealedSet{stg}}); err != nil {
		t.Fatalf("the second run: %v", err)
	}
	if r, err := sec.RotationStatus(ctx); err != nil || r.State != secrets.RotationDone || len(r.Retired) != 1 || r.Retired[0] != old {
		t.Fatalf("rotation after the second run: %+v %v; want done with %s retired", r, err, old)
	}
	if kr.Has(old) || !kr.Has(next) {
		t.Fatalf("keyring holds %v; want only %s", kr.KEKs(), next)
	}
	reread, err := secrets.LoadKeyring(kr.Path())
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []*secrets.Keyring{kr, reread} {
		s := certs.NewStorage(st, k, nil, nil, nil)
		for key, want := range values {
			got, err := s.Load(ctx, key)
			if err != nil || string(got) != want {
				t.Errorf("load %s after the rotation: %q %v; want %q", key, got, err, want)
			}
		}
	}
	if moved, unopenable, err := stg.RewrapTo(ctx, next, nil); err != nil || moved != 0 || len(unopenable) != 1 {
		t.Fatalf("a further re-wrap: moved %d, unopenable %q, %v; want nothing moved and the one lost value named", moved, unopenable, err)
	}
	if got, err := lost.Load(ctx, "certificates/acme/lost.example/lost.example.key"); err != nil || string(got) != "gone" {
		t.Fatalf("the value that did not open was changed: %q %v", got, err)
	}
}

// stopAfter is a SealedSet that re-wraps through set and makes its pace fail after writes
// writes, the way a berthd that dies mid-way stops.
type stopAfter struct {
	set    secrets.SealedSet
	writes int
	err    error
}

func (s *stopAfter) Name() string { return s.set.Name() }

func (s *stopAfter) RewrapTo(ctx context.Context, kekID string, pace func(context.Context) error) (int, []string, error) {
	n := 0
	return s.set.RewrapTo(ctx, kekID, func(ctx context.Context) error {
		if n >= s.writes {
			return s.err
		}
		n++
		return pace(ctx)
	})
}

var _ secrets.SealedSet = (*stopAfter)(nil)
