package bindings

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/berthhq/berth/core/runners"
	"github.com/berthhq/berth/core/secrets"
)

// ExecutorNode is the runner node id of the corestore plugin's backup executor; berthd queues
// every backup, restore and drill operation for it (docs/backups.md section 2.1).
const ExecutorNode = "corestore"

// ExecutorAccess is how the corestore plugin's backup executor reaches this berthd: the runner
// registry that enrolls it, the API URL on loopback and the certificate pin.
type ExecutorAccess struct {
	Runners     *runners.Registry
	URL         string
	Fingerprint string
}

// Configure adds the "executor" object to the plugin configuration raw (a JSON object),
// replacing any the operator's file had: a fresh one-time runner enrollment of [ExecutorNode],
// valid for an hour, used only when the plugin holds no valid credential yet. The token
// travels only in this configuration (never argv or a log).
func (e ExecutorAccess) Configure(ctx context.Context, raw []byte) ([]byte, error) {
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	token, _, err := e.Runners.CreateEnrollment(ctx, ExecutorNode, "local", time.Hour)
	if err != nil {
		return nil, err
	}
	doc["executor"] = map[string]any{"url": e.URL, "fingerprint": e.Fingerprint, "node_id": ExecutorNode, "registration_token": token}
	return json.Marshal(doc)
}

// SecretPrefix marks a configuration value taken from berthd's secrets: "secret:PROJECT/NAME"
// is the current version of secret NAME of project PROJECT (docs/bindings.md section 5).
const SecretPrefix = "secret:"

// ResolveConfigSecrets replaces every string value "secret:PROJECT/NAME" of the JSON document
// raw with the secret's current value, so admin credentials need not sit in the provider's
// configuration file; projectID names a project's id by its name. A missing project or secret
// is an error naming the reference; values are never logged or quoted.
func ResolveConfigSecrets(ctx context.Context, raw []byte, sec *secrets.Store, projectID func(ctx context.Context, name string) (string, error)) ([]byte, error) {
	var doc any
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	var walk func(v any) (any, error)
	walk = func(v any) (any, error) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				r, err := walk(e)
				if err != nil {
					return nil, err
				}
				x[k] = r
			}
		case []any:
			for i, e := range x {
				r, err := walk(e)
				if err != nil {
					return nil, err
				}
				x[i] = r
			}
		case string:
			ref, ok := strings.CutPrefix(x, SecretPrefix)
			if !ok {
				return x, nil
			}
			project, name, ok := strings.Cut(ref, "/")
			if !ok {
				return nil, fmt.Errorf("%q: want secret:PROJECT/NAME", x)
			}
			pid, err := projectID(ctx, project)
			if err != nil {
				return nil, fmt.Errorf("%q: %w", x, err)
			}
			s, v, err := sec.Resolve(ctx, pid, name, 0)
			if err != nil {
				return nil, fmt.Errorf("%q: %w", x, err)
			}
			val, err := sec.Open(s, v)
			if err != nil {
				return nil, fmt.Errorf("%q: %w", x, err)
			}
			return string(val), nil
		}
		return v, nil
	}
	doc, err := walk(doc)
	if err != nil {
		return nil, err
	}
	return json.Marshal(doc)
}
