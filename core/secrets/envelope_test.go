package secrets

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthhq/berth/internal/securefile"
)

func newKeyring(t *testing.T) *Keyring {
	t.Helper()
	k, created, err := LoadOrCreateKeyring(filepath.Join(t.TempDir(), "keys", "secrets.keyring"), true)
	if err != nil || !created {
		t.Fatalf("LoadOrCreateKeyring = %v, created %v", err, created)
	}
	return k
}

var bind = Binding{ProjectID: "prj_1", Owner: OwnerProject, Name: "stripe-key", Version: 1}

func TestSealOpenRoundTrip(t *testing.T) {
	k := newKeyring(t)
	for _, v := range [][]byte{{}, []byte("sk_live_abc"), bytes.Repeat([]byte{0xff}, MaxValueBytes)} {
		s, err := Seal(k, bind, v)
		if err != nil {
			t.Fatal(err)
		}
		if len(v) > 4 && bytes.Contains(s.Ciphertext, v[:len(v)/2]) {
			t.Fatalf("ciphertext holds the value")
		}
		got, err := Open(k, bind, s)
		if err != nil || !bytes.Equal(got, v) {
			t.Fatalf("Open = %d bytes, %v; want the value", len(got), err)
		}
	}
	if _, err := Seal(k, bind, make([]byte, MaxValueBytes+1)); err == nil {
		t.Fatalf("Seal of a value over MaxValueBytes succeeded")
	}
}

func TestOpenFailsClosed(t *testing.T) {
	k := newKeyring(t)
	s, err := Seal(k, bind, []byte("value-one"))
	if err != nil {
		t.Fatal(err)
	}
	other := bind
	other.Version = 2
	s2, err := Seal(k, other, []byte("value-two"))
	if err != nil {
		t.Fatal(err)
	}
	flip := func(b []byte, i int) []byte { c := bytes.Clone(b); c[i] ^= 1; return c }
	cases := []struct {
		name string
		b    Binding
		s    Sealed
		want error
	}{
		{"flipped ciphertext byte", bind, Sealed{s.KEKID, s.WrappedKey, flip(s.Ciphertext, len(s.Ciphertext)/2)}, ErrOpenFailed},
		{"flipped nonce byte", bind, Sealed{s.KEKID, s.WrappedKey, flip(s.Ciphertext, 0)}, ErrOpenFailed},
		{"flipped wrapped key byte", bind, Sealed{s.KEKID, flip(s.WrappedKey, 30), s.Ciphertext}, ErrOpenFailed},
		{"truncated ciphertext", bind, Sealed{s.KEKID, s.WrappedKey, s.Ciphertext[:10]}, ErrOpenFailed},
		{"empty ciphertext", bind, Sealed{s.KEKID, s.WrappedKey, nil}, ErrOpenFailed},
		{"swapped versions' ciphertexts", bind, Sealed{s.KEKID, s.WrappedKey, s2.Ciphertext}, ErrOpenFailed},
		{"another version's whole envelope", bind, s2, ErrOpenFailed},
		{"another secret name", Binding{bind.ProjectID, bind.Owner, "db-url", 1}, s, ErrOpenFailed},
		{"another project", Binding{"prj_2", bind.Owner, bind.Name, 1}, s, ErrOpenFailed},
		{"another owner", Binding{bind.ProjectID, "service:svc_1", bind.Name, 1}, s, ErrOpenFailed},
		{"unknown KEK id", bind, Sealed{"kek_01HZZZZZZZZZZZZZZZZZZZZZZZ", s.WrappedKey, s.Ciphertext}, ErrUnknownKEK},
	}
	// A KEK id changed to another KEK the keyring holds: the wrap's additional data names the
	// KEK, and the other key cannot open it either.
	old := k.ActiveKEK()
	if _, err := k.Rotate(); err != nil {
		t.Fatal(err)
	}
	cases = append(cases, struct {
		name string
		b    Binding
		s    Sealed
		want error
	}{"KEK id changed to another held KEK", bind, Sealed{k.ActiveKEK(), s.WrappedKey, s.Ciphertext}, ErrOpenFailed})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := Open(k, c.b, c.s)
			if !errors.Is(err, c.want) || got != nil {
				t.Fatalf("Open = %q, %v; want nil and %v", got, err, c.want)
			}
			if strings.Contains(err.Error(), "value-one") || strings.Contains(err.Error(), "value-two") {
				t.Fatalf("error %q carries a value", err)
			}
			if _, err := Rewrap(k, c.b, c.s); !errors.Is(err, c.want) {
				t.Fatalf("Rewrap = %v; want %v", err, c.want)
			}
		})
	}
	if got, err := Open(k, bind, s); err != nil || string(got) != "value-one" || s.KEKID != old {
		t.Fatalf("untouched envelope under the old KEK: %q, %v", got, err)
	}
}

