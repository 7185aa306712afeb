package node

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/gowebpki/jcs"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/conformance"
)

// AgentConfig names the agent under test. Binary is required.
type AgentConfig struct {
	// Binary is the berth-agent executable. Each case enrolls a fresh data
	// directory with `Binary enroll` against its own scripted core and runs
	// `Binary run`.
	Binary string
	// PluginDir holds berth-plugin-process; empty means the directory of
	// Binary (the agent's own default).
	PluginDir string
}

// RunAgent runs the agent-direction suite as subtests of t: a real agent
// process against a scripted core (docs/node-protocol.md sections 3 to 7, 10).
func RunAgent(t *testing.T, cfg AgentConfig) {
	t.Helper()
	conformance.RunCases(t, AgentCases(cfg))
}

// CheckAgent runs the agent-direction suite outside `go test` (the CLI's
// `berth conformance node --agent PATH`) and returns its report. The error is
// for a configuration that cannot run at all; failed cases are in the report.
func CheckAgent(ctx context.Context, cfg AgentConfig) (*conformance.Report, error) {
	if cfg.Binary == "" {
		return nil, fmt.Errorf("node conformance: an agent binary is required")
	}
	r := conformance.CheckCases(ctx, "node-agent", cfg.Binary, AgentCases(cfg))
	return r, nil
}

// AgentCases returns the agent-direction cases, each a real agent process
// against its own scripted core over real TLS WebSockets on loopback.
func AgentCases(cfg AgentConfig) []conformance.Case {
	c := func(name string, run func(t conformance.T, a *agentRun)) conformance.Case {
		return conformance.Case{Name: name, Run: func(t conformance.T) { run(t, startAgent(t, cfg)) }}
	}
	return []conformance.Case{
		c("agent/handshake_order", agentHandshakeOrder),
		c("agent/heartbeat_timing_and_redial", agentHeartbeatTiming),
		c("agent/size_limit", agentSizeLimit),
		c("agent/unknown_fields_and_types", agentUnknown),
		c("agent/unsupported_version", agentUnsupportedVersion),
		c("agent/first_message_must_be_welcome", agentFirstMessage),
		c("agent/bad_signature", agentBadSignature),
		c("agent/stale_revision", agentStaleRevision),
		c("agent/event_ids", agentEvents),
		c("agent/log_follow_and_divergence", agentLogDivergence),
		c("agent/stream_limit_and_commands", agentStreams),
		c("agent/signing_key_rotate", agentKeyRotate),
		c("agent/node_removed", agentRemoved),
	}
}

// hb is the heartbeat interval the scripted core's welcome carries: short,
// so that a case sees several.
const hb = 300 * time.Millisecond

// agentHandshakeOrder: hello first with the node's position (5.1, 4.2);
// desired_state stored then acknowledged (5.9); status reports after it (5.3);
// the credential only in the Authorization header (3.1).
func agentHandshakeOrder(t conformance.T, a *agentRun) {
	fc := a.core
	p := fc.accept()
	h := fc.welcome(p, hb)
	if h.NodeID != fakeNodeID || h.AgentVersion == "" || h.StoredRev != 0 || h.LogSeq != 0 || len(h.Drivers) == 0 || h.BootID == "" {
		t.Errorf("hello of a fresh node: %+v; want node_id %s, agent_version, boot_id, drivers, stored_rev 0, log_seq 0", h, fakeNodeID)
	}
	if h.SigningKeyID != node.KeyID(fc.pub) {
		t.Errorf("hello signing_key_id %q, want the pinned key's id %s (section 5.1)", h.SigningKeyID, node.KeyID(fc.pub))
	}
	for _, d := range h.Drivers {
		if h.DriverVersions[d] == "" {
			t.Errorf("hello names driver %q without its version in driver_versions", d)
		}
	}
	res := fc.desire(p, fc.signed(1, fc.key))
	if res.Status != "ok" {
		t.Fatalf("desired_state rev 1 answered %+v, want ok (stored)", res)
	}
	rep := decode[node.StatusReport](t, p.await("status_report with applied_rev 1", func(e *node.Envelope) bool {
		if e.Type != node.TypeStatusReport {
			return false
		}
		var r node.StatusReport
		return json.Unmarshal(e.Body, &r) == nil && r.AppliedRev == 1
	}))
	if rep.Workloads == nil {
		t.Errorf("status_report carries no workloads array: %+v", rep)
	}
	fc.mu.Lock()
	refused := fc.refused
	fc.mu.Unlock()
	if refused != 0 {
		t.Errorf("%d session requests came without the credential in the Authorization header", refused)
	}
	// One session at a time: nothing else was dialled while this one lived (3.1).
	select {
	case extra := <-fc.sessions:
		extra.close()
		t.Errorf("the agent opened a second session while one was live")
	default:
	}
	// The stored snapshot survives the session: the next hello says so.
	p.close()
	p = fc.accept()
	if h := fc.welcome(p, hb); h.StoredRev != 1 || h.AppliedRev != 1 {
		t.Errorf("hello after storing rev 1: stored_rev %d applied_rev %d, want 1 and 1", h.StoredRev, h.AppliedRev)
	}
}

