package identity

import (
	"testing"
)

// TestRotateSigningKey: the new key becomes current and the old one is kept
// among the retired keys, by key id (docs/node-protocol.md section 5.21).
func TestRotateSigningKey(t *testing.T) {
	dir := t.TempDir()
	first, _, err := LoadOrCreateSigningKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	prev, next, err := RotateSigningKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !prev.Equal(first) || next.Equal(first) {
		t.Fatal("rotation did not return the old key and a new one")
	}
	cur, created, err := LoadOrCreateSigningKey(dir)
	if err != nil || created || !cur.Equal(next) {
		t.Fatalf("after rotation the current key is not the new one (created=%v, err=%v)", created, err)
	}
	retired, err := RetiredSigningKeys(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(retired) != 1 || !retired[keyID(first)].Equal(first) {
		t.Fatalf("retired keys %d, want the first key by its id", len(retired))
	}
}
