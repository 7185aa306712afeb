package corestore

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/berthhq/berth/abi/bindings"
	abierrors "github.com/berthhq/berth/abi/errors"
	abirunner "github.com/berthhq/berth/abi/runner"
	"github.com/berthhq/berth/plugins/corestore/backup"
	"github.com/berthhq/berth/sdk/client"
	"github.com/berthhq/berth/sdk/runner"
)

// ExecutorConfig is the part of [Config] berthd writes, never the operator: how the
// plugin's backup executor reaches berthd as a runner node (docs/backups.md section 2.1).
// It travels only in the configuration handed over after the handshake, never in argv,
// the environment or a log.
type ExecutorConfig struct {
	// URL is berthd's API base ("https://host:port"); Fingerprint pins its certificate
	// ("sha256:<hex>"; empty uses the system CAs).
	URL         string `json:"url"`
	Fingerprint string `json:"fingerprint,omitempty"`
	// NodeID is the runner node id the executor registers as; berthd queues backup,
	// restore and drill operations for it only.
	NodeID string `json:"node_id"`
	// RegistrationToken is a one-time runner enrollment (prefix bre_) the executor uses
	// when it holds no valid credential of NodeID yet; a stored credential is reused.
	RegistrationToken string `json:"registration_token"`
}

// executorCredentialFile holds the executor's runner credential in the state directory.
const executorCredentialFile = "executor.credential"

// startExecutorLocked starts the backup executor of c once per process, in the background
// ([Plugin.runExecutor]); a later Configure keeps the running one (its servers are read through p at each operation). mu must be held.
func (p *Plugin) startExecutorLocked(c *ExecutorConfig) error {
	if c == nil || p.stopWorker != nil {
		return nil
	}
	rc, err := runner.NewClient(runner.ClientConfig{BaseURL: c.URL, Fingerprint: c.Fingerprint})
	if err != nil {
		return abierrors.Wrap(abierrors.ValidationFailed, "configure executor", err)
	}
	hc, err := client.PinnedHTTPClient(c.Fingerprint)
	if err != nil {
		return abierrors.Wrap(abierrors.ValidationFailed, "configure executor", err)
	}
	var creds runner.Credentials = &runner.MemoryCredentials{}
	if p.stateDir != "" {
		creds = runner.NewFileCredentials(filepath.Join(p.stateDir, executorCredentialFile))
	}
	ctx, cancel := context.WithCancel(context.Background())
	wc := backup.WorkerConfig{
		BaseURL: c.URL, HTTP: hc, Resolve: p.resolveBackup,
		Agent: runner.AgentConfig{Client: rc, NodeID: c.NodeID, RegistrationToken: c.RegistrationToken, Credentials: creds,
			Declaration: abirunner.Declaration{Region: "local", Capacity: 1}, PollInterval: time.Second,
			OnError: func(err error) { fmt.Fprintf(os.Stderr, "[WARN] corestore executor: %v\n", err) }},
	}
	p.stopWorker = cancel
	p.workerDone = make(chan struct{})
	go p.runExecutor(ctx, wc)
	return nil
}

// runExecutor registers the executor and keeps it until ctx ends. berthd launches the plugin
// before it serves its API, so registration is retried (1 s doubling to 30 s) instead of
// failing Configure.
func (p *Plugin) runExecutor(ctx context.Context, wc backup.WorkerConfig) {
	defer close(p.workerDone)
	wait := time.Second
	for {
		w, err := backup.NewWorker(ctx, wc)
		if err == nil {
			p.mu.Lock()
			p.worker = w
			p.mu.Unlock()
			<-ctx.Done()
			dctx, done := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			_ = w.Close(dctx)
			done()
			return
		}
		if ctx.Err() != nil {
			return
		}
		fmt.Fprintf(os.Stderr, "[WARN] corestore executor: not registered yet, retrying in %v: %v\n", wait, err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, 30*time.Second)
	}
}

// stopExecutor ends the executor and waits for it to drain (at most 10 s).
func (p *Plugin) stopExecutor() {
	p.mu.Lock()
	cancel, done := p.stopWorker, p.workerDone
	p.worker, p.stopWorker = nil, nil
	p.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
}

// kindTypes maps a backup kind to the binding resource type.
var kindTypes = map[backup.Kind]string{
	backup.KindPostgres: bindings.TypePostgres, backup.KindMongoDB: bindings.TypeMongoDB, backup.KindS3: bindings.TypeS3,
}

// resolveBackup is the executor's [backup.Resolver]: the binding's database or bucket from
// the plugin's records, and an engine on the configured server with its admin credentials.
// A binding the plugin never made is not_found; a kind without a server is
// binding_unavailable.
func (p *Plugin) resolveBackup(_ context.Context, project, service, binding string, kind backup.Kind) (backup.Target, error) {
	typ, ok := kindTypes[kind]
	if !ok {
		return backup.Target{}, abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("backup kind %q", kind))
	}
	id := project + "/" + service + "/" + binding
	p.mu.Lock()
	r, cfg := p.records[typ+"/"+id], p.cfg
	p.mu.Unlock()
	if r == nil || r.Database == "" {
		return backup.Target{}, abierrors.New(abierrors.NotFound, fmt.Sprintf("binding %s (%s) was not made by this plugin", id, kind))
	}
	var e backup.Engine
	switch kind {
	case backup.KindPostgres:
		if cfg.Postgres != nil {
			u, err := url.Parse(cfg.Postgres.AdminURL)
			if err != nil {
				return backup.Target{}, abierrors.Wrap(abierrors.ValidationFailed, "postgres admin URL", err)
			}
			port, _ := strconv.Atoi(u.Port())
			pw, _ := u.User.Password()
			var st bindings.State
			_ = json.Unmarshal(r.State, &st) // written by this plugin; a record without a user restores as the admin
			e = &backup.Postgres{Host: u.Hostname(), Port: port, User: u.User.Username(), Password: pw, SSLMode: u.Query().Get("sslmode"), Owner: st.User}
		}
	case backup.KindMongoDB:
		if cfg.MongoDB != nil {
			e = &backup.MongoDB{URI: cfg.MongoDB.AdminURL}
		}
	case backup.KindS3:
		if cfg.S3 != nil {
			e = &backup.S3{Endpoint: cfg.S3.Endpoint, AccessKey: cfg.S3.AccessKey, SecretKey: cfg.S3.SecretKey, Region: cfg.S3.Region, Secure: cfg.S3.Secure}
		}
	}
	if e == nil {
		return backup.Target{}, abierrors.New(abierrors.BindingUnavailable, fmt.Sprintf("no %s server is configured", kind))
	}
	return backup.Target{Engine: e, Resource: r.Database}, nil
}