// agentHeartbeatTiming: heartbeats at the welcome's interval (4.3); after the
// core closes, a redial within the first backoff step (4.4).
func agentHeartbeatTiming(t conformance.T, a *agentRun) {
	fc := a.core
	p := fc.accept()
	fc.welcome(p, hb)
	var times []time.Time
	for len(times) < 6 {
		p.awaitType(node.TypeHeartbeat)
		times = append(times, time.Now())
	}
	for i := 2; i < len(times); i++ { // the first gap may straddle the welcome
		if gap := times[i].Sub(times[i-1]); gap > 3*hb {
			t.Errorf("heartbeat gap %s with heartbeat_interval_ms %d (docs/node-protocol.md section 4.3)", gap, hb.Milliseconds())
		}
	}
	if span := times[len(times)-1].Sub(times[1]); span < 4*hb/2 {
		t.Errorf("4 heartbeat gaps took %s, want about %s: the agent does not keep the interval", span, 4*hb)
	}
	closed := time.Now()
	_ = p.ws.Close(websocket.StatusGoingAway, "conformance: core restarting")
	p = fc.accept()
	if d := time.Since(closed); d > 3*time.Second {
		t.Errorf("the agent redialled %s after the session closed; the first backoff step is at most 1 s (section 4.4)", d)
	}
	fc.welcome(p, hb)
	p.awaitType(node.TypeHeartbeat)
}

// agentSizeLimit: a frame over 1 MiB is answered bad_message, non-fatal, and
// ignored (3.2).
func agentSizeLimit(t conformance.T, a *agentRun) {
	fc := a.core
	p := fc.accept()
	fc.welcome(p, hb)
	p.sendRaw([]byte(`{"v":1,"type":"ping","id":"msg_big","body":{"pad":"` + strings.Repeat("x", node.MaxMessageBytes) + `"}}`))
	p.expectError(string(abierrors.BadMessage), false, "")
	p.barrier()
	if res := fc.desire(p, fc.signed(1, fc.key)); res.Status != "ok" {
		t.Errorf("desired_state after an oversize frame answered %+v", res)
	}
}

// agentUnknown: unknown fields are ignored, an unknown type is answered
// bad_message non-fatal with re (3.4).
func agentUnknown(t conformance.T, a *agentRun) {
	fc := a.core
	p := fc.accept()
	env := p.next()
	if env.Type != node.TypeHello {
		t.Fatalf("first message %s, want hello", env.Type)
	}
	p.send(node.TypeWelcome, env.ID, map[string]any{"cluster_id": fakeClusterID, "term": 1, "heartbeat_interval_ms": hb.Milliseconds(),
		"session_timeout_ms": 15000, "server_time": time.Now().UTC(), "future_field": map[string]any{"x": 1}})
	id := p.send("future_message_type", "", map[string]any{"x": 1})
	p.expectError(string(abierrors.BadMessage), false, id)
	// An unknown member inside a signed body is covered by the signature and ignored.
	d := fc.signed(1, fc.key)
	raw, _ := json.Marshal(d)
	var m map[string]any
	_ = json.Unmarshal(raw, &m)
	delete(m, "signature")
	m["future_field"] = "ignored"
	canonical, _ := json.Marshal(m)
	sig, err := signRaw(canonical, fc.key)
	if err != nil {
		t.Fatalf("sign: %v", err)
	}
	m["signature"] = sig
	dsID := p.send(node.TypeDesiredState, "", m)
	res := p.await("command_result", func(e *node.Envelope) bool { return e.Re == dsID })
	if r := decode[node.CommandResult](t, res); res.Type != node.TypeCommandResult || r.Status != "ok" {
		t.Errorf("desired_state with an unknown member answered %s %s, want command_result ok", res.Type, res.Body)
	}
	p.barrier()
}

