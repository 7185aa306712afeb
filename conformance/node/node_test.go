package node

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"flag"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/coder/websocket"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/conformance"
)

// brokenAgentEnv makes the test binary act as a deliberately broken agent:
// it enrolls by remembering the server and, once running, opens every
// session with an event instead of hello (docs/node-protocol.md section 4.2).
const brokenAgentEnv = "BERTH_CONFORMANCE_BROKEN_AGENT"

func TestMain(m *testing.M) {
	if os.Getenv(brokenAgentEnv) == "1" {
		os.Exit(brokenAgent(os.Args[1:]))
	}
	os.Exit(m.Run())
}

func brokenAgent(args []string) int {
	if len(args) == 0 {
		return 2
	}
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	server := fs.String("server", "", "")
	dir := fs.String("data-dir", "", "")
	fs.String("join-token", "", "")
	fs.String("fingerprint", "", "")
	fs.String("hostname", "", "")
	fs.String("plugin-dir", "", "")
	if err := fs.Parse(args[1:]); err != nil {
		return 78
	}
	file := filepath.Join(*dir, "server")
	if args[0] == "enroll" {
		if err := os.MkdirAll(*dir, 0o700); err != nil {
			return 1
		}
		if err := os.WriteFile(file, []byte(*server), 0o600); err != nil {
			return 1
		}
		return 0
	}
	raw, err := os.ReadFile(file)
	if err != nil {
		return 78
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} // a test double on loopback
	u := "wss" + strings.TrimPrefix(string(raw), "https") + "/api/v1/nodes/session"
	for ctx.Err() == nil {
		ws, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: hc,
			HTTPHeader: http.Header{"Authorization": {"Bearer " + fakeCredential}}})
		if err != nil {
			return 1
		}
		body, _ := json.Marshal(node.Event{SchemaVersion: 1, ID: "evt_broken", Type: "broken"})
		frame, _ := json.Marshal(node.Envelope{V: 1, Type: node.TypeEvent, ID: "msg_broken", Body: body})
		_ = ws.Write(ctx, websocket.MessageText, frame)
		for {
			if _, _, err := ws.Read(ctx); err != nil {
				break
			}
		}
		_ = ws.CloseNow()
	}
	return 0
}

// TestSuiteFailsOnBrokenAgent proves the agent-direction suite fails an
// agent that breaks the handshake, case by case. The suite's pass on the
// real agent runs in e2e (TestNodeConformance), against the built binaries.
func TestSuiteFailsOnBrokenAgent(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(brokenAgentEnv, "1")
	// Three cases keep it quick (each starts the test binary twice).
	var cases []conformance.Case
	for _, c := range AgentCases(AgentConfig{Binary: exe}) {
		switch c.Name {
		case "agent/handshake_order", "agent/stale_revision", "agent/node_removed":
			cases = append(cases, c)
		}
	}
	report := conformance.CheckCases(t.Context(), "node-agent", exe, cases)
	failed := map[string]bool{}
	for _, n := range report.Failed() {
		failed[n] = true
	}
	if len(cases) != 3 {
		t.Fatalf("%d cases selected, want 3", len(cases))
	}
	for _, c := range cases {
		if !failed[c.Name] {
			t.Errorf("case %s passed on an agent whose first message is not hello", c.Name)
		}
	}
	if t.Failed() {
		var b strings.Builder
		_ = report.WriteText(&b)
		t.Log(b.String())
	}
}
