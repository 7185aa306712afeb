package relay

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/hashicorp/yamux"
	"github.com/prometheus/client_golang/prometheus"

	abirelay "github.com/berthhq/berth/abi/relay"
	"github.com/berthhq/berth/internal/tlstest"
)

// The test core's stream protocol: the first byte says what the handler does with the rest.
const (
	cmdEcho  = 'e' // echo every byte back, close at EOF
	cmdFlood = 'f' // write until the write fails
)

// harness is one in-process core side and one relay, both on loopback, stopped by the test.
type harness struct {
	t         *testing.T
	core      *Core
	srv       *httptest.Server
	relay     *Relay
	nodeAddr  string
	clientTLS *tls.Config
	coreReg   *prometheus.Registry
	relayReg  *prometheus.Registry

	mu         sync.Mutex
	headers    []abirelay.StreamHeader
	handled    atomic.Int64
	floodEnded chan struct{}
}

// metricValue sums every series of the named family in reg.
func metricValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func newHarness(t *testing.T, tweak func(*Config)) *harness {
	t.Helper()
	before := runtime.NumGoroutine()
	h := &harness{t: t, floodEnded: make(chan struct{}, 16), coreReg: prometheus.NewRegistry(), relayReg: prometheus.NewRegistry()}
	core, err := NewCore(CoreConfig{Handler: h.handle, KeepAlive: time.Second, Metrics: h.coreReg})
	if err != nil {
		t.Fatal(err)
	}
	h.core = core
	h.srv = httptest.NewServer(core)

	ca := tlstest.NewCA(t)
	leaf := ca.Issue(t, "relay.test")
	cert, err := tls.X509KeyPair(leaf.Chain, leaf.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	h.nodeAddr = ln.Addr().String()
	h.clientTLS = &tls.Config{RootCAs: ca.Pool, ServerName: "relay.test"}
	cfg := Config{CoreURL: "ws" + strings.TrimPrefix(h.srv.URL, "http") + "/relay", Listener: ln,
		BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond, KeepAlive: time.Second, Metrics: h.relayReg}
	if tweak != nil {
		tweak(&cfg)
	}
	h.relay, err = Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.relay.Close(); err != nil {
			t.Errorf("relay close: %v", err)
		}
		_ = h.core.Close()
		h.srv.Close()
		// Every goroutine the relay, the core side and the test's nodes started is gone.
		deadline := time.Now().Add(10 * time.Second)
		for runtime.NumGoroutine() > before {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				t.Fatalf("goroutines: %d before, %d after close\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
	waitFor(t, 10*time.Second, "the relay is ready", func() bool { ok, _ := h.relay.Ready(); return ok })
	return h
}

func (h *harness) handle(_ context.Context, conn net.Conn, hdr abirelay.StreamHeader) {
	defer conn.Close()
	h.handled.Add(1)
	h.mu.Lock()
	h.headers = append(h.headers, hdr)
	h.mu.Unlock()
	var cmd [1]byte
	if _, err := io.ReadFull(conn, cmd[:]); err != nil {
		return
	}
	switch cmd[0] {
	case cmdEcho:
		_, _ = io.Copy(conn, conn)
	case cmdFlood:
		buf := make([]byte, 32<<10)
		for {
			_ = conn.SetWriteDeadline(time.Now().Add(30 * time.Second))
			if _, err := conn.Write(buf); err != nil {
				h.floodEnded <- struct{}{}
				return
			}
		}
	}
}

// dialNode connects one node to the relay's TLS listener.
func (h *harness) dialNode() *tls.Conn {
	h.t.Helper()
	d := &net.Dialer{Timeout: 5 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", h.nodeAddr, h.clientTLS)
	if err != nil {
		h.t.Fatalf("node dial: %v", err)
	}
	return c
}

// echo sends payload through c under the echo command, half-closes and checks every byte comes back.
func echo(c *tls.Conn, payload []byte) error {
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write(append([]byte{cmdEcho}, payload...))
		if err == nil {
			err = c.CloseWrite()
		}
		errc <- err
	}()
	got, rerr := io.ReadAll(c)
	if werr := <-errc; werr != nil {
		return fmt.Errorf("write: %w", werr)
	}
	if rerr != nil {
		return fmt.Errorf("read: %w", rerr)
	}
	if !bytes.Equal(got, payload) {
		return fmt.Errorf("echo differs: sent %d bytes, got %d", len(payload), len(got))
	}
	return nil
}

func TestNodesEchoThroughRelayConcurrently(t *testing.T) {
	h := newHarness(t, nil)
	const nodes = 50
	var wg sync.WaitGroup
	errs := make(chan error, nodes)
	locals := make(chan string, nodes)
	for i := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", h.nodeAddr, h.clientTLS)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			locals <- c.LocalAddr().String()
			payload := make([]byte, 100<<10+i*997) // above one stream window for most nodes
			_, _ = rand.Read(payload)
			if err := echo(c, payload); err != nil {
				errs <- fmt.Errorf("node %d: %w", i, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	close(locals)
	for err := range errs {
		t.Error(err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.headers) != nodes {
		t.Fatalf("core saw %d streams, want %d", len(h.headers), nodes)
	}
	seen := map[string]bool{}
	for _, hd := range h.headers {
		seen[hd.RemoteAddr] = true
		if hd.Registration.RelayID != h.relay.ID() || hd.Registration.Session != 1 {
			t.Errorf("header registration %+v, want relay %s session 1", hd.Registration, h.relay.ID())
		}
	}
	for l := range locals {
		if !seen[l] {
			t.Errorf("no stream header named node address %s", l)
		}
	}
}

// fakeRelay dials the core directly and opens raw streams, so a test can write any header.
func fakeRelay(t *testing.T, h *harness) *yamux.Session {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ws, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(h.srv.URL, "http")+"/relay",
		&websocket.DialOptions{Subprotocols: []string{abirelay.Subprotocol}})
	if err != nil {
		t.Fatal(err)
	}
	ws.SetReadLimit(wsReadLimit)
	sess, err := yamux.Client(websocket.NetConn(ctx, ws, websocket.MessageBinary), muxConfig(discard(), time.Second, time.Second, time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sess.Close() })
	return sess
}

func TestMalformedOrOversizedHeaderIsRefused(t *testing.T) {
	h := newHarness(t, nil)
	sess := fakeRelay(t, h)
	good, err := abirelay.StreamHeader{Version: 1, RemoteAddr: "10.0.0.1:4000",
		Registration: abirelay.Registration{RelayID: "x", Session: 1}}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	oversized := binary.BigEndian.AppendUint16(nil, abirelay.MaxHeaderSize+1)
	oversized = append(oversized, bytes.Repeat([]byte{' '}, abirelay.MaxHeaderSize+1)...)
	unknown := []byte(`{"v":1,"remote_addr":"10.0.0.1:4000","registration":{"relay_id":"x","session":1},"cluster":"eu-1"}`)
	cases := map[string][]byte{
		"oversized":     oversized,
		"not json":      append(binary.BigEndian.AppendUint16(nil, 5), "hello"...),
		"unknown field": append(binary.BigEndian.AppendUint16(nil, uint16(len(unknown))), unknown...),
		"wrong version": bytes.Replace(good, []byte(`"v":1`), []byte(`"v":2`), 1),
		"empty":         {0, 0},
		"truncated":     good[:len(good)-3],
	}
	for name, raw := range cases {
		st, err := sess.OpenStream()
		if err != nil {
			t.Fatalf("%s: open: %v", name, err)
		}
		// The header, then bytes a node would have sent: none of it may reach the handler.
		_, _ = st.Write(append(bytes.Clone(raw), cmdEcho, 'x', 'y'))
		if name == "truncated" {
			_ = st.Close() // the core reads to EOF inside the declared length
		}
		_ = st.SetReadDeadline(time.Now().Add(10 * time.Second))
		got, err := io.ReadAll(st)
		if err != nil && !errors.Is(err, io.EOF) {
			t.Errorf("%s: the stream was not closed by the core: %v", name, err)
		}
		if len(got) != 0 {
			t.Errorf("%s: the core answered %q", name, got)
		}
		_ = st.Close()
	}
	if n := h.handled.Load(); n != 0 {
		t.Fatalf("the handler served %d refused streams", n)
	}
	if n := metricValue(t, h.coreReg, "berth_relay_streams_refused_total"); n != float64(len(cases)) {
		t.Fatalf("berth_relay_streams_refused_total %v, want %d", n, len(cases))
	}
	// The same session still carries a well-formed stream.
	st, err := sess.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	_ = st.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := st.Write(append(good, cmdEcho, 'o', 'k')); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2)
	if _, err := io.ReadFull(st, buf); err != nil || string(buf) != "ok" {
		t.Fatalf("well-formed stream after refusals: %q, %v", buf, err)
	}
}

func TestCoreRefusesUnknownProtocolVersion(t *testing.T) {
	h := newHarness(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(h.srv.URL, "http")+"/relay",
		&websocket.DialOptions{Subprotocols: []string{"berth-relay.v0"}})
	if err == nil {
		t.Fatal("a relay offering only another version was accepted")
	}
	if resp == nil || resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("answer %v, want 400", resp)
	}
	body, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(body), "relay_protocol_unsupported") {
		t.Fatalf("body %s names no relay_protocol_unsupported", body)
	}
}

func TestCoreSessionLossClosesNodesAndRelayReconnects(t *testing.T) {
	const spacing = 50 * time.Millisecond
	h := newHarness(t, func(c *Config) {
		c.ReregisterSpacing = spacing
		c.BackoffMin, c.BackoffMax = 400*time.Millisecond, 800*time.Millisecond
	})
	const nodes = 5
	conns := make([]*tls.Conn, nodes)
	for i := range conns {
		conns[i] = h.dialNode()
		defer conns[i].Close()
		// Open the stream and prove it carries, without ending it.
		if _, err := conns[i].Write([]byte{cmdEcho, 'a'}); err != nil {
			t.Fatal(err)
		}
		_ = conns[i].SetReadDeadline(time.Now().Add(10 * time.Second))
		b := make([]byte, 1)
		if _, err := io.ReadFull(conns[i], b); err != nil {
			t.Fatalf("node %d before the loss: %v", i, err)
		}
	}
	waitFor(t, 5*time.Second, "the relay carries every node", func() bool { return h.relay.Nodes() == nodes })

	lost := time.Now()
	h.core.Drop()
	waitFor(t, 3*time.Second, "the relay notices the loss", func() bool { ok, _ := h.relay.Ready(); return !ok })
	// A node that speaks while there is no session is kept, not closed: closing is the next session's.
	if _, err := conns[0].Write([]byte("lost")); err != nil {
		t.Fatal(err)
	}
	_ = conns[0].SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if _, err := conns[0].Read(make([]byte, 1)); !isTimeout(err) {
		t.Fatalf("a node that spoke during the outage was closed at once: %v", err)
	}
	// Reconnect within the backoff bound (800 ms, jittered below it) plus the dial on loopback.
	waitFor(t, 3*time.Second, "the relay has a new core session", func() bool {
		ok, _ := h.relay.Ready()
		return ok && h.core.Sessions() == 1
	})
	// Every node of the lost session is closed, paced, so it re-registers.
	closedAt := make([]time.Time, nodes)
	readErr := make([]error, nodes)
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			_, readErr[i] = c.Read(make([]byte, 1))
			closedAt[i] = time.Now()
		}()
	}
	wg.Wait()
	first, last := closedAt[0], closedAt[0]
	for i, err := range readErr {
		var ne net.Error
		if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
			t.Fatalf("node %d was not closed after the core session was lost: %v", i, err)
		}
		if closedAt[i].Before(first) {
			first = closedAt[i]
		}
		if closedAt[i].After(last) {
			last = closedAt[i]
		}
	}
	if gap := last.Sub(first); gap < (nodes-1)*spacing*8/10 {
		t.Fatalf("the nodes were closed within %v, not paced %v apart", gap, spacing)
	}
	if took := last.Sub(lost); took > DefaultReregisterWindow+3*time.Second {
		t.Fatalf("closing the nodes took %v", took)
	}
	// New node connections work again, on session 2.
	c := h.dialNode()
	defer c.Close()
	payload := bytes.Repeat([]byte("relay"), 1000)
	if err := echo(c, payload); err != nil {
		t.Fatalf("a node after the reconnect: %v", err)
	}
	h.mu.Lock()
	newest := h.headers[len(h.headers)-1]
	h.mu.Unlock()
	if newest.Registration.Session != 2 {
		t.Fatalf("stream after the reconnect names session %d, want 2", newest.Registration.Session)
	}
	if n := metricValue(t, h.relayReg, "berth_relay_core_sessions_total"); n != 2 {
		t.Fatalf("berth_relay_core_sessions_total %v, want 2", n)
	}
	if n := metricValue(t, h.relayReg, "berth_relay_node_reregistrations_total"); n != nodes {
		t.Fatalf("berth_relay_node_reregistrations_total %v, want %d", n, nodes)
	}
}