func TestRotateRewrapRetire(t *testing.T) {
	k := newKeyring(t)
	old := k.ActiveKEK()
	s, err := Seal(k, bind, []byte("v"))
	if err != nil {
		t.Fatal(err)
	}
	next, err := k.Rotate()
	if err != nil || next == old || k.ActiveKEK() != next {
		t.Fatalf("Rotate = %s, %v; active %s", next, err, k.ActiveKEK())
	}
	if got, err := Open(k, bind, s); err != nil || string(got) != "v" {
		t.Fatalf("the old KEK must still open after a rotation: %q %v", got, err)
	}
	r, err := Rewrap(k, bind, s)
	if err != nil || r.KEKID != next || !bytes.Equal(r.Ciphertext, s.Ciphertext) {
		t.Fatalf("Rewrap = %+v, %v", r, err)
	}
	if err := k.Retire(next); !errors.Is(err, ErrKEKInUse) {
		t.Fatalf("Retire(active) = %v, want ErrKEKInUse", err)
	}
	if err := k.Retire(old); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(k, bind, s); !errors.Is(err, ErrUnknownKEK) {
		t.Fatalf("Open under a retired KEK = %v, want ErrUnknownKEK", err)
	}
	if got, err := Open(k, bind, r); err != nil || string(got) != "v" {
		t.Fatalf("rewrapped envelope: %q %v", got, err)
	}
	// The file holds what memory holds: a fresh load opens the rewrapped value, and Check agrees.
	k2, err := LoadKeyring(k.Path())
	if err != nil {
		t.Fatal(err)
	}
	if got, err := Open(k2, bind, r); err != nil || string(got) != "v" || k2.ActiveKEK() != next || len(k2.KEKs()) != 1 {
		t.Fatalf("reloaded keyring: %q %v active %s keks %v", got, err, k2.ActiveKEK(), k2.KEKs())
	}
	if err := k.Check(); err != nil {
		t.Fatalf("Check = %v", err)
	}
}

func TestDigestIsKeyed(t *testing.T) {
	k1, k2 := newKeyring(t), newKeyring(t)
	d := k1.Digest(bind, []byte("1234"))
	if !strings.HasPrefix(d, "hmac-sha256:") || d == k2.Digest(bind, []byte("1234")) {
		t.Fatalf("digest %s does not depend on the keyring's key", d)
	}
	if d != k1.Digest(bind, []byte("1234")) || d == k1.Digest(bind, []byte("1235")) {
		t.Fatalf("digest is not a function of the value")
	}
	if strings.Contains(d, "03ac674216f3e15c761ee1a5e255f067953623c8b388b4459e13f978d7c846f4") {
		t.Fatalf("digest is the plain SHA-256 of the value")
	}
}

func TestKeyringFileRules(t *testing.T) {
	k := newKeyring(t)
	path := k.Path()
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("keyring mode %v, %v; want 0600", fi.Mode().Perm(), err)
	}
	if di, err := os.Stat(filepath.Dir(path)); err != nil || di.Mode().Perm() != 0o700 {
		t.Fatalf("keyring directory mode %v, %v; want 0700", di.Mode().Perm(), err)
	}
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	write := func(t *testing.T, data []byte, mode os.FileMode) string {
		p := filepath.Join(t.TempDir(), "k")
		if err := os.WriteFile(p, data, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	t.Run("missing", func(t *testing.T) {
		if _, err := LoadKeyring(filepath.Join(t.TempDir(), "none")); !errors.Is(err, ErrKeyringMissing) {
			t.Fatalf("got %v", err)
		}
		if _, _, err := LoadOrCreateKeyring(filepath.Join(t.TempDir(), "none"), false); !errors.Is(err, ErrKeyringMissing) {
			t.Fatalf("LoadOrCreateKeyring without create = %v, want ErrKeyringMissing", err)
		}
	})
	bad := map[string]func(t *testing.T) string{
		"group readable": func(t *testing.T) string { return write(t, good, 0o640) },
		"world readable": func(t *testing.T) string { return write(t, good, 0o604) },
		"symlink": func(t *testing.T) string {
			p := filepath.Join(t.TempDir(), "link")
			if err := os.Symlink(path, p); err != nil {
				t.Fatal(err)
			}
			return p
		},
		"directory": func(t *testing.T) string {
			p := filepath.Join(t.TempDir(), "d")
			if err := os.Mkdir(p, 0o700); err != nil {
				t.Fatal(err)
			}
			return p
		},
		"not JSON": func(t *testing.T) string { return write(t, []byte("kek=abc"), 0o600) },
		"unknown field": func(t *testing.T) string {
			return write(t, bytes.Replace(good, []byte(`"version"`), []byte(`"extra": 1, "version"`), 1), 0o600)
		},
		"other version": func(t *testing.T) string {
			return write(t, bytes.Replace(good, []byte(`"version": 1`), []byte(`"version": 2`), 1), 0o600)
		},
		"active missing": func(t *testing.T) string {
			return write(t, bytes.Replace(good, []byte(k.ActiveKEK()), []byte("kek_01HZZZZZZZZZZZZZZZZZZZZZZZ"), 1), 0o600)
		},
		"trailing object": func(t *testing.T) string { return write(t, append(bytes.Clone(good), []byte("{}")...), 0o600) },
		"too large": func(t *testing.T) string {
			return write(t, append(bytes.Clone(good), bytes.Repeat([]byte(" "), MaxKeyringBytes)...), 0o600)
		},
	}
	for name, mk := range bad {
		t.Run(name, func(t *testing.T) {
			if _, err := LoadKeyring(mk(t)); !errors.Is(err, ErrKeyringInvalid) {
				t.Fatalf("LoadKeyring = %v, want ErrKeyringInvalid", err)
			}
		})
	}
	t.Run("symlink is insecure", func(t *testing.T) {
		if _, err := LoadKeyring(bad["symlink"](t)); !errors.Is(err, securefile.ErrInsecure) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("Check notices a replaced file", func(t *testing.T) {
		other := newKeyring(t)
		raw, err := os.ReadFile(other.Path())
		if err != nil {
			t.Fatal(err)
		}
		if err := securefile.WriteFile(path, raw); err != nil {
			t.Fatal(err)
		}
		if err := k.Check(); !errors.Is(err, ErrKeyringInvalid) {
			t.Fatalf("Check = %v, want ErrKeyringInvalid", err)
		}
	})
}
