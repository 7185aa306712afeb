package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
)

func get(t *testing.T, client *http.Client, url string) (int, string, string) {
	t.Helper()
	resp, err := client.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read %s: %v", url, err)
	}
	return resp.StatusCode, resp.Header.Get("Content-Type"), string(body)
}

func TestHandler(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(newHandler("hello", "wl_01TEST", "node-a"))
	t.Cleanup(srv.Close)

	for _, tc := range []struct {
		path       string
		wantStatus int
		wantBody   string
	}{
		{"/", http.StatusOK, "hello from wl_01TEST (node-a)\n"},
		{"/healthz", http.StatusOK, "ok"},
		{"/nope", http.StatusNotFound, "404 page not found\n"},
	} {
		status, ctype, body := get(t, srv.Client(), srv.URL+tc.path)
		if status != tc.wantStatus || body != tc.wantBody {
			t.Errorf("GET %s = %d %q, want %d %q", tc.path, status, body, tc.wantStatus, tc.wantBody)
		}
		if status == http.StatusOK && ctype != "text/plain; charset=utf-8" {
			t.Errorf("GET %s Content-Type = %q, want text/plain", tc.path, ctype)
		}
	}

	resp, err := srv.Client().Post(srv.URL+"/", "text/plain", nil)
	if err != nil {
		t.Fatalf("POST /: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST / = %d, want 405", resp.StatusCode)
	}
}

func TestServeShutsDownWhenCancelled(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- serve(ctx, ln, newHandler("hello", "wl_x", "h")) }()

	client := &http.Client{Transport: &http.Transport{}}
	if status, _, body := get(t, client, "http://"+ln.Addr().String()+"/healthz"); status != http.StatusOK || body != "ok" {
		t.Fatalf("GET /healthz = %d %q, want 200 ok", status, body)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("serve after cancel: %v", err)
	}
}
