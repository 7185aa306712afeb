package node

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/conformance"
	"github.com/berthhq/berth/sdk/client"
)

// ServerConfig names the berthd under test. URL and Token are required.
//
// The suite enrolls its own nodes (one per case) with join tokens it creates,
// drives them as a scripted agent would, and removes each at the end of its
// case. While a case runs its node is connected and so may be chosen for new
// workloads: run it against a cluster that tolerates that, such as one made
// for the purpose. It sends events of type "conformance.probe".
type ServerConfig struct {
	// URL is berthd's base URL, https://host:port.
	URL string
	// Token is an API token with the scopes node:enroll, node:remove and
	// nodes:read (an admin token has them).
	Token string
	// Fingerprint pins berthd's certificate ("sha256:..."); empty trusts the
	// system CAs (docs/node-protocol.md section 2.2).
	Fingerprint string
}

// RunServer runs the server-direction suite as subtests of t: scripted nodes
// against a live berthd (docs/node-protocol.md sections 3 to 7, 10).
func RunServer(t *testing.T, cfg ServerConfig) {
	t.Helper()
	conformance.RunCases(t, ServerCases(cfg))
}

// CheckServer runs the server-direction suite outside `go test` (the CLI's
// `berth conformance node --server URL --token T`) and returns its report.
// The error is for a configuration that cannot run at all.
func CheckServer(ctx context.Context, cfg ServerConfig) (*conformance.Report, error) {
	if cfg.URL == "" || cfg.Token == "" {
		return nil, errors.New("node conformance: a server URL and a token are required")
	}
	if _, err := newServerAPI(cfg); err != nil {
		return nil, err
	}
	return conformance.CheckCases(ctx, "node-server", cfg.URL, ServerCases(cfg)), nil
}

// ServerCases returns the server-direction cases. The disconnect-timing case
// is last: it waits one session timeout (15 s by default).
func ServerCases(cfg ServerConfig) []conformance.Case {
	c := func(name string, run func(t conformance.T, n *fakeNode)) conformance.Case {
		return conformance.Case{Name: name, Run: func(t conformance.T) { run(t, enrollFakeNode(t, cfg)) }}
	}
	return []conformance.Case{
		c("server/handshake_order", serverHandshake),
		c("server/credential_in_header_only", serverCredential),
		c("server/first_message_must_be_hello", serverFirstMessage),
		c("server/size_limit", serverSizeLimit),
		c("server/unknown_fields_and_types", serverUnknown),
		c("server/unsupported_version", serverUnsupportedVersion),
		c("server/signature_and_revision", serverSignature),
		c("server/event_dedup", serverEventDedup),
		c("server/log_follow_and_divergence", serverLogDivergence),
		c("server/stream_limit", serverStreamLimit),
		c("server/one_session_per_node", serverOneSession),
		c("server/node_removed", serverRemoved),
		c("server/disconnect_timing", serverDisconnect),
	}
}

// serverAPI is the suite's API client.
type serverAPI struct {
	cfg ServerConfig
	c   *client.Client
	hc  *http.Client
}

func newServerAPI(cfg ServerConfig) (*serverAPI, error) {
	hc := http.DefaultClient
	if cfg.Fingerprint != "" {
		fp, err := client.ParseFingerprint(cfg.Fingerprint)
		if err != nil {
			return nil, fmt.Errorf("node conformance: %w", err)
		}
		if hc, err = client.PinnedHTTPClient(fp); err != nil {
			return nil, fmt.Errorf("node conformance: %w", err)
		}
	}
	c, err := client.New(cfg.URL, client.WithToken(cfg.Token), client.WithHTTPClient(hc))
	if err != nil {
		return nil, fmt.Errorf("node conformance: %w", err)
	}
	return &serverAPI{cfg: cfg, c: c, hc: hc}, nil
}

// getJSON GETs path (with query) as the suite's token and decodes the answer.
func (a *serverAPI) getJSON(ctx context.Context, path string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(a.c.Server(), "/")+path, nil)
	if err != nil {
		return fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+a.cfg.Token)
	resp, err := a.hc.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decode GET %s: %w", path, err)
	}
	return nil
}

// fakeNode is one enrolled node the suite drives as an agent would.
type fakeNode struct {
	t          conformance.T
	api        *serverAPI
	id         string
	credential string
	clusterKey ed25519.PublicKey
}

