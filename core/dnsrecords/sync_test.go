package dnsrecords_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"slices"
	"testing"
	"time"

	"github.com/berthhq/berth/core/dnsrecords"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/store/storetest"
)

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
	edge := enroll(map[string]string{dnsrecords.EdgeAddressLabel: "203.0.113.5, 2001:db8::5,junk"})
	plain := enroll(map[string]string{"zone": "a"})
	enroll(map[string]string{dnsrecords.EdgeAddressLabel: "203.0.113.9"}) // labelled, but never connects
	for _, n := range []*nodes.Node{edge, plain} {
		if err := reg.SessionStarted(ctx, n.ID, "ses_"+n.ID, "test", nil); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	d := &dnsrecords.Sync{Nodes: reg, Edge: []string{"192.0.2.1"}, Now: func() time.Time { return now }}
	got, err := d.EdgeAddresses(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"192.0.2.1", "2001:db8::5", "203.0.113.5"}; !slices.Equal(got, want) {
		t.Errorf("edge addresses %v, want %v", got, want)
	}
	if err := reg.SessionEnded(ctx, edge.ID, "ses_"+edge.ID); err != nil {
		t.Fatal(err)
	}
	if got, err = d.EdgeAddresses(ctx); err != nil || len(got) != 3 {
		t.Errorf("edge addresses just after the edge node's session ended: %v %v, want all three", got, err)
	}
	now = now.Add(dnsrecords.EdgeGrace + time.Second)
	got, err = d.EdgeAddresses(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"192.0.2.1"}; !slices.Equal(got, want) {
		t.Errorf("edge addresses after the edge node left %v, want %v", got, want)
	}
}
