// Command runner is an example Berth runner built on sdk/runner: it enrolls once, keeps its node
// credential in an owner-only file, claims operations, downloads each release artifact (verified
// by digest), stages it, reports the observation and completes (docs/runner-protocol.md section 7).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	abirunner "github.com/berthhq/berth/abi/runner"
	"github.com/berthhq/berth/sdk/runner"
)

func main() { os.Exit(run()) }

func run() int {
	var (
		server      = flag.String("server", os.Getenv("BERTH_SERVER"), "control plane URL (env BERTH_SERVER)")
		fingerprint = flag.String("fingerprint", os.Getenv("BERTH_FINGERPRINT"), "pinned server certificate fingerprint (env BERTH_FINGERPRINT)")
		node        = flag.String("node", "example-runner", "node id (the enrollment token is bound to it)")
		region      = flag.String("region", "", "region (the enrollment token is bound to it)")
		capacity    = flag.Int("capacity", 4, "capacity units this runner offers")
		labels      = flag.String("labels", "", "labels, k=v,k=v")
		dataDir     = flag.String("data-dir", "runner-data", "credential file and staged artifacts")
		concurrency = flag.Int("concurrency", 2, "operations run at once")
		once        = flag.Bool("once", false, "stop after the first completed operation")
	)
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	decl := abirunner.Declaration{Region: *region, Capacity: *capacity, Labels: map[string]string{}}
	for _, kv := range strings.Split(*labels, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			decl.Labels[k] = v
		}
	}
	c, err := runner.NewClient(runner.ClientConfig{BaseURL: *server, Fingerprint: *fingerprint})
	if err != nil {
		log.Error("client", "err", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	completed := make(chan string, 1)
	agent, err := runner.Open(ctx, runner.AgentConfig{
		Client: c, NodeID: *node, Declaration: decl,
		RegistrationToken: os.Getenv(abirunner.EnvRegistrationToken),
		Credentials:       runner.NewFileCredentials(filepath.Join(*dataDir, "credentials.json")),
		Concurrency:       *concurrency,
		Logger:            log,
		Execute: func(ctx context.Context, t *runner.Task) (json.RawMessage, error) {
			op := t.Operation
			log.Info("operation claimed", "id", op.ID, "kind", op.Kind, "fence", op.Fence, "attempt", op.Attempts)
			if t.Lifecycle() {
				// Rollback and delete: the confirmation is derived here, after the lease is
				// validated; no artifact, runtime or observation belongs to them.
				confirm, err := t.Confirmation(ctx)
				if err != nil {
					return nil, err
				}
				log.Info("lifecycle operation confirmed", "id", op.ID, "confirmation", confirm)
				return json.Marshal(map[string]any{"fence": op.Fence, "lifecycle": op.Kind})
			}
			var p abirunner.ReconcilePayload
			_ = json.Unmarshal(op.Payload, &p)
			res := map[string]any{"fence": op.Fence}
			if strings.HasPrefix(p.Release, "sha256:") {
				art, err := t.Artifact(ctx)
				if err != nil {
					return nil, fmt.Errorf("artifact: %w", err)
				}
				dir := filepath.Join(*dataDir, "staging", op.ID)
				if err := os.MkdirAll(dir, 0o700); err != nil {
					return nil, err
				}
				if err := os.WriteFile(filepath.Join(dir, "release.tar.gz"), art.Bytes, 0o600); err != nil {
					return nil, err
				}
				res["digest"], res["bytes"] = art.Digest, len(art.Bytes)
				log.Info("artifact staged", "id", op.ID, "digest", art.Digest, "bytes", len(art.Bytes))
			}
			if p.Protocol == abirunner.RuntimeProtocol {
				// The runtime holds application secrets: only its shape is logged, nothing of it
				// goes into the result.
				rt, err := t.Runtime(ctx)
				if err != nil {
					return nil, fmt.Errorf("runtime: %w", err)
				}
				log.Info("runtime received", "id", op.ID, "services", len(rt.Services), "routes", len(rt.Ingress.Routes), "node", rt.Placement.NodeID)
				res["runtime_services"] = len(rt.Services)
			}
			if p.Generation > 0 {
				if err := t.Observe(ctx, p.Generation, p.Release, p.State); err != nil {
					return nil, fmt.Errorf("observe: %w", err)
				}
			}
			select {
			case completed <- op.ID:
			default:
			}
			return json.Marshal(res)
		},
	})
	if err != nil {
		log.Error("open", "err", err)
		return 1
	}
	log.Info("runner started", "node", *node, "server", *server)
	select {
	case <-ctx.Done():
	case <-agent.Done():
	case id := <-completed:
		if !*once {
			<-ctx.Done()
		} else {
			log.Info("first operation executed; draining", "id", id)
		}
	}
	cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := agent.Close(cctx); err != nil && !errors.Is(err, context.Canceled) {
		log.Error("runner stopped", "err", err)
		return 1
	}
	return 0
}