// enrollFakeNode creates a join token, enrolls a fresh node with it and
// removes the node when the case ends.
func enrollFakeNode(t conformance.T, cfg ServerConfig) *fakeNode {
	t.Helper()
	api, err := newServerAPI(cfg)
	if err != nil {
		t.Fatalf("%v", err)
	}
	ctx, cancel := sessionCtx(t)
	defer cancel()
	jt, err := api.c.CreateJoinToken(ctx, client.JoinTokenRequest{TTLSeconds: 600})
	if err != nil {
		t.Fatalf("create a join token (the token needs node:enroll): %v", err)
	}
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	resp, err := api.c.Enroll(ctx, client.EnrollRequest{JoinToken: jt.Token, PublicKey: base64.StdEncoding.EncodeToString(pub),
		Hostname: "berth-conformance", Labels: map[string]string{"berth-conformance": "true"}, Address: "127.0.0.1",
		Capacity: client.Capacity{CPUs: 1, MemoryMB: 64}})
	if err != nil {
		t.Fatalf("enroll a node: %v", err)
	}
	key, err := base64.StdEncoding.DecodeString(resp.ClusterPublicKey)
	if err != nil || len(key) != ed25519.PublicKeySize {
		t.Fatalf("enroll answered cluster_public_key %q, not a base64 Ed25519 key (section 2.4)", resp.ClusterPublicKey)
	}
	if !strings.HasPrefix(resp.NodeID, "nod_") || !strings.HasPrefix(resp.Credential, "brn_") {
		t.Errorf("enroll answered node id %q and a credential without the nod_/brn_ prefixes (section 2.4)", resp.NodeID)
	}
	n := &fakeNode{t: t, api: api, id: resp.NodeID, credential: resp.Credential, clusterKey: key}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		if err := api.c.RemoveNode(ctx, n.id); err != nil && !client.IsCode(err, string(abierrors.NotFound)) {
			t.Logf("remove conformance node %s: %v", n.id, err)
		}
	})
	return n
}