// agentUnsupportedVersion: an unsupported major v is answered
// unsupported_version, fatal; the agent keeps dialling (3.4, 4.4).
func agentUnsupportedVersion(t conformance.T, a *agentRun) {
	fc := a.core
	p := fc.accept()
	fc.welcome(p, hb)
	id := p.sendV(2, node.TypePing, "", struct{}{})
	p.expectError(string(abierrors.UnsupportedVersion), true, id)
	p.expectClosed(wait)
	p = fc.accept()
	fc.welcome(p, hb)
	p.awaitType(node.TypeHeartbeat)
}

// agentFirstMessage: the core's first message must be welcome; anything else
// ends the session with a fatal bad_message (4.2). The agent dials again.
func agentFirstMessage(t conformance.T, a *agentRun) {
	fc := a.core
	p := fc.accept()
	if env := p.next(); env.Type != node.TypeHello {
		t.Fatalf("first message %s, want hello", env.Type)
	}
	id := p.send(node.TypeDesiredState, "", fc.signed(1, fc.key))
	p.expectError(string(abierrors.BadMessage), true, id)
	p.expectClosed(wait)
	p = fc.accept()
	if h := fc.welcome(p, hb); h.StoredRev != 0 {
		t.Errorf("a desired_state before welcome was stored (stored_rev %d)", h.StoredRev)
	}
}

// agentBadSignature: a desired_state signed by another key is answered
// bad_signature, non-fatal, and the stored snapshot stays (5.11).
func agentBadSignature(t conformance.T, a *agentRun) {
	fc := a.core
	p := fc.accept()
	fc.welcome(p, hb)
	if res := fc.desire(p, fc.signed(1, fc.key)); res.Status != "ok" {
		t.Fatalf("rev 1: %+v", res)
	}
	_, other, _ := ed25519.GenerateKey(rand.Reader)
	id := p.send(node.TypeDesiredState, "", fc.signed(2, other))
	p.expectError(string(abierrors.BadSignature), false, id)
	tampered := fc.signed(3, fc.key)
	tampered.Rev = 4
	id = p.send(node.TypeDesiredState, "", tampered)
	p.expectError(string(abierrors.BadSignature), false, id)
	p.barrier()
	p.close()
	p = fc.accept()
	if h := fc.welcome(p, hb); h.StoredRev != 1 {
		t.Errorf("stored_rev %d after refused snapshots, want 1", h.StoredRev)
	}
}

// agentStaleRevision: a rev at or below the stored one is acknowledged and
// ignored (5.11, 6.1).
func agentStaleRevision(t conformance.T, a *agentRun) {
	fc := a.core
	p := fc.accept()
	fc.welcome(p, hb)
	for _, rev := range []int64{5, 3, 5} {
		if res := fc.desire(p, fc.signed(rev, fc.key)); res.Status != "ok" {
			t.Errorf("desired_state rev %d answered %+v, want ok", rev, res)
		}
	}
	p.close()
	p = fc.accept()
	if h := fc.welcome(p, hb); h.StoredRev != 5 {
		t.Errorf("stored_rev %d after revs 5, 3, 5; want 5", h.StoredRev)
	}
}

