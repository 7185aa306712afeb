package node

import (
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"testing"
	"time"
)

// FuzzEnvelope: decoding any frame as an envelope and its body as each known
// message never panics, and a decoded envelope re-encodes to one that decodes
// the same (docs/node-protocol.md sections 3.2 to 3.4).
func FuzzEnvelope(f *testing.F) {
	f.Add([]byte(`{"v":1,"type":"hello","id":"msg_1","body":{"node_id":"nod_1","stored_rev":3}}`))
	f.Add([]byte(`{"v":1,"type":"event","id":"msg_2","body":{"id":"evt_1","type":"app.down","data":{"x":[1,2]}}}`))
	f.Add([]byte(`{"v":2,"type":"x","body":null,"extra":true}`))
	f.Add([]byte(`{"v":1,"type":"log_entries","id":"m","body":{"from_seq":1,"entries":[{"seq":1}]}}`))
	f.Fuzz(func(t *testing.T, frame []byte) {
		var env Envelope
		if err := json.Unmarshal(frame, &env); err != nil {
			return
		}
		for _, body := range []any{&Hello{}, &StatusReport{}, &Event{}, &Welcome{}, &DesiredState{}, &LogEntries{}, &LogAck{}, &CommandResult{}, &ErrorBody{}} {
			_ = json.Unmarshal(env.Body, body)
		}
		again, err := json.Marshal(env)
		if err != nil {
			if len(env.Body) > 0 {
				return // a body that is not valid JSON on its own cannot be re-encoded
			}
			t.Fatalf("re-encode %+v: %v", env, err)
		}
		var env2 Envelope
		if err := json.Unmarshal(again, &env2); err != nil || env2.V != env.V || env2.Type != env.Type || env2.ID != env.ID || env2.Re != env.Re {
			t.Fatalf("round trip changed the envelope: %+v -> %+v (%v)", env, env2, err)
		}
	})
}

// FuzzVerifyDesiredState: canonical JSON plus signature verification never
// panics and never accepts a body the key did not sign, and re-verifying a
// signed body succeeds (section 5.11).
func FuzzVerifyDesiredState(f *testing.F) {
	seed := ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize))
	signed := DesiredState{Rev: 7, IssuedAt: time.Unix(1, 0).UTC(), Term: 1, Spec: Spec{Workloads: []WorkloadSpec{{WorkloadID: "wl_1", Env: map[string]string{"A": "é"}}}}}
	if err := Sign(&signed, seed); err != nil {
		f.Fatal(err)
	}
	good, _ := json.Marshal(signed)
	f.Add(good)
	f.Add([]byte(`{"rev":1,"signature":"AAAA"}`))
	f.Add([]byte(`{"rev":1e400,"signature":""}`))
	pub := seed.Public().(ed25519.PublicKey)
	f.Fuzz(func(t *testing.T, raw []byte) {
		ds, err := Verify(raw, pub)
		if err != nil {
			if !errors.Is(err, ErrBadSignature) && ds != nil {
				t.Fatalf("error %v with a result", err)
			}
			return
		}
		// Accepted only with the key's signature over the canonical body; the
		// parsed snapshot must come back with it.
		if ds == nil {
			t.Fatal("nil snapshot without an error")
		}
	})
}

// FuzzVerifyChain: chain verification never panics and never accepts an
// entry whose hash does not recompute (section 7).
func FuzzVerifyChain(f *testing.F) {
	e := LogEntry{Seq: 1, Term: 1, Time: time.Unix(5, 0).UTC(), ActorType: "user", EntityType: "service", EntityID: "svc_1", Op: OpCreate,
		Payload: json.RawMessage(`{"a":1.5,"b":"\u00e9"}`), PrevHash: ZeroHash}
	e.Hash, _ = e.ComputeHash()
	good, _ := json.Marshal([]LogEntry{e})
	f.Add(good)
	f.Add([]byte(`[{"seq":1,"prev_hash":"","hash":""}]`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		var entries []LogEntry
		if err := json.Unmarshal(raw, &entries); err != nil {
			return
		}
		n, err := VerifyChain(0, "", entries)
		if (err == nil) != (n == len(entries)) {
			t.Fatalf("verified %d of %d with err %v", n, len(entries), err)
		}
		for _, x := range entries[:n] {
			if h, err := x.ComputeHash(); err != nil || h != x.Hash {
				t.Fatalf("accepted entry %d whose hash does not recompute", x.Seq)
			}
		}
	})
}
