package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// seen is what the test server recorded of one request.
type seen struct {
	Method, Path, RawQuery string
	Auth, ContentType, UA  string
	ContentLength          int64
	TransferEncoding       []string
	Body                   []byte
}

// server answers every request with status and body (JSON unless ctype is
// given) and records the request.
func server(t *testing.T, status int, ctype, body string) (*httptest.Server, *seen) {
	t.Helper()
	s := &seen{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			t.Errorf("read body: %v", err)
		}
		*s = seen{
			Method: r.Method, Path: r.URL.Path, RawQuery: r.URL.RawQuery,
			Auth: r.Header.Get("Authorization"), ContentType: r.Header.Get("Content-Type"),
			UA: r.Header.Get("User-Agent"), ContentLength: r.ContentLength,
			TransferEncoding: r.TransferEncoding, Body: b,
		}
		if ctype == "" {
			ctype = "application/json"
		}
		w.Header().Set("Content-Type", ctype)
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	return srv, s
}

func newClient(t *testing.T, url string, opts ...Option) *Client {
	t.Helper()
	c, err := New(url, append([]Option{WithToken("brt_secret")}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestRequests(t *testing.T) {
	t.Parallel()
	rev := int64(7)
	replicas := 2
	cases := []struct {
		name       string
		status     int
		answer     string
		call       func(context.Context, *Client) (any, error)
		method     string
		path       string
		query      string
		auth       bool
		ctype      string
		wantBody   string // JSON compared semantically; "" means no body
		wantResult string // JSON of the result, compared semantically
	}{
		{
			name: "create join token", status: 201,
			answer: `{"token":"brj_x","join_command":"berth-agent join --token brj_x","expires_at":"2030-01-01T00:00:00Z"}`,
			call: func(ctx context.Context, c *Client) (any, error) {
				return c.CreateJoinToken(ctx, JoinTokenRequest{TTLSeconds: 600})
			},
			method: "POST", path: "/api/v1/nodes/join-tokens", auth: true, ctype: "application/json",
			wantBody:   `{"ttl_seconds":600}`,
			wantResult: `{"token":"brj_x","join_command":"berth-agent join --token brj_x","expires_at":"2030-01-01T00:00:00Z"}`,
		},
		{
			name: "enroll sends no bearer", status: 200,
			answer: `{"node_id":"nod_1","credential":"brn_c","cluster_public_key":"k","cluster_id":"c"}`,
			call: func(ctx context.Context, c *Client) (any, error) {
				return c.Enroll(ctx, EnrollRequest{JoinToken: "brj_x", PublicKey: "pk", Hostname: "h1", Capacity: Capacity{CPUs: 2, MemoryMB: 512}})
			},
			method: "POST", path: "/api/v1/nodes/enroll", auth: false, ctype: "application/json",
			wantBody:   `{"join_token":"brj_x","public_key":"pk","hostname":"h1","capacity":{"cpus":2,"memory_mb":512}}`,
			wantResult: `{"node_id":"nod_1","credential":"brn_c","cluster_public_key":"k","cluster_id":"c"}`,
		},
		{
			name: "list nodes", status: 200,
			answer: `{"items":[{"id":"nod_1","hostname":"h1","address":"10.0.0.1","capacity":{"cpus":1,"memory_mb":1},"status":"connected","desired_rev":3,"applied_rev":3,"workloads":1,"enrolled_at":"2030-01-01T00:00:00Z"}]}`,
			call:   func(ctx context.Context, c *Client) (any, error) { return c.ListNodes(ctx) },
			method: "GET", path: "/api/v1/nodes", auth: true,
			wantResult: `[{"id":"nod_1","hostname":"h1","address":"10.0.0.1","capacity":{"cpus":1,"memory_mb":1},"status":"connected","desired_rev":3,"applied_rev":3,"workloads":1,"allocatable":{},"schedulable":{},"enrolled_at":"2030-01-01T00:00:00Z"}]`,
		},
		{
			name: "list machines sends no body", status: 200, answer: `{"items":[]}`,
			call:   func(ctx context.Context, c *Client) (any, error) { return c.ListMachines(ctx) },
			method: "GET", path: "/api/v1/machines", auth: true, wantResult: `[]`,
		},
		{
			name: "delete machine sends no body", status: 200, answer: `{"id":"mch_1"}`,
			call:   func(ctx context.Context, c *Client) (any, error) { return c.DeleteMachine(ctx, "mch_1") },
			method: "DELETE", path: "/api/v1/machines/mch_1", auth: true,
			wantResult: `{"created_at":"0001-01-01T00:00:00Z","id":"mch_1","image":"","join_by":"0001-01-01T00:00:00Z","location":"","operation":"","provider":"","state":"","type":""}`,
		},
		{
			name: "empty list is empty slice", status: 200, answer: `{"items":null}`,
			call:   func(ctx context.Context, c *Client) (any, error) { return c.ListProjects(ctx) },
			method: "GET", path: "/api/v1/projects", auth: true, wantResult: `[]`,
		},
		{
			name: "put project", status: 200,
			answer: `{"id":"prj_1","name":"web","created_at":"2030-01-01T00:00:00Z"}`,
			call:   func(ctx context.Context, c *Client) (any, error) { return c.PutProject(ctx, "web") },
			method: "PUT", path: "/api/v1/projects/web", auth: true, ctype: "application/json",
			wantBody: `{}`, wantResult: `{"id":"prj_1","name":"web","created_at":"2030-01-01T00:00:00Z"}`,
		},
		{
			name: "apply service", status: 200,
			answer: `{"id":"svc_1","project":"default","name":"hello","revision":8,"bundle":"hello","bundle_digest":"sha256:ab","command":["./run"],"port":8080,"domains":null,"replicas":2,"health_check":{},"created_at":"2030-01-01T00:00:00Z","updated_at":"2030-01-01T00:00:00Z","ready":0}`,
			call: func(ctx context.Context, c *Client) (any, error) {
				return c.ApplyService(ctx, "default", "hello", ServiceSpec{Bundle: "hello", Command: []string{"./run"}, Port: 8080, Replicas: &replicas, ExpectedRevision: &rev})
			},
			method: "PUT", path: "/api/v1/projects/default/services/hello", auth: true, ctype: "application/json",
			wantBody:   `{"bundle":"hello","command":["./run"],"port":8080,"replicas":2,"health_check":{},"expected_revision":7}`,
			wantResult: `{"id":"svc_1","project":"default","name":"hello","revision":8,"bundle":"hello","bundle_digest":"sha256:ab","command":["./run"],"port":8080,"domains":null,"replicas":2,"health_check":{},"resources":{},"created_at":"2030-01-01T00:00:00Z","updated_at":"2030-01-01T00:00:00Z","ready":0}`,
		},
		{
			name: "get service escapes path", status: 200, answer: `{"name":"a b"}`,
			call:   func(ctx context.Context, c *Client) (any, error) { return c.GetService(ctx, "p/x", "a b") },
			method: "GET", path: "/api/v1/projects/p/x/services/a b", auth: true,
		},
		{
			name: "list services", status: 200, answer: `{"items":[]}`,
			call:   func(ctx context.Context, c *Client) (any, error) { return c.ListServices(ctx, "default") },
			method: "GET", path: "/api/v1/projects/default/services", auth: true, wantResult: `[]`,
		},
		{
			name: "delete service with revision", status: 204,
			call: func(ctx context.Context, c *Client) (any, error) {
				return nil, c.DeleteService(ctx, "default", "hello", &rev)
			},
			method: "DELETE", path: "/api/v1/projects/default/services/hello", query: "expected_revision=7", auth: true,
		},
		{
			name: "delete service", status: 204,
			call: func(ctx context.Context, c *Client) (any, error) {
				return nil, c.DeleteService(ctx, "default", "hello", nil)
			},
			method: "DELETE", path: "/api/v1/projects/default/services/hello", auth: true,
		},
		{
			name: "list workloads of project", status: 200, answer: `{"items":[]}`,
			call:   func(ctx context.Context, c *Client) (any, error) { return c.ListWorkloads(ctx, "default") },
			method: "GET", path: "/api/v1/projects/default/workloads", auth: true,
		},
		{
			name: "list all workloads", status: 200, answer: `{"items":[]}`,
			call:   func(ctx context.Context, c *Client) (any, error) { return c.ListWorkloads(ctx, "") },
			method: "GET", path: "/api/v1/workloads", auth: true,
		},
		{
			name: "push bundle", status: 201,
			answer: `{"digest":"sha256:ab","size":5,"name":"hello","project":"default","created_at":"2030-01-01T00:00:00Z"}`,
			call: func(ctx context.Context, c *Client) (any, error) {
				return c.PushBundle(ctx, "default", "hello", strings.NewReader("tgz!!"))
			},
			method: "POST", path: "/api/v1/projects/default/bundles", query: "name=hello", auth: true, ctype: "application/gzip",
			wantResult: `{"digest":"sha256:ab","size":5,"name":"hello","project":"default","created_at":"2030-01-01T00:00:00Z"}`,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv, s := server(t, tc.status, "", tc.answer)
			c := newClient(t, srv.URL+"/", WithUserAgent("test-agent/1"))
			got, err := tc.call(context.Background(), c)
			if err != nil {
				t.Fatalf("call: %v", err)
			}
			if s.Method != tc.method || s.Path != tc.path || s.RawQuery != tc.query {
				t.Errorf("request %s %s?%s, want %s %s?%s", s.Method, s.Path, s.RawQuery, tc.method, tc.path, tc.query)
			}
			wantAuth := ""
			if tc.auth {
				wantAuth = "Bearer brt_secret"
			}
			if s.Auth != wantAuth {
				t.Errorf("Authorization = %q, want %q", s.Auth, wantAuth)
			}
			if s.ContentType != tc.ctype {
				t.Errorf("Content-Type = %q, want %q", s.ContentType, tc.ctype)
			}
			if s.UA != "test-agent/1" {
				t.Errorf("User-Agent = %q", s.UA)
			}
			if tc.wantBody != "" {
				assertJSONEqual(t, "body", s.Body, []byte(tc.wantBody))
			} else if tc.ctype == "" && len(s.Body) != 0 {
				t.Errorf("unexpected body %q", s.Body)
			}
			if tc.wantResult != "" {
				b, err := json.Marshal(got)
				if err != nil {
					t.Fatal(err)
				}
				assertJSONEqual(t, "result", b, []byte(tc.wantResult))
			}
		})
	}
}

func assertJSONEqual(t *testing.T, what string, got, want []byte) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("%s: %v in %s", what, err, got)
	}
	if err := json.Unmarshal(want, &w); err != nil {
		t.Fatalf("%s: want: %v", what, err)
	}
	gb, _ := json.Marshal(g)
	wb, _ := json.Marshal(w)
	if !bytes.Equal(gb, wb) {
		t.Errorf("%s = %s, want %s", what, gb, wb)
	}
}

func TestErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		status   int
		ctype    string
		body     string
		wantMsg  string
		wantCode string
	}{
		{
			name: "problem", status: 404, ctype: "application/problem+json",
			body:     `{"type":"about:blank","title":"Not Found","status":404,"code":"service_not_found","detail":"no service \"x\" in project \"default\""}`,
			wantMsg:  `service_not_found: no service "x" in project "default" (404)`,
			wantCode: "service_not_found",
		},
		{
			name: "problem without detail", status: 401, ctype: "application/problem+json",
			body:     `{"title":"Unauthorized","status":401,"code":"unauthenticated"}`,
			wantMsg:  `unauthenticated: Unauthorized (401)`,
			wantCode: "unauthenticated",
		},
		{
			name: "proxy page", status: 502, ctype: "text/html",
			body:    `<html>bad gateway</html>`,
			wantMsg: `http_error: <html>bad gateway</html> (502)`,
		},
		{
			name: "empty body", status: 503, ctype: "text/plain",
			wantMsg: `http_error: Service Unavailable (503)`,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv, _ := server(t, tc.status, tc.ctype, tc.body)
			c := newClient(t, srv.URL)
			_, err := c.GetService(context.Background(), "default", "x")
			var apiErr *APIError
			if !errors.As(err, &apiErr) {
				t.Fatalf("error %v (%T) is not an *APIError", err, err)
			}
			if apiErr.Status != tc.status {
				t.Errorf("Status = %d, want %d", apiErr.Status, tc.status)
			}
			if err.Error() != tc.wantMsg {
				t.Errorf("Error() = %q, want %q", err.Error(), tc.wantMsg)
			}
			wrapped := fmt.Errorf("get service: %w", err)
			if tc.wantCode != "" && !IsCode(wrapped, tc.wantCode) {
				t.Errorf("IsCode(%q) = false", tc.wantCode)
			}
			if IsCode(wrapped, "other_code") {
				t.Error("IsCode matched another code")
			}
		})
	}
	if IsCode(errors.New("plain"), "") {
		t.Error("IsCode matched a plain error")
	}
}

