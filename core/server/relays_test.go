package server

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/berthhq/berth/core/clusters"
	"github.com/berthhq/berth/core/store/storetest"
	"github.com/berthhq/berth/internal/proctest"
	"github.com/berthhq/berth/relay"
)

// TestRelayFrontElectionAndParking runs berthd's relay endpoint over the embedded store with real
// relays (WebSocket, yamux) and plain HTTP clients standing in for nodes: a carried request sees
// the relay's cluster in its context, only node routes are served, a second relay makes the
// cluster ambiguous and refuses its streams, and a rotation parks the relay.
func TestRelayFrontElectionAndParking(t *testing.T) {
	ctx := context.Background()
	cl := clusters.New(storetest.Open(t), nil)
	if _, err := cl.Create(ctx, "eu-1", true); err != nil {
		t.Fatal(err)
	}
	bearer, _, err := cl.EnsureCredential(ctx, "eu-1")
	if err != nil {
		t.Fatal(err)
	}
	node := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, ok := clusters.CarrierFrom(r.Context())
		if !ok {
			http.Error(w, "direct", http.StatusTeapot)
			return
		}
		_, _ = io.WriteString(w, c.Cluster+" "+r.RemoteAddr)
	})
	log := slog.New(slog.DiscardHandler)
	f, err := newRelayFront(cl, node, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	core := httptest.NewServer(f.wrap(node))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		f.close(ctx)
		core.Close()
	})
	wsURL := "ws" + strings.TrimPrefix(core.URL, "http") + RelayPath

	start := func(cred string) (*relay.Relay, string) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		r, err := relay.Start(relay.Config{CoreURL: wsURL, Listener: ln, Credential: cred, Build: "test", BackoffMin: 50 * time.Millisecond, BackoffMax: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Close() })
		return r, "http://" + ln.Addr().String()
	}
	get := func(base, path string) (int, string, error) {
		c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := c.Get(base + path)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}
	state := func() string {
		_, err := cl.Elect(ctx, "eu-1")
		switch {
		case err == nil:
			return "connected"
		case errors.Is(err, clusters.ErrAmbiguous):
			return "ambiguous"
		case errors.Is(err, clusters.ErrNotConnected):
			return "not_connected"
		}
		return err.Error()
	}
	waitState := func(want string) {
		t.Helper()
		proctest.WaitFor(t, 10*time.Second, "cluster eu-1 "+want, func() (bool, string) { s := state(); return s == want, s })
	}

	// A wrong credential never registers.
	bad, _ := start("brr_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")
	proctest.WaitFor(t, 10*time.Second, "bad relay refused", func() (bool, string) {
		ok, why := bad.Ready()
		return !ok && len(why) == 1 && strings.Contains(why[0], "401"), strings.Join(why, ";")
	})
	if s := state(); s != "not_connected" {
		t.Fatalf("after a bad credential: %s", s)
	}

	r1, base1 := start(bearer)
	waitState("connected")
	code, body, err := get(base1, "/api/v1/nodes/session")
	if err != nil || code != 200 || !strings.HasPrefix(body, "eu-1 127.0.0.1:") {
		t.Fatalf("carried node route: %d %q %v", code, body, err)
	}
	if code, _, err := get(base1, "/api/v1/projects"); err != nil || code != http.StatusNotFound {
		t.Fatalf("an operator route through the relay: %d %v", code, err)
	}

	// A second relay with the same credential: ambiguous, and no new stream is served.
	r2, _ := start(bearer)
	waitState("ambiguous")
	if code, body, err := get(base1, "/api/v1/nodes/session"); err == nil {
		t.Fatalf("a stream of an ambiguous cluster was served: %d %q", code, body)
	}
	_ = r2.Close()
	waitState("connected")
	if code, _, err := get(base1, "/api/v1/nodes/session"); err != nil || code != 200 {
		t.Fatalf("after the second relay left: %d %v", code, err)
	}

	// Rotation: the session ends at once, the relay's next dial is refused stale and it parks.
	if _, _, err := cl.RotateCredential(ctx, "eu-1"); err != nil {
		t.Fatal(err)
	}
	f.rotated("eu-1")
	proctest.WaitFor(t, 10*time.Second, "relay parked", func() (bool, string) {
		ok, why := r1.Ready()
		return !ok && len(why) == 1 && strings.HasPrefix(why[0], "parked:") && strings.Contains(why[0], "relay_credential_stale"), strings.Join(why, ";")
	})
	waitState("not_connected")
}
