package reconcile

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/crypto/curve25519"
	"golang.org/x/crypto/nacl/box"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/internal/securefile"
)

// SecretKeyFile is the node's X25519 private key under the agent's data directory (written at
// enrollment; docs/node-protocol.md section 6.6); PrevSecretKeyFile is the key a rotation
// replaced, kept so that values sealed before the core learnt the new key still open.
const (
	SecretKeyFile     = "secrets.key"
	PrevSecretKeyFile = "secrets.key.prev"
)

// RotateSecretKey makes a new X25519 key the node's secret key: written first beside the
// current one, the current one kept as PrevSecretKeyFile, then moved into place (each file
// 0600, atomically). It returns the new public key. A crash leaves either key current, and both
// on disk.
func RotateSecretKey(dataDir string) (*[32]byte, error) {
	pub, priv, err := box.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate secret key: %w", err)
	}
	defer clear(priv[:])
	cur, err := securefile.ReadFile(filepath.Join(dataDir, SecretKeyFile))
	if err == nil {
		err = securefile.WriteFile(filepath.Join(dataDir, PrevSecretKeyFile), cur)
		clear(cur)
	} else if errors.Is(err, os.ErrNotExist) {
		err = nil
	}
	if err != nil {
		return nil, fmt.Errorf("keep the previous secret key: %w", err)
	}
	if err := securefile.WriteFile(filepath.Join(dataDir, SecretKeyFile), priv[:]); err != nil {
		return nil, fmt.Errorf("write the new secret key: %w", err)
	}
	return pub, nil
}

// nodeKeys reads the node's current and previous private keys (the previous may be absent).
func nodeKeys(dataDir string) (map[string][32]byte, error) {
	out := map[string][32]byte{}
	for i, name := range []string{SecretKeyFile, PrevSecretKeyFile} {
		raw, err := securefile.ReadFile(filepath.Join(dataDir, name))
		if i > 0 && errors.Is(err, os.ErrNotExist) {
			break
		}
		if err != nil {
			return nil, err
		}
		if len(raw) != 32 {
			clear(raw)
			return nil, fmt.Errorf("%s is %d bytes, want 32", name, len(raw))
		}
		var priv [32]byte
		copy(priv[:], raw)
		clear(raw)
		p, err := curve25519.X25519(priv[:], curve25519.Basepoint)
		if err != nil {
			return nil, err
		}
		sum := sha256.Sum256(p)
		out[hex.EncodeToString(sum[:])] = priv
	}
	return out, nil
}

// ErrSecretOpen is wrapped by every failure to open a workload's secrets: the workload is then
// not started, and the message names the key, secret and version, never a value.
var ErrSecretOpen = errors.New("secret_open_failed")

// SecretsDirEnv names the environment variable that points a workload at its secret files.
const SecretsDirEnv = "BERTH_SECRETS_DIR"

// openSecrets opens the sealed secrets of spec with the node's private key, read from its file
// now (never cached), and returns the environment variables and the files they make. Errors
// wrap ErrSecretOpen: a node without its key, a value sealed to another key, one that does not
// open, or one bound to another workload, key, secret or version.
func openSecrets(dataDir string, spec *node.WorkloadSpec) (env, files map[string][]byte, err error) {
	env, files, registry, err := openAllSecrets(dataDir, spec)
	for _, v := range registry {
		clear(v)
	}
	return env, files, err
}

// openAllSecrets is openSecrets that also returns the registry pull credentials of spec
// (as "registry", by registry host), which go to the runtime driver, never to the workload.
func openAllSecrets(dataDir string, spec *node.WorkloadSpec) (env, files, registry map[string][]byte, err error) {
	if len(spec.Secrets) == 0 {
		return nil, nil, nil, nil
	}
	keys, err := nodeKeys(dataDir)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%w: workload %s: this node cannot read its secret key: %w", ErrSecretOpen, spec.WorkloadID, err)
	}
	defer func() {
		for id, k := range keys {
			clear(k[:])
			delete(keys, id)
		}
	}()
	env, files, registry = map[string][]byte{}, map[string][]byte{}, map[string][]byte{}
	fail := func(s node.WorkloadSecret, why string) error {
		for _, m := range []map[string][]byte{env, files, registry} {
			for _, v := range m {
				clear(v)
			}
		}
		return fmt.Errorf("%w: workload %s: %s (secret %s version %d): %s", ErrSecretOpen, spec.WorkloadID, s.Key, s.Secret, s.Version, why)
	}
	for _, s := range spec.Secrets {
		switch {
		case s.Version == 0:
			return nil, nil, nil, fail(s, "the secret, its version or its set does not exist")
		case s.RecipientKey == "":
			return nil, nil, nil, fail(s, "the node registered no secret key")
		case len(s.Sealed) == 0:
			return nil, nil, nil, fail(s, "the core could not seal the value")
		}
		priv, held := keys[s.RecipientKey]
		if !held {
			return nil, nil, nil, fail(s, "sealed to another node key")
		}
		p, err := curve25519.X25519(priv[:], curve25519.Basepoint)
		if err != nil {
			return nil, nil, nil, fail(s, "node secret key: "+err.Error())
		}
		var pub [32]byte
		copy(pub[:], p)
		plain, ok := box.OpenAnonymous(nil, s.Sealed, &pub, &priv)
		if !ok {
			return nil, nil, nil, fail(s, "the sealed value does not open")
		}
		value, ok := node.OpenedSecretValue(spec.WorkloadID, s, plain)
		if !ok {
			clear(plain)
			return nil, nil, nil, fail(s, "the sealed value belongs to another workload or secret")
		}
		if (s.As == "" || s.As == node.SecretAsEnv) && !node.EnvSafe(value) {
			clear(plain)
			return nil, nil, nil, fail(s, "the value holds a NUL byte or bytes that are not UTF-8, which an environment variable cannot carry; deliver it as a file")
		}
		v := append([]byte(nil), value...)
		clear(plain)
		switch s.As {
		case node.SecretAsFile:
			files[s.Key] = v
		case node.SecretAsRegistry:
			registry[s.Key] = v
		default:
			env[s.Key] = v
		}
	}
	return env, files, registry, nil
}

// writeSecretFiles replaces dir with a 0700 directory holding one 0600 file per entry of files.
func writeSecretFiles(dir string, files map[string][]byte) error {
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("%w: clear %s: %w", ErrSecretOpen, dir, err)
	}
	if len(files) == 0 {
		return nil
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("%w: create %s: %w", ErrSecretOpen, dir, err)
	}
	for name, v := range files {
		if err := securefile.WriteFile(filepath.Join(dir, name), v); err != nil {
			return fmt.Errorf("%w: write secret file %s: %w", ErrSecretOpen, name, err)
		}
	}
	return nil
}