// agentEvents: events carry an evt_ id named by the node, schema_version 1,
// a type and a subject (5.4); the crash of a workload emits workload.crashed.
func agentEvents(t conformance.T, a *agentRun) {
	fc := a.core
	p := fc.accept()
	fc.welcome(p, hb)
	wl := node.WorkloadSpec{WorkloadID: "wl_conf_crash", ProjectID: "prj_conf", Project: "conf", ServiceID: "svc_conf", Service: "crash",
		Driver: "process", Command: []string{"sh", "-c", "exit 3"}, DesiredStatus: node.DesiredRunning}
	fc.desire(p, fc.signed(1, fc.key, wl))
	env := p.await("event workload.crashed", func(e *node.Envelope) bool { return e.Type == node.TypeEvent })
	ev := decode[node.Event](t, env)
	if !strings.HasPrefix(ev.ID, "evt_") || ev.SchemaVersion != 1 || ev.Type == "" || ev.Subject.ID == "" {
		t.Errorf("event %s lacks an evt_ id, schema_version 1, a type or a subject", env.Body)
	}
	fc.desire(p, fc.signed(2, fc.key))
	p.await("status_report without the workload", func(e *node.Envelope) bool {
		if e.Type != node.TypeStatusReport {
			return false
		}
		var r node.StatusReport
		return json.Unmarshal(e.Body, &r) == nil && r.AppliedRev == 2 && running(r) == 0
	})
}

func running(r node.StatusReport) int {
	n := 0
	for _, w := range r.Workloads {
		if w.ObservedStatus == node.StatusRunning || w.ObservedStatus == node.StatusStarting {
			n++
		}
	}
	return n
}

// agentLogDivergence: log_entries verified in order and acknowledged with the
// newest seq and hash (7.4); an entry that does not chain is answered
// bad_message; log_diverged moves the copy aside and the agent refollows
// from seq 1 (7.5).
func agentLogDivergence(t conformance.T, a *agentRun) {
	fc := a.core
	p := fc.accept()
	fc.welcome(p, hb)
	chain := buildChain(t, "a", 3)
	id := p.send(node.TypeLogEntries, "", node.LogEntries{FromSeq: 1, Entries: chain})
	ack := decode[node.LogAck](t, p.await("log_ack", func(e *node.Envelope) bool { return e.Type == node.TypeLogAck && e.Re == id }))
	if ack.Seq != 3 || ack.Hash != chain[2].Hash {
		t.Errorf("log_ack %+v, want seq 3 hash %s", ack, chain[2].Hash)
	}
	bad := buildChain(t, "b", 4)[3] // seq 4 linked to another chain
	id = p.send(node.TypeLogEntries, "", node.LogEntries{FromSeq: 4, Entries: []node.LogEntry{bad}})
	p.expectError(string(abierrors.BadMessage), false, id)
	p.close()
	p = fc.accept()
	env := p.next()
	h := decode[node.Hello](t, env)
	if h.LogSeq != 3 || h.LogHash != chain[2].Hash {
		t.Errorf("hello log position %d %q, want 3 %q (the bad entry must not be stored)", h.LogSeq, h.LogHash, chain[2].Hash)
	}
	p.send(node.TypeWelcome, env.ID, node.Welcome{ClusterID: fakeClusterID, Term: 1, HeartbeatIntervalMS: hb.Milliseconds(), SessionTimeoutMS: 15000})
	fc.desire(p, fc.signed(1, fc.key))
	p.send(node.TypeError, env.ID, node.ErrorBody{Code: string(abierrors.LogDiverged), Message: "conformance: diverged"})
	other := buildChain(t, "b", 2)
	id = p.send(node.TypeLogEntries, "", node.LogEntries{FromSeq: 1, Entries: other})
	ack = decode[node.LogAck](t, p.await("log_ack after log_diverged", func(e *node.Envelope) bool {
		return e.Type == node.TypeLogAck && e.Re == id || e.Type == node.TypeError
	}))
	if ack.Seq != 2 || ack.Hash != other[1].Hash {
		t.Errorf("after log_diverged, log_ack %+v, want seq 2 of the new chain", ack)
	}
}

// buildChain returns n entries from seq 1, their payloads marked with tag.
func buildChain(t conformance.T, tag string, n int) []node.LogEntry {
	t.Helper()
	prev := node.ZeroHash
	out := make([]node.LogEntry, 0, n)
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := 1; i <= n; i++ {
		e := node.LogEntry{Seq: int64(i), Term: 1, Time: at.Add(time.Duration(i) * time.Second), ActorType: "admin", ActorID: "tok_conf",
			EntityType: "project", EntityID: fmt.Sprintf("prj_%s%d", tag, i), Op: node.OpCreate,
			Payload: json.RawMessage(fmt.Sprintf(`{"name":"%s%d"}`, tag, i)), PrevHash: prev}
		h, err := e.ComputeHash()
		if err != nil {
			t.Fatalf("hash: %v", err)
		}
		e.Hash = h
		prev = h
		out = append(out, e)
	}
	return out
}

