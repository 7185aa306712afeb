package secrets

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/core/store/storetest"
)

func actorCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return changelog.WithActor(ctx, changelog.Actor{Type: "machine", ID: "tok_test"})
}

// dump returns every document of the package's collections as extended JSON.
func dump(t *testing.T, st *store.Store) string {
	t.Helper()
	var b strings.Builder
	for _, c := range []string{Collection, SetsCollection, RotationCollection} {
		cur, err := st.Collection(c).Find(context.Background(), bson.D{})
		if err != nil {
			t.Fatal(err)
		}
		var docs []bson.M
		if err := cur.All(context.Background(), &docs); err != nil {
			t.Fatal(err)
		}
		for _, d := range docs {
			raw, err := bson.MarshalExtJSON(d, false, false)
			if err != nil {
				t.Fatal(err)
			}
			b.Write(raw)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

func TestPutVersionsAndValueFreeStore(t *testing.T) {
	st := storetest.Open(t)
	s := NewStore(st, newKeyring(t), nil)
	ctx := actorCtx(t)
	values := []string{"Val-" + randomHex(8), "Val-" + randomHex(8)}
	for i, v := range values {
		sec, ver, err := s.Put(ctx, "prj_1", "shop", "stripe-key", []byte(v), "machine:tok_test")
		if err != nil {
			t.Fatal(err)
		}
		if ver.Version != i+1 || len(sec.Versions) != i+1 || sec.Current().Version != i+1 || len(sec.LogOutbox) == 0 {
			t.Fatalf("put %d: version %d, %d versions, outbox %d", i, ver.Version, len(sec.Versions), len(sec.LogOutbox))
		}
	}
	sec, err := s.Get(ctx, "prj_1", "stripe-key")
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range values {
		got, err := s.Open(sec, sec.Find(i+1))
		if err != nil || string(got) != v {
			t.Fatalf("open version %d: %v", i+1, err)
		}
	}
	if sec.Versions[0].Digest == sec.Versions[1].Digest {
		t.Fatalf("two different values have one digest")
	}
	if _, _, err := s.Resolve(ctx, "prj_1", "stripe-key", 3); !errors.Is(err, ErrVersionNotFound) {
		t.Fatalf("Resolve of a missing version = %v", err)
	}
	if _, err := s.Get(ctx, "prj_2", "stripe-key"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get in another project = %v", err)
	}
	// Nothing stored holds a value: not the secret document, not its change-log outbox.
	all := dump(t, st)
	for _, v := range values {
		if strings.Contains(all, v) {
			t.Fatalf("a stored document holds the value %q:\n%s", v, all)
		}
	}
	// Delete leaves a tombstone without ciphertexts; a new value starts at version 3.
	if _, err := s.Delete(ctx, "prj_1", "stripe-key", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "prj_1", "stripe-key"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get after delete = %v", err)
	}
	if l, err := s.List(ctx, "prj_1"); err != nil || len(l) != 0 {
		t.Fatalf("List after delete = %d, %v", len(l), err)
	}
	_, ver, err := s.Put(ctx, "prj_1", "shop", "stripe-key", []byte("again"), "machine:tok_test")
	if err != nil || ver.Version != 3 {
		t.Fatalf("put after delete: version %v, %v; want 3", ver, err)
	}
	if _, _, err := s.Put(ctx, "prj_1", "shop", "Bad_Name", []byte("x"), "a"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad name = %v", err)
	}
	if _, _, err := s.Put(ctx, "prj_1", "shop", "big", make([]byte, MaxValueBytes+1), "a"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("big value = %v", err)
	}
}

func TestTamperedStoredVersionFailsClosed(t *testing.T) {
	st := storetest.Open(t)
	s := NewStore(st, newKeyring(t), nil)
	ctx := actorCtx(t)
	for _, v := range []string{"first-value", "second-value"} {
		if _, _, err := s.Put(ctx, "prj_1", "shop", "db", []byte(v), "a"); err != nil {
			t.Fatal(err)
		}
	}
	sec, err := s.Get(ctx, "prj_1", "db")
	if err != nil {
		t.Fatal(err)
	}
	id := sec.ID
	set := func(t *testing.T, versions []Version) {
		t.Helper()
		if _, err := st.Collection(Collection).UpdateOne(ctx, bson.M{"_id": id}, bson.M{"$set": bson.M{"versions": versions}}); err != nil {
			t.Fatal(err)
		}
	}
	orig := sec.Versions
	mutate := map[string]func() []Version{
		"flipped byte": func() []Version {
			v := cloneVersions(orig)
			v[1].Sealed.Ciphertext[len(v[1].Sealed.Ciphertext)-1] ^= 0x80
			return v
		},
		"swapped ciphertexts": func() []Version {
			v := cloneVersions(orig)
			v[0].Sealed.Ciphertext, v[1].Sealed.Ciphertext = v[1].Sealed.Ciphertext, v[0].Sealed.Ciphertext
			return v
		},
		"swapped whole envelopes": func() []Version {
			v := cloneVersions(orig)
			v[0].Sealed, v[1].Sealed = v[1].Sealed, v[0].Sealed
			return v
		},
		"changed KEK id": func() []Version {
			v := cloneVersions(orig)
			v[1].Sealed.KEKID = "kek_01HZZZZZZZZZZZZZZZZZZZZZZZ"
			return v
		},
	}
	for name, m := range mutate {
		t.Run(name, func(t *testing.T) {
			set(t, m())
			t.Cleanup(func() { set(t, orig) })
			sec, err := s.Get(ctx, "prj_1", "db")
			if err != nil {
				t.Fatal(err)
			}
			got, err := s.Open(sec, sec.Find(2))
			if got != nil || !(errors.Is(err, ErrOpenFailed) || errors.Is(err, ErrUnknownKEK)) {
				t.Fatalf("Open = %q, %v; want nil and a failure", got, err)
			}
		})
	}
}

func cloneVersions(v []Version) []Version {
	out := make([]Version, len(v))
	for i, x := range v {
		out[i] = x
		out[i].Sealed.Ciphertext = append([]byte(nil), x.Sealed.Ciphertext...)
		out[i].Sealed.WrappedKey = append([]byte(nil), x.Sealed.WrappedKey...)
	}
	return out
}

func TestSets(t *testing.T) {
	st := storetest.Open(t)
	s := NewStore(st, newKeyring(t), nil)
	ctx := actorCtx(t)
	if _, _, err := s.Put(ctx, "prj_1", "shop", "stripe-key", []byte("x"), "a"); err != nil {
		t.Fatal(err)
	}
	refs := map[string]Ref{"STRIPE_KEY": {Secret: "stripe-key"}, "STRIPE_FILE": {Secret: "stripe-key", Version: 1, As: AsFile}}
	set, created, err := s.PutSet(ctx, "prj_1", "shop", "payments", refs, nil)
	if err != nil || !created || set.Revision != 1 {
		t.Fatalf("PutSet = %+v, %v, %v", set, created, err)
	}
	if again, _, err := s.PutSet(ctx, "prj_1", "shop", "payments", refs, nil); err != nil || again.Revision != 1 {
		t.Fatalf("PutSet of the same set wrote: %+v %v", again, err)
	}
	stale := int64(0)
	if _, _, err := s.PutSet(ctx, "prj_1", "shop", "payments", map[string]Ref{"A": {Secret: "stripe-key"}}, &stale); !errors.Is(err, ErrConflict) {
		t.Fatalf("PutSet with a stale expected revision = %v", err)
	}
	if _, _, err := s.PutSet(ctx, "prj_1", "shop", "other", map[string]Ref{"A": {Secret: "missing"}}, nil); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("PutSet naming a missing secret = %v", err)
	}
	if _, _, err := s.PutSet(ctx, "prj_1", "shop", "other", map[string]Ref{"A": {Secret: "stripe-key", Version: 9}}, nil); !errors.Is(err, ErrVersionNotFound) {
		t.Fatalf("PutSet naming a missing version = %v", err)
	}
	for key, r := range map[string]Ref{"1A": {Secret: "stripe-key"}, "BERTH_X": {Secret: "stripe-key"}, "A": {Secret: "stripe-key", As: "disk"}} {
		if _, _, err := s.PutSet(ctx, "prj_1", "shop", "other", map[string]Ref{key: r}, nil); !errors.Is(err, ErrInvalid) {
			t.Fatalf("PutSet with %s = %+v: %v, want ErrInvalid", key, r, err)
		}
	}
	if _, err := s.DeleteSet(ctx, "prj_1", "payments", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetSet(ctx, "prj_1", "payments"); !errors.Is(err, ErrSetNotFound) {
		t.Fatalf("GetSet after delete = %v", err)
	}
}

// TestRotationResumesAfterInterruption rotates under 100 secrets, stops the re-wrap part way
// (the context ends, as when berthd dies), and resumes it with a new Store over a keyring read
// back from its file: every secret still opens, and the old KEK is retired only at the end.
func TestRotationResumesAfterInterruption(t *testing.T) {
	st := storetest.Open(t)
	kr := newKeyring(t)
	s := NewStore(st, kr, nil)
	ctx := actorCtx(t)
	old := kr.ActiveKEK()
	want := map[string]string{}
	for i := range 100 {
		name, v := fmt.Sprintf("s%03d", i), "v-"+randomHex(6)
		if _, _, err := s.Put(ctx, "prj_1", "shop", name, []byte(v), "a"); err != nil {
			t.Fatal(err)
		}
		want[name] = v
	}
	r, err := s.StartRotation(ctx, true)
	if err != nil || r.State != RotationRunning || r.TargetKEK == old {
		t.Fatalf("StartRotation = %+v, %v", r, err)
	}
	if _, err := s.StartRotation(ctx, false); !errors.Is(err, ErrRotationRunning) {
		t.Fatalf("a second StartRotation = %v, want ErrRotationRunning", err)
	}
	// Interrupt after about a third: the pass stops when ctx ends.
	stop, cancel := context.WithCancel(ctx)
	progressed := make(chan struct{})
	go func() {
		defer close(progressed)
		deadline := time.After(time.Minute)
		for {
			cur, err := s.RotationStatus(ctx)
			if err == nil && cur.Secrets >= 30 {
				cancel()
				return
			}
			select {
			case <-deadline:
				cancel()
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	err = s.Rewrap(stop, RewrapConfig{PerSecond: 200})
	<-progressed
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted Rewrap = %v, want context.Canceled", err)
	}
	mid, err := s.RotationStatus(ctx)
	if err != nil || mid.State != RotationRunning || mid.Secrets < 30 || mid.Secrets >= 100 {
		t.Fatalf("after the interruption: %+v, %v", mid, err)
	}
	counts, err := s.WrappedBy(ctx)
	if err != nil || counts[old] == 0 || counts[r.TargetKEK] == 0 {
		t.Fatalf("mid-rotation both KEKs should wrap data keys: %v %v", counts, err)
	}
	// A write during the rotation is sealed under the new KEK.
	if _, _, err := s.Put(ctx, "prj_1", "shop", "s000", []byte("during"), "a"); err != nil {
		t.Fatal(err)
	}
	want["s000"] = "during"

	kr2, err := LoadKeyring(kr.Path())
	if err != nil || kr2.ActiveKEK() != r.TargetKEK || !kr2.Has(old) {
		t.Fatalf("the keyring file must hold both KEKs mid-rotation: %v", err)
	}
	s2 := NewStore(st, kr2, nil)
	if err := s2.Rewrap(ctx, RewrapConfig{PerSecond: -1}); err != nil {
		t.Fatalf("resumed Rewrap: %v", err)
	}
	done, err := s2.RotationStatus(ctx)
	if err != nil || done.State != RotationDone || len(done.Retired) != 1 || done.Retired[0] != old {
		t.Fatalf("after the resume: %+v, %v", done, err)
	}
	counts, err = s2.WrappedBy(ctx)
	if err != nil || counts[old] != 0 || counts[r.TargetKEK] != 101 {
		t.Fatalf("after the resume: %v, %v", counts, err)
	}
	kr3, err := LoadKeyring(kr.Path())
	if err != nil || kr3.Has(old) || len(kr3.KEKs()) != 1 {
		t.Fatalf("the old KEK should be retired from the file: %v %v", kr3.KEKs(), err)
	}
	s3 := NewStore(st, kr3, nil)
	list, err := s3.List(ctx, "prj_1")
	if err != nil || len(list) != 100 {
		t.Fatalf("List = %d, %v", len(list), err)
	}
	for i := range list {
		sec := &list[i]
		got, err := s3.Open(sec, sec.Current())
		if err != nil || string(got) != want[sec.Name] {
			t.Fatalf("%s does not open after the rotation: %v", sec.Name, err)
		}
	}
	// Resuming a finished rotation does nothing.
	if err := s3.Rewrap(ctx, RewrapConfig{}); err != nil {
		t.Fatal(err)
	}
}

// TestRotationRecordMissingAfterCrash covers a berthd killed between rotating the keyring file
// and recording the rotation: the next Rewrap notices the active KEK moved and re-wraps.
func TestRotationRecordMissingAfterCrash(t *testing.T) {
	st := storetest.Open(t)
	kr := newKeyring(t)
	s := NewStore(st, kr, nil)
	ctx := actorCtx(t)
	if _, _, err := s.Put(ctx, "prj_1", "shop", "a", []byte("x"), "a"); err != nil {
		t.Fatal(err)
	}
	if err := s.Rewrap(ctx, RewrapConfig{}); err != nil { // never rotated: nothing to do
		t.Fatal(err)
	}
	if r, err := s.RotationStatus(ctx); err != nil || r != nil {
		t.Fatalf("no rotation yet: %+v %v", r, err)
	}
	next, err := kr.Rotate() // the file moved; no record was written
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Rewrap(ctx, RewrapConfig{PerSecond: -1}); err != nil {
		t.Fatal(err)
	}
	counts, err := s.WrappedBy(ctx)
	if err != nil || counts[next] != 1 || len(counts) != 1 {
		t.Fatalf("WrappedBy = %v, %v", counts, err)
	}
}

func randomHex(n int) string { return fmt.Sprintf("%x", randomKey()[:n]) }
