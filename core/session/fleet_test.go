package session

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/nodes"
)

// fleetSize is how many simulated nodes TestFleetDialsAtOnce dials at once.
const fleetSize = 300

// fleetConnectBound bounds how long the whole fleet may take to be welcomed.
const fleetConnectBound = time.Minute

// dialResult is how one simulated node's dial ended: welcomed, or refused with an HTTP status
// (0: no HTTP answer), or failed after the upgrade.
type dialResult struct {
	welcomed bool
	status   int
	err      error
	ws       *websocket.Conn
}

// dialAndHello dials as the node with cred, says hello and waits for welcome.
func (f *fixture) dialAndHello(ctx context.Context, nodeID, cred string) dialResult {
	ws, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(f.srv.URL, "http"), &websocket.DialOptions{
		HTTPHeader: http.Header{"Authorization": {"Bearer " + cred}},
	})
	if err != nil {
		r := dialResult{err: err}
		if resp != nil {
			r.status = resp.StatusCode
		}
		return r
	}
	ws.SetReadLimit(4 << 20)
	raw, _ := json.Marshal(node.Hello{NodeID: nodeID, AgentVersion: "test"})
	frame, _ := json.Marshal(node.Envelope{V: 1, Type: node.TypeHello, ID: "msg_hello", Body: raw})
	if err := ws.Write(ctx, websocket.MessageText, frame); err != nil {
		ws.CloseNow()
		return dialResult{status: http.StatusSwitchingProtocols, err: err}
	}
	_, got, err := ws.Read(ctx)
	if err != nil {
		ws.CloseNow()
		return dialResult{status: http.StatusSwitchingProtocols, err: err}
	}
	var env node.Envelope
	if err := json.Unmarshal(got, &env); err != nil || env.Type != node.TypeWelcome {
		ws.CloseNow()
		return dialResult{status: http.StatusSwitchingProtocols, err: fmt.Errorf("first message %s, want welcome", env.Type)}
	}
	// Keep reading, as an agent does, so the core's writes never block.
	go func() {
		for {
			if _, _, err := ws.Read(context.Background()); err != nil {
				return
			}
		}
	}()
	return dialResult{welcomed: true, status: http.StatusSwitchingProtocols, ws: ws}
}

// TestFleetDialsAtOnce: fleetSize enrolled nodes dial one core at the same moment (no stagger)
// over the real embedded store while its compare-and-set lock is held (a stalled store); every
// one is welcomed within fleetConnectBound, and once the lock is released the store ends up with
// every node connected. Then the store fails under the core, and the whole fleet
// dials again: no dial is answered 401 (a credential the read view holds unchanged is let in
// from memory, one it must re-read is answered 503 with a retry hint).
func TestFleetDialsAtOnce(t *testing.T) {
	t.Parallel()
	// The reconciler's wake-ups are dropped: there are more than the fixture's channel holds.
	f := newFixture(t, func(c *Config) { c.OnChange = func(string) {} })
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ids, creds := []string{f.node.ID}, []string{f.cred}
	for i := 1; i < fleetSize; i++ {
		tok, _, err := f.reg.CreateJoinToken(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		pub, _, _ := ed25519.GenerateKey(rand.Reader)
		n, cred, err := f.reg.Enroll(ctx, nodes.EnrollRequest{JoinToken: tok, PublicKey: base64.StdEncoding.EncodeToString(pub),
			Hostname: fmt.Sprintf("fleet-%d", i), Address: "127.0.0.1"})
		if err != nil {
			t.Fatal(err)
		}
		ids, creds = append(ids, n.ID), append(creds, cred)
	}
	dialAll := func(bound time.Duration) []dialResult {
		dctx, dcancel := context.WithTimeout(ctx, bound)
		defer dcancel()
		out := make([]dialResult, len(ids))
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				out[i] = f.dialAndHello(dctx, ids[i], creds[i])
			}()
		}
		close(start)
		wg.Wait()
		for _, r := range out {
			if r.ws != nil {
				t.Cleanup(func() { r.ws.CloseNow() })
			}
		}
		return out
	}

	// Every compare-and-set of the store waits while the fleet dials, as behind a stalled
	// store: a session must not wait for one.
	release := f.st.HoldCASForTest()
	t0 := time.Now()
	res := dialAll(fleetConnectBound)
	release()
	welcomed, logged := 0, 0
	for i, r := range res {
		if r.status == http.StatusUnauthorized {
			t.Errorf("node %s answered 401", ids[i])
		}
		if r.welcomed {
			welcomed++
		} else if logged < 5 {
			logged++
			t.Logf("node %s not welcomed: status %d, %v", ids[i], r.status, r.err)
		}
	}
	if welcomed != fleetSize {
		t.Fatalf("%d of %d nodes welcomed within %s", welcomed, fleetSize, fleetConnectBound)
	}
	t.Logf("%d nodes welcomed in %s", fleetSize, time.Since(t0).Round(time.Millisecond))
	// The status writer catches up: every node is recorded connected.
	deadline := time.Now().Add(fleetConnectBound)
	for {
		all, err := f.reg.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		connected := 0
		for _, n := range all {
			if n.Status == nodes.StatusConnected {
				connected++
			}
		}
		if connected == fleetSize {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d nodes recorded connected within %s of the last welcome", connected, fleetSize, fleetConnectBound)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// The store fails under the core. Half the nodes' documents were written just before, so
	// the view must re-read those.
	for _, id := range ids[:fleetSize/2] {
		if err := f.reg.Seen(ctx, id, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.st.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	unavailable := 0
	for i, r := range dialAll(time.Minute) {
		switch r.status {
		case http.StatusUnauthorized:
			t.Errorf("node %s answered 401 with the store down", ids[i])
		case http.StatusServiceUnavailable:
			unavailable++
		}
	}
	if unavailable < fleetSize/2 {
		t.Fatalf("%d dials answered 503 with the store down, want at least the %d whose documents must be re-read", unavailable, fleetSize/2)
	}
}