// dial opens a session with the given Authorization header value; the
// answer's status is returned when the upgrade is refused.
func (n *fakeNode) dialAuth(auth string) (*peer, int, error) {
	u, err := url.Parse(n.api.c.Server())
	if err != nil {
		return nil, 0, fmt.Errorf("server URL: %w", err)
	}
	u.Scheme = strings.Replace(u.Scheme, "http", "ws", 1)
	u.Path = strings.TrimSuffix(u.Path, "/") + "/api/v1/nodes/session"
	ctx, cancel := sessionCtx(n.t)
	defer cancel()
	h := http.Header{}
	if auth != "" {
		h.Set("Authorization", auth)
	}
	ws, resp, err := websocket.Dial(ctx, u.String(), &websocket.DialOptions{HTTPClient: n.api.hc, HTTPHeader: h,
		CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		code := 0
		if resp != nil {
			code = resp.StatusCode
		}
		return nil, code, fmt.Errorf("dial the node session: %w", err)
	}
	p := newPeer(n.t, ws)
	n.t.Cleanup(p.close)
	return p, http.StatusSwitchingProtocols, nil
}

func (n *fakeNode) dial() *peer {
	n.t.Helper()
	p, _, err := n.dialAuth("Bearer " + n.credential)
	if err != nil {
		n.t.Fatalf("%v", err)
	}
	return p
}

// session is what a handshake returned.
type session struct {
	p       *peer
	welcome node.Welcome
	desired *node.DesiredState
	logHead int64  // newest seq acknowledged
	logHash string // its hash
}

// handshake sends hello (with the given log position) and checks the order
// of section 4.1: welcome answering it, desired_state verifying against the
// cluster key; it then follows the log to the core's head.
func (n *fakeNode) handshake(logSeq int64, logHash string) *session {
	n.t.Helper()
	p := n.dial()
	helloID := p.send(node.TypeHello, "", n.hello(logSeq, logHash))
	s := &session{p: p}
	env := p.next()
	if env.Type != node.TypeWelcome || env.Re != helloID {
		n.t.Fatalf("first message %s re %q, want welcome re %s (section 4.2)", env.Type, env.Re, helloID)
	}
	s.welcome = decode[node.Welcome](n.t, env)
	if s.welcome.HeartbeatIntervalMS <= 0 || s.welcome.SessionTimeoutMS <= s.welcome.HeartbeatIntervalMS || s.welcome.Term < 1 {
		n.t.Errorf("welcome %+v: want timers (heartbeat < session timeout) and term >= 1 (section 5.10)", s.welcome)
	}
	env = p.next()
	if env.Type != node.TypeDesiredState {
		n.t.Fatalf("second message %s, want desired_state (section 4.1)", env.Type)
	}
	ds, err := node.Verify(env.Body, n.clusterKey)
	if err != nil {
		n.t.Fatalf("desired_state does not verify against the cluster key of enrollment: %v", err)
	}
	s.desired = ds
	p.send(node.TypeCommandResult, env.ID, node.CommandResult{Status: "ok", Detail: fmt.Sprintf("stored rev %d", ds.Rev)})
	s.logHead, s.logHash = logSeq, logHash
	n.acceptPushes(s)
	return s
}

// acceptPushes makes the session verify and acknowledge every later
// desired_state, as an agent does, checking that revs never go down (5.11).
func (n *fakeNode) acceptPushes(s *session) {
	s.p.consume = func(env *node.Envelope) bool {
		if env.Type != node.TypeDesiredState {
			return false
		}
		ds, err := node.Verify(env.Body, n.clusterKey)
		if err != nil {
			n.t.Errorf("pushed desired_state does not verify: %v", err)
			return true
		}
		if s.desired != nil && ds.Rev <= s.desired.Rev {
			n.t.Errorf("pushed desired_state rev %d after rev %d on the same session (revisions only increase)", ds.Rev, s.desired.Rev)
		}
		s.desired = ds
		s.p.send(node.TypeCommandResult, env.ID, node.CommandResult{Status: "ok", Detail: fmt.Sprintf("stored rev %d", ds.Rev)})
		return true
	}
}

func (n *fakeNode) hello(logSeq int64, logHash string) node.Hello {
	return node.Hello{NodeID: n.id, AgentVersion: "conformance", BootID: "conformance", Drivers: []string{"process"},
		DriverVersions: map[string]string{"process": "conformance"}, Capacity: node.Resources{CPUs: 1, MemoryMB: 64},
		LogSeq: logSeq, LogHash: logHash}
}

// follow receives log_entries, verifies each batch against the head and
// acknowledges it, until the head reaches the core's head_seq.
func (n *fakeNode) follow(s *session) {
	n.t.Helper()
	ctx, cancel := sessionCtx(n.t)
	defer cancel()
	var head struct {
		HeadSeq int64 `json:"head_seq"`
	}
	if err := n.api.getJSON(ctx, "/api/v1/changelog?from_seq=1&limit=1", &head); err != nil {
		n.t.Fatalf("read the change-log head: %v", err)
	}
	for s.logHead < head.HeadSeq {
		env := s.p.next()
		if env.Type != node.TypeLogEntries {
			n.t.Fatalf("got %s %s, want log_entries up to seq %d (section 7.4)", env.Type, env.Body, head.HeadSeq)
		}
		b := decode[node.LogEntries](n.t, env)
		if len(b.Entries) == 0 || len(b.Entries) > node.MaxLogBatch || b.FromSeq != s.logHead+1 {
			n.t.Fatalf("log_entries from_seq %d with %d entries; want from %d, 1 to %d entries", b.FromSeq, len(b.Entries), s.logHead+1, node.MaxLogBatch)
		}
		if k, err := node.VerifyChain(s.logHead, s.logHash, b.Entries); err != nil {
			n.t.Fatalf("log_entries entry %d does not verify: %v (section 7.1)", k, err)
		}
		last := b.Entries[len(b.Entries)-1]
		s.p.send(node.TypeLogAck, env.ID, node.LogAck{Seq: last.Seq, Hash: last.Hash})
		s.logHead, s.logHash = last.Seq, last.Hash
	}
}

// nodeStatus returns the node's status as the API lists it.
func (n *fakeNode) nodeStatus() string {
	n.t.Helper()
	ctx, cancel := sessionCtx(n.t)
	defer cancel()
	ns, err := n.api.c.ListNodes(ctx)
	if err != nil {
		n.t.Fatalf("list nodes: %v", err)
	}
	for _, x := range ns {
		if x.ID == n.id {
			return x.Status
		}
	}
	return ""
}

// events returns the stored events of typ about or from this node.
func (n *fakeNode) events(typ string) []node.Event {
	n.t.Helper()
	ctx, cancel := sessionCtx(n.t)
	defer cancel()
	var out []node.Event
	after := int64(0)
	for {
		var page struct {
			Items []struct {
				Seq   int64      `json:"seq"`
				Event node.Event `json:"event"`
			} `json:"items"`
		}
		if err := n.api.getJSON(ctx, fmt.Sprintf("/api/v1/events?type=%s&after_seq=%d&limit=1000", url.QueryEscape(typ), after), &page); err != nil {
			n.t.Fatalf("list events: %v", err)
		}
		for _, it := range page.Items {
			if it.Event.Subject.ID == n.id || it.Event.Source.NodeID == n.id {
				out = append(out, it.Event)
			}
			after = it.Seq
		}
		if len(page.Items) < 1000 {
			return out
		}
	}
}

// eventually polls cond every 100 ms until it holds or 10 s passed. It is for
// state the API serves a moment after the wire showed the cause.
func (n *fakeNode) eventually(what string, cond func() bool) {
	n.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			n.t.Fatalf("not within 10 s: %s", what)
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-n.t.Context().Done():
			n.t.Fatalf("cancelled waiting for %s", what)
		}
	}
}