// agentStreams: commands are answered with re (5.17); 32 app_logs streams
// are served and the 33rd refused with stream_limit (5.15); stream_close
// ends one with stream_end cancelled (5.16).
func agentStreams(t conformance.T, a *agentRun) {
	fc := a.core
	p := fc.accept()
	fc.welcome(p, hb)
	id := p.send(node.TypeCommand, "", node.Command{Kind: node.CommandProbe})
	res := decode[node.CommandResult](t, p.await("probe answer", func(e *node.Envelope) bool { return e.Re == id }))
	if res.Status != "ok" || res.Probe == nil || len(res.Probe.Drivers) == 0 {
		t.Errorf("probe answered %+v", res)
	}
	id = p.send(node.TypeCommand, "", node.Command{Kind: node.CommandLogsQuery, Params: json.RawMessage(`{"workload_id":"wl_absent"}`)})
	res = decode[node.CommandResult](t, p.await("logs_query answer", func(e *node.Envelope) bool { return e.Re == id }))
	if res.Status != "error" || res.Error == nil || res.Error.Code != string(abierrors.NotFound) {
		t.Errorf("logs_query of an absent workload answered %+v, want error not_found", res)
	}
	wl := node.WorkloadSpec{WorkloadID: "wl_conf_logs", ProjectID: "prj_conf", Project: "conf", ServiceID: "svc_conf", Service: "logs",
		Driver: "process", Command: []string{"sh", "-c", "echo conformance; exec sleep 3600"}, DesiredStatus: node.DesiredRunning}
	fc.desire(p, fc.signed(1, fc.key, wl))
	p.await("the workload running", func(e *node.Envelope) bool {
		var r node.StatusReport
		return e.Type == node.TypeStatusReport && json.Unmarshal(e.Body, &r) == nil && running(r) == 1
	})
	params := json.RawMessage(`{"workload_id":"wl_conf_logs","tail":1}`)
	for i := 1; i <= node.MaxStreamsPerSession; i++ {
		p.send(node.TypeStreamOpen, "", node.StreamOpen{StreamID: fmt.Sprintf("str_%d", i), Kind: node.StreamAppLogs, Params: params})
	}
	// Every stream sends its tail line before the 33rd is opened.
	seen := map[string]bool{}
	for len(seen) < node.MaxStreamsPerSession {
		env := p.next()
		switch env.Type {
		case node.TypeStreamData:
			d := decode[node.StreamData](t, env)
			if d.Seq != 1 && !seen[d.StreamID] {
				t.Errorf("first stream_data of %s has seq %d, want 1", d.StreamID, d.Seq)
			}
			seen[d.StreamID] = true
		case node.TypeCommandResult, node.TypeStreamEnd, node.TypeError:
			t.Fatalf("while %d streams open: %s %s", len(seen), env.Type, env.Body)
		}
	}
	id = p.send(node.TypeStreamOpen, "", node.StreamOpen{StreamID: "str_33", Kind: node.StreamAppLogs, Params: params})
	env := p.await("the 33rd stream refused", func(e *node.Envelope) bool { return e.Re == id || e.Type == node.TypeError })
	res = decode[node.CommandResult](t, env)
	if env.Type != node.TypeCommandResult || res.Status != "error" || res.Error == nil || res.Error.Code != string(abierrors.StreamLimit) {
		t.Errorf("33rd stream_open answered %s %s, want command_result error stream_limit", env.Type, env.Body)
	}
	p.send(node.TypeStreamClose, "", node.StreamClose{StreamID: "str_1"})
	end := decode[node.StreamEnd](t, p.awaitType(node.TypeStreamEnd))
	if end.StreamID != "str_1" || end.Reason != node.StreamCancelled {
		t.Errorf("stream_end %+v, want str_1 cancelled", end)
	}
	p.send(node.TypeStreamClose, "", node.StreamClose{StreamID: "str_unknown"}) // ignored
	fc.desire(p, fc.signed(2, fc.key))
	p.await("the workload stopped", func(e *node.Envelope) bool {
		var r node.StatusReport
		return e.Type == node.TypeStatusReport && json.Unmarshal(e.Body, &r) == nil && r.AppliedRev == 2 && running(r) == 0
	})
}

