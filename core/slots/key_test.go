package slots

import (
	"strings"
	"testing"
)

func TestDesiredAttemptKey(t *testing.T) {
	t.Parallel()
	base := KeyInput{ReleaseDigest: "sha256:0123", SpecRevision: 3, Env: map[string]string{"B": "2", "A": "1"},
		Platform: "linux/amd64", NetworkMode: NetworkHost}
	k, err := DesiredAttemptKey(base)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(k, "sha256:") || len(k) != len("sha256:")+64 {
		t.Fatalf("key %q", k)
	}
	// The same values in another map give the same key.
	same := base
	same.Env = map[string]string{"A": "1", "B": "2"}
	if k2, _ := DesiredAttemptKey(same); k2 != k {
		t.Fatalf("env order changed the key")
	}
	// nil and empty environments are the same.
	a, b := base, base
	a.Env, b.Env = nil, map[string]string{}
	ka, _ := DesiredAttemptKey(a)
	kb, _ := DesiredAttemptKey(b)
	if ka != kb {
		t.Fatalf("nil and empty env differ")
	}
	// Every field drifts the key.
	for name, mut := range map[string]func(*KeyInput){
		"release":    func(in *KeyInput) { in.ReleaseDigest = "sha256:4567" },
		"revision":   func(in *KeyInput) { in.SpecRevision++ },
		"env":        func(in *KeyInput) { in.Env = map[string]string{"A": "1", "B": "3"} },
		"env name":   func(in *KeyInput) { in.Env = map[string]string{"A": "1", "C": "2"} },
		"platform":   func(in *KeyInput) { in.Platform = "linux/arm64" },
		"network":    func(in *KeyInput) { in.NetworkMode = NetworkIsolated },
		"invocation": func(in *KeyInput) { in.Invocation = "sha256:cmd" },
	} {
		in := base
		in.Env = map[string]string{"A": "1", "B": "2"}
		mut(&in)
		got, err := DesiredAttemptKey(in)
		if err != nil || got == k {
			t.Errorf("%s: key %q, %v (unchanged: %v)", name, got, err, got == k)
		}
	}
	// Attempt ids bind the key to its predecessor.
	id1, _ := AttemptID(k, "")
	id2, _ := AttemptID(k, id1)
	id1again, _ := AttemptID(k, "")
	if id1 == id2 || id1 != id1again || !strings.HasPrefix(id1, "att_") {
		t.Fatalf("attempt ids %q %q %q", id1, id2, id1again)
	}
}

func TestDesiredAttemptKeyRefusesInvalidUTF8(t *testing.T) {
	t.Parallel()
	if _, err := DesiredAttemptKey(KeyInput{Env: map[string]string{"A": "\xff"}}); err == nil {
		t.Fatal("invalid UTF-8 accepted")
	}
}

func TestDesiredAttemptKeyRestart(t *testing.T) {
	t.Parallel()
	in := KeyInput{ReleaseDigest: "sha256:r", SpecRevision: 3, Platform: "linux", NetworkMode: NetworkHost}
	before, err := DesiredAttemptKey(in)
	if err != nil {
		t.Fatal(err)
	}
	in.Restart = 1
	one, _ := DesiredAttemptKey(in)
	in.Restart = 2
	two, _ := DesiredAttemptKey(in)
	if before == one || one == two || before == two {
		t.Fatalf("restart generations share a key: %s %s %s", before, one, two)
	}
}