func serverHandshake(t conformance.T, n *fakeNode) {
	s := n.handshake(0, "")
	n.follow(s)
	s.p.barrier()
	if st := n.nodeStatus(); st != client.NodeConnected {
		t.Errorf("node status %q after the handshake, want connected", st)
	}
	n.eventually("node.connected recorded", func() bool { return len(n.events("node.connected")) == 1 })
	// A heartbeat and a status report are taken without an answer.
	s.p.send(node.TypeHeartbeat, "", node.Heartbeat{Time: time.Now().UTC()})
	s.p.send(node.TypeStatusReport, "", node.StatusReport{AppliedRev: s.desired.Rev, Workloads: []node.WorkloadStatus{}})
	s.p.barrier()
}

func serverCredential(t conformance.T, n *fakeNode) {
	for _, auth := range []string{"", "Bearer brn_wrong", "Basic " + n.credential} {
		if _, code, err := n.dialAuth(auth); err == nil || code != http.StatusUnauthorized {
			t.Errorf("session with Authorization %q: status %d, want 401 (section 3.1)", strings.SplitN(auth, " ", 2)[0], code)
		}
	}
}

func serverFirstMessage(t conformance.T, n *fakeNode) {
	p := n.dial()
	id := p.send(node.TypeHeartbeat, "", node.Heartbeat{Time: time.Now().UTC()})
	p.expectError(string(abierrors.BadMessage), true, id)
	p.expectClosed(wait)
}

func serverSizeLimit(t conformance.T, n *fakeNode) {
	s := n.handshake(0, "")
	n.follow(s)
	s.p.sendRaw([]byte(`{"v":1,"type":"heartbeat","id":"msg_big","body":{"pad":"` + strings.Repeat("x", node.MaxMessageBytes) + `"}}`))
	s.p.expectError(string(abierrors.BadMessage), false, "")
	s.p.sendRaw([]byte(`not json`))
	s.p.expectError(string(abierrors.BadMessage), false, "")
	s.p.barrier()
}

func serverUnknown(t conformance.T, n *fakeNode) {
	p := n.dial()
	h, _ := json.Marshal(n.hello(0, ""))
	var m map[string]any
	_ = json.Unmarshal(h, &m)
	m["future_field"] = []int{1, 2}
	helloID := p.send(node.TypeHello, "", m)
	if env := p.next(); env.Type != node.TypeWelcome || env.Re != helloID {
		t.Fatalf("hello with an unknown member answered %s, want welcome", env.Type)
	}
	s := &session{p: p}
	env := p.next()
	if env.Type != node.TypeDesiredState {
		t.Fatalf("got %s, want desired_state", env.Type)
	}
	n.acceptPushes(s)
	n.follow(s)
	id := p.send("future_message_type", "", map[string]any{"x": 1})
	p.expectError(string(abierrors.BadMessage), false, id)
	p.send(node.TypeHeartbeat, "", map[string]any{"time": time.Now().UTC(), "busy": false, "future_field": true})
	p.barrier()
}

func serverUnsupportedVersion(t conformance.T, n *fakeNode) {
	p := n.dial()
	id := p.sendV(2, node.TypeHello, "", n.hello(0, ""))
	p.expectError(string(abierrors.UnsupportedVersion), true, id)
	p.expectClosed(wait)
}

