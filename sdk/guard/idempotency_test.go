package guard_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/sdk/guard"
)

// startLike is a request shaped like a runtime driver's Start: a secret environment value
// that is short enough to guess.
type startLike struct {
	Workload string            `json:"workload"`
	Env      map[string]string `json:"env"`
}

// recordFile is the record of key under dir, as the store names it.
func recordFile(dir, key string) string {
	sum := sha256.Sum256([]byte(key))
	return filepath.Join(dir, hex.EncodeToString(sum[:16])+".json")
}

// plainDigest is the SHA-256 hex of request's JSON form, what records held before.
func plainDigest(t *testing.T, request any) string {
	t.Helper()
	raw, err := json.Marshal(request)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:])
}

// TestRecordsHoldNoPlainDigestOfTheRequest: a record on disk identifies its request by an
// HMAC under the store's own 0600 key, so a plain SHA-256 of the request (which would let a
// reader of the state directory try the 10,000 four-digit PINs against it) appears nowhere,
// and neither does the secret. The same key with the same request still replays after a
// restart, and with another request is refused idempotency_key_reused. Before, the record held
// the plain SHA-256 of the whole request.
func TestRecordsHoldNoPlainDigestOfTheRequest(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	req := startLike{Workload: "wl_1", Env: map[string]string{"PIN": "4821"}}
	s, err := guard.OpenIdempotencyStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := guard.Do(ctx, s, "start-1", req, func() (string, error) { return "started", nil }); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(filepath.Join(dir, guard.RequestKeyFile))
	if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 {
		t.Fatalf("request key file: %v %v; want a regular 0600 file", fi, err)
	}
	raw, err := os.ReadFile(recordFile(dir, "start-1"))
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		RequestDigest string `json:"request_digest"`
	}
	if err := json.Unmarshal(raw, &rec); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(rec.RequestDigest, "hmac-sha256:") || strings.Contains(string(raw), plainDigest(t, req)) || strings.Contains(string(raw), "4821") {
		t.Fatalf("record %s: want a keyed digest, no plain digest and no secret", raw)
	}

	s2, err := guard.OpenIdempotencyStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	got, replayed, err := guard.Do(ctx, s2, "start-1", req, func() (string, error) { return "ran again", nil })
	if err != nil || !replayed || got != "started" {
		t.Fatalf("replay after a restart: %q %v %v; want the recorded result", got, replayed, err)
	}
	other := startLike{Workload: "wl_1", Env: map[string]string{"PIN": "4822"}}
	if _, _, err := guard.Do(ctx, s2, "start-1", other, func() (string, error) { return "", nil }); abierrors.CodeOf(err) != abierrors.IdempotencyKeyReused {
		t.Fatalf("same key, another secret: %v; want idempotency_key_reused", err)
	}
	// Another store has another key: digests say nothing across state directories.
	s3, err := guard.OpenIdempotencyStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := guard.Do(ctx, s3, "start-1", req, func() (string, error) { return "x", nil }); err != nil {
		t.Fatal(err)
	}
}

// TestRecordsOfTheOlderFormStillReplay: a record written by an earlier version (the plain
// SHA-256 of its request) keeps its meaning across the upgrade: the same request replays its
// result, and is then rewritten in the keyed form; another request is refused.
func TestRecordsOfTheOlderFormStillReplay(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	req := startLike{Workload: "wl_2", Env: map[string]string{"PIN": "0007"}}
	old, _ := json.Marshal(map[string]any{"key": "start-2", "request_digest": plainDigest(t, req), "result": json.RawMessage(`"started before"`), "at": time.Now().UTC()})
	if err := os.WriteFile(recordFile(dir, "start-2"), old, 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := guard.OpenIdempotencyStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	other := startLike{Workload: "wl_2", Env: map[string]string{"PIN": "0008"}}
	if _, _, err := guard.Do(ctx, s, "start-2", other, func() (string, error) { return "", nil }); abierrors.CodeOf(err) != abierrors.IdempotencyKeyReused {
		t.Fatalf("older record, another request: %v; want idempotency_key_reused", err)
	}
	got, replayed, err := guard.Do(ctx, s, "start-2", req, func() (string, error) { return "ran again", nil })
	if err != nil || !replayed || got != "started before" {
		t.Fatalf("older record, same request: %q %v %v; want the recorded result", got, replayed, err)
	}
	raw, err := os.ReadFile(recordFile(dir, "start-2"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(raw), plainDigest(t, req)) || !strings.Contains(string(raw), "hmac-sha256:") {
		t.Fatalf("the replayed older record was not rewritten: %s", raw)
	}
	s2, err := guard.OpenIdempotencyStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, replayed, err := guard.Do(ctx, s2, "start-2", req, func() (string, error) { return "ran again", nil }); err != nil || !replayed || got != "started before" {
		t.Fatalf("rewritten record after a restart: %q %v %v", got, replayed, err)
	}
}

// TestInsecureRequestKeyIsRefused: a key file that others may read, or a symbolic link, is
// refused at open rather than used.
func TestInsecureRequestKeyIsRefused(t *testing.T) {
	dir := t.TempDir()
	if _, err := guard.OpenIdempotencyStore(dir); err != nil {
		t.Fatal(err)
	}
	key := filepath.Join(dir, guard.RequestKeyFile)
	if err := os.Chmod(key, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := guard.OpenIdempotencyStore(dir); !errors.Is(err, guard.ErrInsecureKeyFile) {
		t.Fatalf("open with a 0644 key file: %v; want ErrInsecureKeyFile", err)
	}
	link := t.TempDir()
	if err := os.Symlink(key, filepath.Join(link, guard.RequestKeyFile)); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(key, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := guard.OpenIdempotencyStore(link); !errors.Is(err, guard.ErrInsecureKeyFile) {
		t.Fatalf("open with a symlinked key file: %v; want ErrInsecureKeyFile", err)
	}
}