func TestPushBundleStreamsFile(t *testing.T) {
	t.Parallel()
	srv, s := server(t, 201, "", `{"digest":"sha256:ab","size":3,"project":"default"}`)
	c := newClient(t, srv.URL)
	p := filepath.Join(t.TempDir(), "b.tar.gz")
	if err := os.WriteFile(p, []byte("0123456789"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Seek(4, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PushBundle(context.Background(), "default", "", f); err != nil {
		t.Fatal(err)
	}
	if s.ContentLength != 6 || string(s.Body) != "456789" || s.RawQuery != "" {
		t.Errorf("server saw length %d body %q query %q", s.ContentLength, s.Body, s.RawQuery)
	}
	// The client does not close the caller's file.
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		t.Errorf("file closed by PushBundle: %v", err)
	}

	// A reader of unknown length is sent chunked.
	pr, pw := io.Pipe()
	go func() {
		_, _ = pw.Write([]byte("streamed"))
		_ = pw.Close()
	}()
	if _, err := c.PushBundle(context.Background(), "default", "", pr); err != nil {
		t.Fatal(err)
	}
	if string(s.Body) != "streamed" || len(s.TransferEncoding) == 0 || s.TransferEncoding[0] != "chunked" {
		t.Errorf("server saw body %q transfer encoding %v", s.Body, s.TransferEncoding)
	}
}

func TestDownloadBundle(t *testing.T) {
	t.Parallel()
	srv, s := server(t, 200, "application/gzip", "gzipbytes")
	c := newClient(t, srv.URL, WithToken("brn_node"))
	var buf bytes.Buffer
	if err := c.DownloadBundle(context.Background(), "sha256:abcd", &buf); err != nil {
		t.Fatal(err)
	}
	if buf.String() != "gzipbytes" {
		t.Errorf("downloaded %q", buf.String())
	}
	if s.Method != "GET" || s.Path != "/api/v1/bundles/sha256:abcd" || s.Auth != "Bearer brn_node" {
		t.Errorf("request %s %s auth %q", s.Method, s.Path, s.Auth)
	}

	srv404, _ := server(t, 404, "application/problem+json", `{"title":"Not Found","status":404,"code":"bundle_not_found","detail":"no bundle"}`)
	c404 := newClient(t, srv404.URL)
	buf.Reset()
	err := c404.DownloadBundle(context.Background(), "sha256:ff", &buf)
	if !IsCode(err, "bundle_not_found") || buf.Len() != 0 {
		t.Errorf("DownloadBundle = %v, wrote %d bytes", err, buf.Len())
	}
}

func TestNewRejectsBadServer(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"", "localhost:8080", "ftp://x", "http://", "https://u:p@host", "http://h/?q=1"} {
		if _, err := New(s); err == nil {
			t.Errorf("New(%q) succeeded", s)
		}
	}
	c, err := New("https://berth.example.com/base/")
	if err != nil {
		t.Fatal(err)
	}
	if c.Server() != "https://berth.example.com/base" {
		t.Errorf("Server() = %q", c.Server())
	}
}

func TestContextCancel(t *testing.T) {
	t.Parallel()
	block := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-block:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(block) })
	c := newClient(t, srv.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := c.ListNodes(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ListNodes = %v, want deadline exceeded", err)
	}
}