// serverSignature: every desired_state verifies against the key of
// enrollment and a changed byte does not (5.11); one desired_state per
// session even when unchanged, revs never decreasing (4.2, 6.1).
func serverSignature(t conformance.T, n *fakeNode) {
	s := n.handshake(0, "")
	raw, _ := json.Marshal(s.desired)
	raw = []byte(strings.Replace(string(raw), `"rev":`, `"rev":1`, 1))
	if _, err := node.Verify(raw, n.clusterKey); err == nil {
		t.Errorf("a desired_state with a changed rev still verifies: the signature does not cover the body")
	}
	s.p.close()
	s2 := n.handshake(0, "")
	if s2.desired.Rev < s.desired.Rev {
		t.Errorf("second session's desired_state rev %d is lower than the first's %d", s2.desired.Rev, s.desired.Rev)
	}
}

// serverEventDedup: an event is stored once however often it is sent, with
// the session's node as source (5.4); a body without an evt_ id is refused.
func serverEventDedup(t conformance.T, n *fakeNode) {
	s := n.handshake(0, "")
	n.follow(s)
	ev := node.Event{SchemaVersion: 1, ID: "evt_conf" + strings.TrimPrefix(n.id, "nod_"), Type: "conformance.probe", Time: time.Now().UTC(),
		Source: node.EventSource{Kind: "node", NodeID: "nod_someone_else"}, Subject: node.EventRef{Type: "node", ID: n.id}}
	s.p.send(node.TypeEvent, "", ev)
	s.p.send(node.TypeEvent, "", ev)
	id := s.p.send(node.TypeEvent, "", node.Event{ID: "no-prefix", Type: "conformance.probe"})
	s.p.expectError(string(abierrors.BadMessage), false, id)
	s.p.barrier()
	s.p.close()
	s = n.handshake(0, "")
	s.p.send(node.TypeEvent, "", ev) // resent after a reconnect
	s.p.barrier()
	got := n.events("conformance.probe")
	if len(got) != 1 {
		t.Fatalf("%d stored events for one id sent three times, want 1", len(got))
	}
	if got[0].Source.NodeID != n.id {
		t.Errorf("stored event source %+v, want the session's node %s", got[0].Source, n.id)
	}
}

// serverLogDivergence: log_entries from the node's position; a position the
// core does not hold answers log_diverged (non-fatal, re the hello) after
// desired_state and before log_entries from seq 1 (7.4, 7.5).
func serverLogDivergence(t conformance.T, n *fakeNode) {
	s := n.handshake(0, "")
	n.follow(s)
	head, hash := s.logHead, s.logHash
	s.p.close()
	// Resuming from the acknowledged position sends nothing older.
	s = n.handshake(head, hash)
	s.p.barrier()
	s.p.close()
	for _, pos := range []struct {
		seq  int64
		hash string
	}{{head, strings.Repeat("0", 63) + "1"}, {head + 1000, hash}} {
		p := n.dial()
		helloID := p.send(node.TypeHello, "", n.hello(pos.seq, pos.hash))
		if env := p.next(); env.Type != node.TypeWelcome {
			t.Fatalf("got %s, want welcome", env.Type)
		}
		if env := p.next(); env.Type != node.TypeDesiredState {
			t.Fatalf("got %s, want desired_state", env.Type)
		}
		s := &session{p: p}
		n.acceptPushes(s)
		p.expectError(string(abierrors.LogDiverged), false, helloID)
		n.follow(s) // from seq 1: checks from_seq
		p.close()
	}
}

// serverOneSession: a newer session closes the older with 1008 and the node
// stays connected, with no node.disconnected recorded (3.1, 4.4).
func serverOneSession(t conformance.T, n *fakeNode) {
	old := n.handshake(0, "")
	n.follow(old)
	fresh := n.handshake(old.logHead, old.logHash)
	if code := old.p.expectClosed(wait); code != websocket.StatusPolicyViolation {
		t.Errorf("older session closed with %d, want 1008", code)
	}
	fresh.p.barrier()
	if st := n.nodeStatus(); st != client.NodeConnected {
		t.Errorf("node status %q after a replaced session, want connected", st)
	}
	if evs := n.events("node.disconnected"); len(evs) != 0 {
		t.Errorf("a replaced session recorded node.disconnected: %+v", evs)
	}
}

