package slots

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"unicode/utf8"

	"github.com/gowebpki/jcs"
)

// keyDomain separates attempt keys from every other digest Berth computes; it changes only with a
// new key layout (docs/reconciliation.md section 2).
const keyDomain = "berth.slot-attempt-key.v1"

// attemptDomain separates attempt ids from attempt keys.
const attemptDomain = "berth.slot-attempt-id.v1"

// KeyInput is everything a slot's desired attempt key covers (docs/reconciliation.md section 2): the
// values come from the store alone, so a commit can recompute the key under its own compare-and-set.
type KeyInput struct {
	// ReleaseDigest is the content digest of what runs: the bundle's or image's "sha256:<hex>".
	ReleaseDigest string
	// SpecRevision is the runtime spec revision the desire derives from (1 or more).
	SpecRevision int64
	// Env is the composed environment of the service; nil and empty are the same. The canonical
	// encoding sorts it by name, so map order never changes the key.
	Env map[string]string
	// Platform is the node's platform, "<os>/<arch>" (for example "linux/amd64").
	Platform string
	// NetworkMode is the spec's network mode ([NetworkHost] or [NetworkIsolated]).
	NetworkMode NetworkMode
	// Invocation is a digest of everything else the service document says its workloads run that
	// the release does not pin (driver, command, ports, image user, health check), so editing one
	// of them is a drift too; "" when the release pins all of it.
	Invocation string
	// Restart is the service's restart generation (`berth rollout restart`): a new one is a new
	// key, so every replica is replaced under the rollout's bounds. Zero leaves the key as it
	// was before restarts existed.
	Restart int64
}

// DesiredAttemptKey returns "sha256:<64 hex>" over the RFC 8785 canonical JSON of in, prefixed by a
// domain tag (docs/reconciliation.md section 2). Equal inputs give equal keys on every machine; a
// change of any field (one environment value included) gives another key, which the decision table
// reads as drift. It refuses an environment name or value that is not valid UTF-8 (the canonical
// form would otherwise fold distinct byte strings together).
func DesiredAttemptKey(in KeyInput) (string, error) {
	env := in.Env
	if env == nil {
		env = map[string]string{}
	}
	for k, v := range env {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return "", fmt.Errorf("attempt key: environment variable %q is not valid UTF-8", k)
		}
	}
	type fields struct {
		Domain       string            `json:"domain"`
		Release      string            `json:"release_digest"`
		SpecRevision int64             `json:"spec_revision"`
		Env          map[string]string `json:"env"`
		Platform     string            `json:"platform"`
		Network      NetworkMode       `json:"network_mode"`
		Invocation   string            `json:"invocation"`
	}
	f := fields{keyDomain, in.ReleaseDigest, in.SpecRevision, env, in.Platform, in.NetworkMode, in.Invocation}
	if in.Restart == 0 {
		return digest(f)
	}
	return digest(struct {
		fields
		Restart int64 `json:"restart"`
	}{f, in.Restart})
}

// AttemptID returns the id of the attempt that runs key as the successor of the attempt
// predecessor ("" for a slot's first run): "att_<64 hex>" over the canonical JSON of both
// (docs/reconciliation.md section 2). Recomputing it from an incumbent's own stored predecessor
// and the current desired key yields the incumbent's id exactly while the desire has not moved.
func AttemptID(key, predecessor string) (string, error) {
	d, err := digest(struct {
		Domain      string `json:"domain"`
		Key         string `json:"key"`
		Predecessor string `json:"predecessor"`
	}{attemptDomain, key, predecessor})
	if err != nil {
		return "", err
	}
	return "att_" + d[len("sha256:"):], nil
}

func digest(v any) (string, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("encode attempt key input: %w", err)
	}
	canon, err := jcs.Transform(raw)
	if err != nil {
		return "", fmt.Errorf("canonicalize attempt key input: %w", err)
	}
	sum := sha256.Sum256(canon)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}