func TestNodeWaitsForSessionThenIsRefused(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.SessionWait = 300 * time.Millisecond })
	rec := httptest.NewRecorder()
	h.relay.ReadyHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("/readyz with a core session: %d %s", rec.Code, rec.Body)
	}
	// Stop the core from accepting: the relay loses its session and cannot get another.
	_ = h.core.Close()
	waitFor(t, 5*time.Second, "the relay reports no session", func() bool { ok, _ := h.relay.Ready(); return !ok })
	_, why := h.relay.Ready()
	if len(why) == 0 || !strings.Contains(why[0], "no core session") {
		t.Fatalf("readiness names no reason: %v", why)
	}
	rec = httptest.NewRecorder()
	h.relay.ReadyHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "no core session") {
		t.Fatalf("/readyz without a core session: %d %s", rec.Code, rec.Body)
	}
	c := h.dialNode()
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	start := time.Now()
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("a node with no core session was not closed: %v", err)
	}
	if took := time.Since(start); took < 200*time.Millisecond {
		t.Fatalf("the node was closed after %v, before its session wait", took)
	}
	if n := metricValue(t, h.relayReg, "berth_relay_node_connections_refused_total"); n != 1 {
		t.Fatalf("berth_relay_node_connections_refused_total %v, want 1", n)
	}
}

