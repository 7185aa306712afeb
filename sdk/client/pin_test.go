package client

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestParseFingerprint(t *testing.T) {
	t.Parallel()
	canon := "sha256:" + strings.Repeat("ab", 32)
	for _, in := range []string{
		canon,
		strings.Repeat("AB", 32),
		"SHA256:" + strings.Repeat("AB:", 31) + "AB",
		"  " + canon + "\n",
	} {
		got, err := ParseFingerprint(in)
		if err != nil || got != canon {
			t.Errorf("ParseFingerprint(%q) = %q, %v; want %q", in, got, err, canon)
		}
	}
	for _, in := range []string{"", "sha256:", "sha256:abcd", "md5:" + strings.Repeat("ab", 32), strings.Repeat("zz", 32)} {
		if _, err := ParseFingerprint(in); err == nil {
			t.Errorf("ParseFingerprint(%q) accepted", in)
		}
	}
}

func TestPinnedClient(t *testing.T) {
	t.Parallel()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"items":[]}`))
	}))
	t.Cleanup(srv.Close)
	pin := Fingerprint(srv.Certificate().Raw)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	seen, trusted, err := ServerFingerprint(srv.URL, 5*time.Second)
	if err != nil || seen != pin || trusted {
		t.Fatalf("ServerFingerprint = %q, %v, %v; want %q, untrusted", seen, trusted, err, pin)
	}

	c, err := New(srv.URL, WithToken("t"), WithFingerprint(pin))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ListProjects(ctx); err != nil {
		t.Fatalf("pinned call: %v", err)
	}

	other := "sha256:" + strings.Repeat("00", 32)
	c, err = New(srv.URL, WithToken("t"), WithFingerprint(other))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ListProjects(ctx); !errors.Is(err, ErrFingerprintMismatch) {
		t.Fatalf("call with a wrong pin: %v, want ErrFingerprintMismatch", err)
	}

	// Without a pin the self-signed certificate is not trusted.
	c, err = New(srv.URL, WithToken("t"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ListProjects(ctx); err == nil {
		t.Fatal("unpinned call to a self-signed server succeeded")
	}

	if _, err := New(srv.URL, WithFingerprint("nonsense")); err == nil {
		t.Fatal("New accepted a malformed fingerprint")
	}
}
