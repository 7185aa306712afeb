package delivery

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"path/filepath"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"golang.org/x/crypto/nacl/box"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/secrets"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/store/storetest"
)

func TestResolveAndSeal(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t)
	kr, _, err := secrets.LoadOrCreateKeyring(filepath.Join(t.TempDir(), "k"), true)
	if err != nil {
		t.Fatal(err)
	}
	ss := secrets.NewStore(st, kr, nil)
	for _, v := range []string{"one", "two"} {
		if _, _, err := ss.Put(ctx, "prj_1", "shop", "db", []byte("db-"+v), "a"); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := ss.Put(ctx, "prj_1", "shop", "stripe", []byte("sk-1"), "a"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ss.PutSet(ctx, "prj_1", "shop", "payments", map[string]secrets.Ref{"STRIPE": {Secret: "stripe"}}, nil); err != nil {
		t.Fatal(err)
	}
	pub, priv, _ := box.GenerateKey(rand.Reader)
	n := &nodes.Node{ID: "nod_1", BoxPublicKey: base64.StdEncoding.EncodeToString(pub[:])}
	svc := &services.Service{ID: "svc_1", ProjectID: "prj_1", Project: "shop", Name: "api",
		Secrets: map[string]secrets.Ref{"DB_URL": {Secret: "db", Version: 1}, "DB_NOW": {Secret: "db", As: secrets.AsFile}}, SecretSets: []string{"payments"}}
	wl := &services.Workload{ID: "wl_1", ServiceID: "svc_1"}
	spec := func() node.Spec {
		return node.Spec{Workloads: []node.WorkloadSpec{{WorkloadID: "wl_1", ProjectID: "prj_1", ServiceID: "svc_1"}}}
	}
	s := &Sealer{Secrets: ss}
	a, b := spec(), spec()
	for _, sp := range []*node.Spec{&a, &b} {
		if err := s.Resolve(ctx, n, sp, map[string]*services.Workload{"wl_1": wl}, map[string]*services.Service{"svc_1": svc}); err != nil {
			t.Fatal(err)
		}
	}
	ra, _ := json.Marshal(a)
	rb, _ := json.Marshal(b)
	if string(ra) != string(rb) {
		t.Fatalf("Resolve is not deterministic:\n%s\n%s", ra, rb)
	}
	got := a.Workloads[0].Secrets
	if len(got) != 3 || got[0].Key != "DB_NOW" || got[0].Version != 2 || got[0].As != "file" || got[1].Version != 1 || got[2].Key != "STRIPE" {
		t.Fatalf("resolved %+v", got)
	}
	if err := s.Seal(ctx, n, &a); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"DB_NOW": "db-two", "DB_URL": "db-one", "STRIPE": "sk-1"}
	for _, e := range a.Workloads[0].Secrets {
		plain, ok := box.OpenAnonymous(nil, e.Sealed, pub, priv)
		v, bound := node.OpenedSecretValue("wl_1", e, plain)
		if !ok || !bound || string(v) != want[e.Key] {
			t.Fatalf("%s: opened %v bound %v", e.Key, ok, bound)
		}
	}
	// A tampered stored ciphertext is not sealed for the node: the workload gets no value.
	id := secrets.DocID("prj_1", "stripe")
	if _, err := st.Collection(secrets.Collection).UpdateOne(ctx, bson.M{"_id": id}, bson.M{"$set": bson.M{"versions.0.sealed.kek_id": "kek_01HZZZZZZZZZZZZZZZZZZZZZZZ"}}); err != nil {
		t.Fatal(err)
	}
	c := spec()
	if err := s.Resolve(ctx, n, &c, map[string]*services.Workload{"wl_1": wl}, map[string]*services.Service{"svc_1": svc}); err != nil {
		t.Fatal(err)
	}
	if err := s.Seal(ctx, n, &c); !errors.Is(err, secrets.ErrUnknownKEK) {
		t.Fatalf("Seal of a tampered version = %v", err)
	}
	if e := c.Workloads[0].Secrets[2]; e.Key != "STRIPE" || e.Sealed != nil {
		t.Fatalf("tampered entry %+v was sealed", e)
	}
	// A workload admitted with resolved versions gets those, whatever is current now.
	pinned := &services.Workload{ID: "wl_1", ServiceID: "svc_1", Run: &services.Invocation{
		ResolvedSecrets: map[string]secrets.Ref{"DB_URL": {Secret: "db", Version: 1}, "GONE": {Secret: "db", Version: 9}}}}
	e := spec()
	if err := s.Resolve(ctx, n, &e, map[string]*services.Workload{"wl_1": pinned}, map[string]*services.Service{"svc_1": svc}); err != nil {
		t.Fatal(err)
	}
	if got := e.Workloads[0].Secrets; len(got) != 2 || got[0].Key != "DB_URL" || got[0].Version != 1 || got[1].Version != 0 || got[1].RecipientKey != "" {
		t.Fatalf("resolved from the attempt: %+v", got)
	}
	// A node without a key gets entries without recipient, which its agent refuses.
	d := spec()
	if err := s.Resolve(ctx, &nodes.Node{ID: "nod_2"}, &d, map[string]*services.Workload{"wl_1": wl}, map[string]*services.Service{"svc_1": svc}); err != nil {
		t.Fatal(err)
	}
	if d.Workloads[0].Secrets[0].RecipientKey != "" {
		t.Fatalf("a node without a key got a recipient")
	}
}