func TestStalledNodeDoesNotBlockOthers(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.WriteTimeout = 500 * time.Millisecond })
	stalled := h.dialNode()
	defer stalled.Close()
	if _, err := stalled.Write([]byte{cmdFlood}); err != nil {
		t.Fatal(err)
	}
	// The stalled node never reads. Others are served meanwhile.
	var wg sync.WaitGroup
	errs := make(chan error, 10)
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", h.nodeAddr, h.clientTLS)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			if err := echo(c, bytes.Repeat([]byte{byte(i)}, 300<<10)); err != nil {
				errs <- fmt.Errorf("node %d: %w", i, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// The stalled node's own write budget ends it, and the core's writer sees that.
	select {
	case <-h.floodEnded:
	case <-time.After(15 * time.Second):
		t.Fatal("the flood to a node that never reads was never ended")
	}
}

func TestCloseEndsLiveNodesAndEveryGoroutine(t *testing.T) {
	h := newHarness(t, nil) // its cleanup checks the goroutine count after Close
	conns := make([]*tls.Conn, 10)
	for i := range conns {
		conns[i] = h.dialNode()
		defer conns[i].Close()
		if _, err := conns[i].Write([]byte{cmdEcho, 'x'}); err != nil {
			t.Fatal(err)
		}
		_ = conns[i].SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadFull(conns[i], make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 5*time.Second, "the relay carries every node", func() bool { return h.relay.Nodes() == len(conns) })
	if err := h.relay.Close(); err != nil {
		t.Fatal(err)
	}
	for i, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
			t.Fatalf("node %d still open after Close: %v", i, err)
		}
	}
	if h.relay.Nodes() != 0 {
		t.Fatalf("the relay still counts %d nodes after Close", h.relay.Nodes())
	}
}