// agentKeyRotate: signing_key_rotate is accepted only when signed by the
// pinned key; afterwards only the new key's signatures verify (5.21).
func agentKeyRotate(t conformance.T, a *agentRun) {
	fc := a.core
	p := fc.accept()
	fc.welcome(p, hb)
	newPub, newKey, _ := ed25519.GenerateKey(rand.Reader)
	_, stranger, _ := ed25519.GenerateKey(rand.Reader)
	rot := node.SigningKeyRotate{PublicKey: base64.StdEncoding.EncodeToString(newPub)}
	forged := rot
	if err := node.SignRotate(&forged, stranger); err != nil {
		t.Fatalf("sign: %v", err)
	}
	id := p.send(node.TypeSigningKeyRotate, "", forged)
	p.expectError(string(abierrors.BadSignature), false, id)
	if err := node.SignRotate(&rot, fc.key); err != nil {
		t.Fatalf("sign: %v", err)
	}
	id = p.send(node.TypeSigningKeyRotate, "", rot)
	env := p.await("rotation answer", func(e *node.Envelope) bool { return e.Re == id })
	if res := decode[node.CommandResult](t, env); env.Type != node.TypeCommandResult || res.Status != "ok" {
		t.Fatalf("signing_key_rotate by the pinned key answered %s %s, want command_result ok", env.Type, env.Body)
	}
	id = p.send(node.TypeDesiredState, "", fc.signed(1, fc.key))
	p.expectError(string(abierrors.BadSignature), false, id)
	if res := fc.desire(p, fc.signed(2, newKey)); res.Status != "ok" {
		t.Errorf("desired_state by the new key answered %+v", res)
	}
	// The new pin is persisted: it holds on the next session too.
	p.close()
	p = fc.accept()
	if h := fc.welcome(p, hb); h.SigningKeyID != node.KeyID(newPub) {
		t.Errorf("hello after the rotation names key %q, want the new key %s", h.SigningKeyID, node.KeyID(newPub))
	}
	if res := fc.desire(p, fc.signed(3, newKey)); res.Status != "ok" {
		t.Errorf("desired_state by the new key on a new session answered %+v", res)
	}
}

// agentRemoved: fatal node_removed stops the agent for good: it exits with
// status 78 and never dials again, now or on a later start (section 10, 13).
func agentRemoved(t conformance.T, a *agentRun) {
	fc := a.core
	p := fc.accept()
	fc.welcome(p, hb)
	p.send(node.TypeError, "", node.ErrorBody{Code: string(abierrors.NodeRemoved), Message: "conformance: removed", Fatal: true})
	select {
	case <-a.proc.done:
	case <-time.After(wait):
		t.Fatalf("the agent still runs %s after node_removed", wait)
	}
	if a.proc.code != 78 {
		t.Errorf("the agent exited %d after node_removed, want 78", a.proc.code)
	}
	a.start(t)
	select {
	case <-a.proc.done:
	case <-time.After(wait):
		t.Fatalf("a removed node's agent still runs %s after start", wait)
	}
	if a.proc.code != 78 {
		t.Errorf("a removed node's agent exited %d on start, want 78", a.proc.code)
	}
	select {
	case s := <-fc.sessions:
		s.close()
		t.Errorf("a removed node dialled again")
	default:
	}
}

func canonical(raw []byte) ([]byte, error) { return jcs.Transform(raw) }

// signRaw signs the RFC 8785 form of an unsigned JSON object.
func signRaw(unsigned []byte, key ed25519.PrivateKey) (string, error) {
	canon, err := canonical(unsigned)
	if err != nil {
		return "", err
	}
	return base64.StdEncoding.EncodeToString(ed25519.Sign(key, canon)), nil
}
