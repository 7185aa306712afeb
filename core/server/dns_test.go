package server

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/secrets"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/store/storetest"
)

// TestResolveTSIGFromSecrets: a tsig_secret_ref in the DNS configuration is replaced by the
// secret's current value as tsig_secret, every other field kept; a missing secret, a bad
// reference and a reference beside an inline secret are refused.
func TestResolveTSIGFromSecrets(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t)
	cat := services.NewCatalog(st, nil)
	p, _, err := cat.EnsureProject(ctx, "infra")
	if err != nil {
		t.Fatal(err)
	}
	kr, _, err := secrets.LoadOrCreateKeyring(filepath.Join(t.TempDir(), "keys", "secrets.keyring"), true)
	if err != nil {
		t.Fatal(err)
	}
	sec := secrets.NewStore(st, kr, nil)
	if _, _, err := sec.Put(ctx, p.ID, p.Name, "dns-tsig", []byte("c2VjcmV0LXZhbHVl\n"), "test"); err != nil {
		t.Fatal(err)
	}
	resolve := func(conf string) (map[string]any, error) {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal([]byte(conf), &obj); err != nil {
			t.Fatal(err)
		}
		raw, err := resolveTSIG(ctx, obj, obj["tsig_secret_ref"], cat, sec)
		if err != nil {
			return nil, err
		}
		var out map[string]any
		if err := json.Unmarshal(raw, &out); err != nil {
			t.Fatal(err)
		}
		return out, nil
	}
	got, err := resolve(`{"server":"127.0.0.1:53","zones":["example.test"],"tsig_key_name":"berth","tsig_secret_ref":{"project":"infra","secret":"dns-tsig"}}`)
	if err != nil {
		t.Fatal(err)
	}
	if got["tsig_secret"] != "c2VjcmV0LXZhbHVl" || got["tsig_secret_ref"] != nil || got["server"] != "127.0.0.1:53" || got["tsig_key_name"] != "berth" {
		t.Errorf("resolved configuration %v", got)
	}
	for _, bad := range []string{
		`{"tsig_secret_ref":{"project":"infra","secret":"nope"}}`,
		`{"tsig_secret_ref":{"project":"nope","secret":"dns-tsig"}}`,
		`{"tsig_secret_ref":"dns-tsig"}`,
		`{"tsig_secret":"x","tsig_secret_ref":{"project":"infra","secret":"dns-tsig"}}`,
	} {
		if _, err := resolve(bad); err == nil {
			t.Errorf("%s: resolved, want an error", bad)
		} else if strings.Contains(err.Error(), "c2VjcmV0") {
			t.Errorf("%s: the error quotes the secret: %v", bad, err)
		}
	}
}

// TestEdgeAddressesFollowConnectedEdgeNodes: the edge addresses are --edge-addresses and the
// edge-address label of every connected node; a node's addresses stay for the grace period after
// its session ends (a berthd restart, a blip) and go after it.
func TestEdgeAddressesFollowConnectedEdgeNodes(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t)
	reg := nodes.NewRegistry(st, nil)
	if err := reg.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	enroll := func(labels map[string]string) *nodes.Node {
		t.Helper()
		tok, _, err := reg.CreateJoinToken(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		pub, _, _ := ed25519.GenerateKey(rand.Reader)
		n, _, err := reg.Enroll(ctx, nodes.EnrollRequest{JoinToken: tok, PublicKey: base64.StdEncoding.EncodeToString(pub), Hostname: "n", Address: "10.0.0.1", Labels: labels})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	edge := enroll(map[string]string{EdgeAddressLabel: "203.0.113.5, 2001:db8::5,junk"})
	plain := enroll(map[string]string{"zone": "a"})
	enroll(map[string]string{EdgeAddressLabel: "203.0.113.9"}) // labelled, but never connects
	for _, n := range []*nodes.Node{edge, plain} {
		if err := reg.SessionStarted(ctx, n.ID, "ses_"+n.ID, "test", nil); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	d := &dns{nodes: reg, edge: []string{"192.0.2.1"}, now: func() time.Time { return now }}
	got, err := d.edgeAddresses(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"192.0.2.1", "2001:db8::5", "203.0.113.5"}; !slices.Equal(got, want) {
		t.Errorf("edge addresses %v, want %v", got, want)
	}
	if err := reg.SessionEnded(ctx, edge.ID, "ses_"+edge.ID); err != nil {
		t.Fatal(err)
	}
	if got, err = d.edgeAddresses(ctx); err != nil || len(got) != 3 {
		t.Errorf("edge addresses just after the edge node's session ended: %v %v, want all three", got, err)
	}
	now = now.Add(edgeGrace + time.Second)
	got, err = d.edgeAddresses(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"192.0.2.1"}; !slices.Equal(got, want) {
		t.Errorf("edge addresses after the edge node left %v, want %v", got, want)
	}
}
