package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthhq/berth/sdk/client"
)

// TestThirdPartyAppThroughGateway drives go-httpbin, an app nobody here wrote,
// through the gateway: forwarded headers, an application's own 503, a 10 MiB
// body and a streamed response.
func TestThirdPartyAppThroughGateway(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	ctx := context.Background()
	jt, err := cl.c.CreateJoinToken(ctx, client.JoinTokenRequest{})
	if err != nil {
		t.Fatal(err)
	}
	agentDir := filepath.Join(cl.dir, "agent")
	enroll := start(t, filepath.Join(cl.dir, "agent.log"), "berth-agent", "enroll",
		"--server", cl.url, "--join-token", jt.Token, "--fingerprint", cl.fingerprint, "--data-dir", agentDir)
	<-enroll.Done()
	start(t, filepath.Join(cl.dir, "agent.log"), "berth-agent", "run", "--data-dir", agentDir)

	cl.pushBundle(t, env.httpbinDir, "httpbin")
	one := 1
	if _, err := cl.c.ApplyService(ctx, "default", "httpbin", client.ServiceSpec{
		Bundle: "httpbin", Command: []string{"./go-httpbin"}, Domains: []string{"httpbin.localhost"},
		Replicas: &one, Env: map[string]string{"MAX_BODY_SIZE": "16777216"},
		HealthCheck: client.HealthCheck{Path: "/status/200", IntervalS: 1},
	}); err != nil {
		t.Fatal(err)
	}
	cl.waitReplicas(t, "httpbin", 1)
	waitFor(t, converge, "httpbin routed", func() (bool, string) {
		resp, err := cl.get("httpbin.localhost", "/status/200")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == 200, resp.Status
	})

	t.Run("forwarded headers", func(t *testing.T) {
		resp, err := cl.get("httpbin.localhost", "/headers")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var got struct {
			Headers map[string][]string `json:"headers"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
			t.Fatal(err)
		}
		for h, want := range map[string]string{"X-Forwarded-For": "127.0.0.1", "X-Forwarded-Proto": "http", "X-Forwarded-Host": "httpbin.localhost"} {
			if v := strings.Join(got.Headers[h], ","); v != want {
				t.Errorf("%s = %q, want %q (all: %v)", h, v, want, got.Headers)
			}
		}
	})

	t.Run("application 503 passes through", func(t *testing.T) {
		resp, err := cl.get("httpbin.localhost", "/status/503")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 503 {
			t.Fatalf("status %d, want 503", resp.StatusCode)
		}
		if g := resp.Header.Get("X-Berth-Gateway"); g != "" {
			t.Fatalf("the application's 503 carries the gateway's mark %q", g)
		}
	})

	t.Run("10 MiB body intact", func(t *testing.T) {
		const n = 10 << 20
		path := fmt.Sprintf("/bytes/%d?seed=42", n)
		resp, err := cl.get("httpbin.localhost", path)
		if err != nil {
			t.Fatal(err)
		}
		viaGateway := sha256.New()
		size, err := io.Copy(viaGateway, resp.Body)
		resp.Body.Close()
		if err != nil || size != n {
			t.Fatalf("read %d bytes, err %v; want %d", size, err, n)
		}
		// The same seed gives the same bytes straight from the workload.
		addr := cl.workloads(t, "httpbin")[0].Address
		direct, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.New()
		_, _ = io.Copy(sum, direct.Body)
		direct.Body.Close()
		if fmt.Sprintf("%x", sum.Sum(nil)) != fmt.Sprintf("%x", viaGateway.Sum(nil)) {
			t.Fatal("body through the gateway differs from the body served by the workload")
		}
	})

	t.Run("streamed response arrives as produced", func(t *testing.T) {
		// /drip sends 3 bytes spread over 3 s. Through a buffering proxy all
		// bytes arrive together at the end; streamed, the first byte arrives
		// while the rest is still being produced.
		resp, err := cl.get("httpbin.localhost", "/drip?numbytes=3&duration=3&delay=0&code=200")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		first := make([]byte, 1)
		if _, err := io.ReadFull(resp.Body, first); err != nil {
			t.Fatal(err)
		}
		firstAt := time.Now()
		rest, err := io.ReadAll(resp.Body)
		if err != nil || len(rest) != 2 {
			t.Fatalf("rest %q err %v", rest, err)
		}
		if gap := time.Since(firstAt); gap < time.Second {
			t.Fatalf("the last bytes came %s after the first: the response was buffered, not streamed", gap)
		}
	})

	// Deleting the service stops its process.
	if err := cl.c.DeleteService(ctx, "default", "httpbin", nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, converge, "httpbin process gone", func() (bool, string) {
		pids := cl.workloadPIDs(t)
		return len(pids) == 0, fmt.Sprint(pids)
	})
}
