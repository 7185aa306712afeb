package session

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/node"
)

func TestCommandsAndStreamsFromTheCore(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	p, _, err := f.dial(t, f.cred)
	if err != nil {
		t.Fatal(err)
	}
	f.handshake(t, p)
	waitChange(t, f.changes, "node.connected")
	s := f.srv.Config.Handler.(*Server)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// The node answers a command; the core pairs the answer by re.
	type answer struct {
		res *node.CommandResult
		err error
	}
	got := make(chan answer, 1)
	go func() {
		res, err := s.Command(ctx, f.node.ID, node.Command{Kind: node.CommandProbe})
		got <- answer{res, err}
	}()
	env := p.next()
	for env.Type != node.TypeCommand {
		env = p.next()
	}
	p.sendEnv(node.TypeCommandResult, env.ID, node.CommandResult{Status: "ok", Detail: "probed"})
	if a := <-got; a.err != nil || a.res.Detail != "probed" {
		t.Fatalf("command answer %+v %v", a.res, a.err)
	}

	// 32 streams; the 33rd is refused by the core without reaching the node.
	var streams []*Stream
	for range node.MaxStreamsPerSession {
		st, err := s.OpenStream(ctx, f.node.ID, node.StreamAppLogs, node.LogsQuery{WorkloadID: "wl_a"})
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, st)
		if env := p.next(); env.Type != node.TypeStreamOpen {
			t.Fatalf("got %s, want stream_open", env.Type)
		}
	}
	if _, err := s.OpenStream(ctx, f.node.ID, node.StreamAppLogs, nil); !errors.Is(err, ErrStreamLimit) {
		t.Fatalf("33rd stream: %v, want stream_limit", err)
	}
	// Data reaches the stream; stream_end ends it and frees the slot.
	p.sendEnv(node.TypeStreamData, "", node.StreamData{StreamID: streams[0].ID, Seq: 1, Lines: []node.LogLine{{Stream: "output", Line: "hi"}}})
	if d := <-streams[0].Data; d.Lines[0].Line != "hi" {
		t.Fatalf("stream data %+v", d)
	}
	p.sendEnv(node.TypeStreamEnd, "", node.StreamEnd{StreamID: streams[0].ID, Reason: node.StreamCompleted})
	if _, open := <-streams[0].Data; open || streams[0].End().Reason != node.StreamCompleted {
		t.Fatalf("stream not ended: %+v", streams[0].End())
	}
	if _, err := s.OpenStream(ctx, f.node.ID, node.StreamAppLogs, nil); err != nil {
		t.Fatalf("open after a slot was freed: %v", err)
	}
}

// sendEnv sends a message with the given re.
func (p *peer) sendEnv(typ node.Type, re string, body any) {
	p.t.Helper()
	raw, _ := json.Marshal(body)
	frame, _ := json.Marshal(node.Envelope{V: 1, Type: typ, ID: "msg_peer", Re: re, Body: raw})
	p.sendRaw(frame)
}