// serverRemoved: removing the node ends its session with fatal node_removed,
// and a redial's hello is answered the same (section 10).
func serverRemoved(t conformance.T, n *fakeNode) {
	s := n.handshake(0, "")
	n.follow(s)
	ctx, cancel := sessionCtx(t)
	defer cancel()
	removed := make(chan error, 1)
	go func() { removed <- n.api.c.RemoveNode(ctx, n.id) }() // the session is read meanwhile, as an agent does
	s.p.expectError(string(abierrors.NodeRemoved), true, "")
	s.p.expectClosed(wait)
	if err := <-removed; err != nil {
		t.Fatalf("remove the node (the token needs node:remove): %v", err)
	}
	p := n.dial()
	id := p.send(node.TypeHello, "", n.hello(0, ""))
	p.expectError(string(abierrors.NodeRemoved), true, id)
}

// serverDisconnect: a silent node is disconnected after the welcome's
// session timeout with reason heartbeat_timeout; a closed socket is
// session_closed; a return records node.connected (4.4).
func serverDisconnect(t conformance.T, n *fakeNode) {
	s := n.handshake(0, "")
	n.follow(s)
	s.p.barrier()
	timeout := time.Duration(s.welcome.SessionTimeoutMS) * time.Millisecond
	silent := time.Now()
	s.p.expectClosed(timeout + wait)
	took := time.Since(silent)
	if took < timeout-time.Second || took > timeout+5*time.Second {
		t.Errorf("a silent session ended after %s, want the session timeout %s", took.Round(time.Millisecond), timeout)
	}
	n.eventually("node disconnected with heartbeat_timeout", func() bool {
		evs := n.events("node.disconnected")
		return n.nodeStatus() == client.NodeDisconnected && len(evs) == 1 && evs[0].Data["reason"] == "heartbeat_timeout"
	})
	s = n.handshake(s.logHead, s.logHash)
	s.p.barrier()
	_ = s.p.ws.Close(websocket.StatusNormalClosure, "conformance: bye")
	n.eventually("node disconnected with session_closed", func() bool {
		evs := n.events("node.disconnected")
		return len(evs) == 2 && evs[1].Data["reason"] == "session_closed"
	})
	if c := len(n.events("node.connected")); c != 2 {
		t.Errorf("%d node.connected events for two welcomed sessions, want 2", c)
	}
}

// serverStreamLimit: operators follow a workload's logs through the API
// (GET /api/v1/nodes/{id}/logs?follow=true); the core opens one app_logs
// stream per follower, at most 32 on one session: the 33rd follower is
// refused with stream_limit and no 33rd stream_open reaches the node
// (5.15). A follower that leaves makes the core send stream_close (5.16).
func serverStreamLimit(t conformance.T, n *fakeNode) {
	s := n.handshake(0, "")
	n.follow(s)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for range node.MaxStreamsPerSession {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = n.api.c.FollowNodeLogs(ctx, n.id, "wl_conformance", 1, func(node.LogLine) error { return nil })
		}()
	}
	opened := map[string]bool{}
	for len(opened) < node.MaxStreamsPerSession {
		env := s.p.awaitType(node.TypeStreamOpen)
		o := decode[node.StreamOpen](t, env)
		if o.Kind != node.StreamAppLogs || o.StreamID == "" || opened[o.StreamID] {
			t.Fatalf("stream_open %+v: want a new app_logs stream id", o)
		}
		opened[o.StreamID] = true
	}
	err := n.api.c.FollowNodeLogs(ctx, n.id, "wl_conformance", 1, func(node.LogLine) error { return nil })
	var apiErr *client.APIError
	if !errors.As(err, &apiErr) || apiErr.Problem.Code != string(abierrors.StreamLimit) {
		t.Errorf("follower %d answered %v, want stream_limit", node.MaxStreamsPerSession+1, err)
	}
	extra := 0
	pushes := s.p.consume
	s.p.consume = func(env *node.Envelope) bool {
		if env.Type == node.TypeStreamOpen {
			extra++
			return true
		}
		return pushes != nil && pushes(env)
	}
	s.p.barrier()
	if extra > 0 {
		t.Errorf("%d stream_open beyond the limit reached the node", extra)
	}
	cancel()
	closed := 0
	for closed < node.MaxStreamsPerSession {
		env := s.p.awaitType(node.TypeStreamClose)
		c := decode[node.StreamClose](t, env)
		if !opened[c.StreamID] {
			t.Fatalf("stream_close for unknown stream %q", c.StreamID)
		}
		s.p.send(node.TypeStreamEnd, "", node.StreamEnd{StreamID: c.StreamID, Reason: node.StreamCancelled})
		delete(opened, c.StreamID)
		closed++
	}
	s.p.barrier()
}
