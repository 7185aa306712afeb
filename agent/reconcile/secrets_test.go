package reconcile

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/nacl/box"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/abi/runtime"
)

// sealFor seals value for workload id and entry e to pub, as the core does.
func sealFor(t *testing.T, pub *[32]byte, id string, e node.WorkloadSecret, value string) node.WorkloadSecret {
	t.Helper()
	sum := sha256.Sum256(pub[:])
	e.RecipientKey = hex.EncodeToString(sum[:])
	s, err := box.SealAnonymous(nil, node.SealedSecretPlaintext(id, e, []byte(value)), pub, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	e.Sealed = s
	return e
}

func nodeKey(t *testing.T, dir string) *[32]byte {
	t.Helper()
	pub, priv, err := box.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, SecretKeyFile), priv[:], 0o600); err != nil {
		t.Fatal(err)
	}
	return pub
}

// TestOpenSecrets opens well-sealed values and refuses, naming key, secret and version but no
// value, every value sealed wrong: to another node, tampered, bound to another workload or key,
// unresolved by the core, and on a node whose data directory lacks the private key.
func TestOpenSecrets(t *testing.T) {
	dir := t.TempDir()
	pub := nodeKey(t, dir)
	const id = "wl_1"
	good := []node.WorkloadSecret{
		sealFor(t, pub, id, node.WorkloadSecret{Key: "DB_URL", As: node.SecretAsEnv, Secret: "db", Version: 3}, "pg://value-one"),
		sealFor(t, pub, id, node.WorkloadSecret{Key: "TLS_KEY", As: node.SecretAsFile, Secret: "tls", Version: 1}, "value-two"),
	}
	env, files, err := openSecrets(dir, &node.WorkloadSpec{WorkloadID: id, Secrets: good})
	if err != nil || string(env["DB_URL"]) != "pg://value-one" || string(files["TLS_KEY"]) != "value-two" || len(env) != 1 || len(files) != 1 {
		t.Fatalf("openSecrets = %q %q %v", env, files, err)
	}

	otherPub, _, _ := box.GenerateKey(rand.Reader)
	flipped := good[0]
	flipped.Sealed = bytes.Clone(flipped.Sealed)
	flipped.Sealed[len(flipped.Sealed)-1] ^= 1
	swapped := good[0]
	swapped.Sealed = good[1].Sealed // another key's value under this entry
	otherVersion := good[0]
	otherVersion.Version = 2
	bad := map[string]node.WorkloadSecret{
		"another node's key": sealFor(t, otherPub, id, node.WorkloadSecret{Key: "DB_URL", As: "env", Secret: "db", Version: 3}, "pg://value-one"),
		"flipped byte":       flipped,
		"swapped values":     swapped,
		"another version":    otherVersion,
		"another workload":   sealFor(t, pub, "wl_2", node.WorkloadSecret{Key: "DB_URL", As: "env", Secret: "db", Version: 3}, "pg://value-one"),
		"unresolved":         {Key: "DB_URL", As: "env", Secret: "db"},
		"not sealed":         {Key: "DB_URL", As: "env", Secret: "db", Version: 3, RecipientKey: good[0].RecipientKey},
	}
	for name, e := range bad {
		t.Run(name, func(t *testing.T) {
			env, files, err := openSecrets(dir, &node.WorkloadSpec{WorkloadID: id, Secrets: []node.WorkloadSecret{good[1], e}})
			if !errors.Is(err, ErrSecretOpen) || env != nil || files != nil {
				t.Fatalf("openSecrets = %q %q %v; want nothing and ErrSecretOpen", env, files, err)
			}
			if !strings.Contains(err.Error(), "DB_URL") || strings.Contains(err.Error(), "value-") {
				t.Fatalf("error %q should name the key and carry no value", err)
			}
		})
	}
	t.Run("data directory copied without its key", func(t *testing.T) {
		copyDir := t.TempDir() // everything but secrets.key
		if _, _, err := openSecrets(copyDir, &node.WorkloadSpec{WorkloadID: id, Secrets: good}); !errors.Is(err, ErrSecretOpen) {
			t.Fatalf("openSecrets without the key = %v", err)
		}
		// Another node's key in its place opens nothing either.
		nodeKey(t, copyDir)
		if _, _, err := openSecrets(copyDir, &node.WorkloadSpec{WorkloadID: id, Secrets: good}); !errors.Is(err, ErrSecretOpen) {
			t.Fatalf("openSecrets with another key = %v", err)
		}
	})
	t.Run("rotation keeps the previous key", func(t *testing.T) {
		rdir := t.TempDir()
		old := nodeKey(t, rdir)
		e := sealFor(t, old, id, node.WorkloadSecret{Key: "A", As: "env", Secret: "a", Version: 1}, "value-old")
		next, err := RotateSecretKey(rdir)
		if err != nil {
			t.Fatal(err)
		}
		n := sealFor(t, next, id, node.WorkloadSecret{Key: "B", As: "env", Secret: "b", Version: 1}, "value-new")
		if env, _, err := openSecrets(rdir, &node.WorkloadSpec{WorkloadID: id, Secrets: []node.WorkloadSecret{e, n}}); err != nil || string(env["A"]) != "value-old" || string(env["B"]) != "value-new" {
			t.Fatalf("after one rotation both keys open: %v", err)
		}
		if _, err := RotateSecretKey(rdir); err != nil {
			t.Fatal(err)
		}
		if _, _, err := openSecrets(rdir, &node.WorkloadSpec{WorkloadID: id, Secrets: []node.WorkloadSecret{e}}); !errors.Is(err, ErrSecretOpen) {
			t.Fatalf("a value sealed two keys ago = %v, want ErrSecretOpen", err)
		}
	})
	t.Run("files", func(t *testing.T) {
		sd := filepath.Join(t.TempDir(), "secrets")
		if err := writeSecretFiles(sd, files); err != nil {
			t.Fatal(err)
		}
		di, err := os.Stat(sd)
		if err != nil || di.Mode().Perm() != 0o700 {
			t.Fatalf("secret dir mode %v %v", di.Mode().Perm(), err)
		}
		fi, err := os.Stat(filepath.Join(sd, "TLS_KEY"))
		got, _ := os.ReadFile(filepath.Join(sd, "TLS_KEY"))
		if err != nil || fi.Mode().Perm() != 0o600 || string(got) != "value-two" {
			t.Fatalf("secret file mode %v content ok %v err %v", fi.Mode().Perm(), string(got) == "value-two", err)
		}
		if err := writeSecretFiles(sd, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(sd); !os.IsNotExist(err) {
			t.Fatalf("secret dir left after the workload dropped its files: %v", err)
		}
	})
}

// TestRegistryPullSecretGoesToTheDriverOnly: a secret delivered as "registry" for the image's
// registry host reaches the driver as that host's pull credential and not the workload's
// environment; the node's own credential serves Berth's registry host, and an image on another
// host gets nothing.
func TestRegistryPullSecretGoesToTheDriverOnly(t *testing.T) {
	h := newHarness(t)
	pub := nodeKey(t, h.dir)
	l, err := New(Config{Store: h.store, Driver: h.drv, DataDir: h.dir, Now: h.clk.Now,
		Registry: &runtime.RegistryCredential{Host: "berth.example:7070", Username: "node", Secret: "brn_node"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.cfg.Prober.Close)
	pinned := "@sha256:" + strings.Repeat("a", 64)
	pull := sealFor(t, pub, "wl_ext", node.WorkloadSecret{Key: "ghcr.io", As: node.SecretAsRegistry, Secret: "ghcr-pull", Version: 1}, "ci:ghp_pull-value")
	h.desire(spec("wl_ext", func(s *node.WorkloadSpec) {
		s.Image = "ghcr.io/acme/app" + pinned
		s.Secrets = []node.WorkloadSecret{pull}
	}))
	if err := h.pass(l); err != nil {
		t.Fatal(err)
	}
	req := h.mem.lastStart()
	if len(req.RegistryCredentials) != 1 || req.RegistryCredentials[0] != (runtime.RegistryCredential{Host: "ghcr.io", Username: "ci", Secret: "ghp_pull-value"}) {
		t.Errorf("credentials of the external image = %v", req.RegistryCredentials)
	}
	for k, v := range req.Env {
		if strings.Contains(v, "ghp_pull-value") || k == "ghcr.io" {
			t.Errorf("the pull secret reached the workload's environment as %s", k)
		}
	}
	for _, tc := range []struct {
		image string
		want  []runtime.RegistryCredential
	}{
		{"berth.example:7070/shop/web" + pinned, []runtime.RegistryCredential{*l.cfg.Registry}},
		{"quay.io/acme/app" + pinned, nil},
		{"library/busybox" + pinned, nil},
	} {
		s := spec("wl_x", func(s *node.WorkloadSpec) { s.Image = tc.image })
		got := l.registryCredentials(&s, "", map[string][]byte{"ghcr.io": []byte("ci:x")})
		if len(got) != len(tc.want) || (len(got) == 1 && got[0] != tc.want[0]) {
			t.Errorf("credentials of %s = %v, want %v", tc.image, got, tc.want)
		}
	}
	if got := l.registryCredentials(&node.WorkloadSpec{Image: "busybox" + pinned}, "", map[string][]byte{"docker.io": []byte("u:p")}); len(got) != 1 || got[0].Host != "docker.io" {
		t.Errorf("a Docker Hub image without a host = %v; want the docker.io credential", got)
	}
}

// TestCoreImagePulledThroughTheRelay: a node that reaches the core through a relay (its
// registry credential's host is the relay's) pulls an image of the core's registry
// (node.Spec.RegistryHost) from the relay, with its own credential and the same digest; an image
// of another registry is pulled as named, and a node dialling the core directly pulls from it.
func TestCoreImagePulledThroughTheRelay(t *testing.T) {
	h := newHarness(t)
	relay := runtime.RegistryCredential{Host: "relay.example:7443", Username: "node", Secret: "brn_node"}
	l, err := New(Config{Store: h.store, Driver: h.drv, DataDir: h.dir, Now: h.clk.Now, Registry: &relay})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.cfg.Prober.Close)
	pinned := "@sha256:" + strings.Repeat("b", 64)
	h.desireSpec(node.Spec{RegistryHost: "core.example:8443", Workloads: []node.WorkloadSpec{
		spec("wl_core", func(s *node.WorkloadSpec) { s.Image = "core.example:8443/shop/web" + pinned })}})
	if err := h.pass(l); err != nil {
		t.Fatal(err)
	}
	req := h.mem.lastStart()
	if req.Image != "relay.example:7443/shop/web"+pinned || len(req.RegistryCredentials) != 1 || req.RegistryCredentials[0] != relay {
		t.Fatalf("start of a core image on a relayed node: image %s, credentials %v", req.Image, req.RegistryCredentials)
	}
	for _, tc := range []struct{ core, image, want string }{
		{"core.example:8443", "quay.io/acme/app" + pinned, "quay.io/acme/app" + pinned},
		{"relay.example:7443", "relay.example:7443/shop/web" + pinned, "relay.example:7443/shop/web" + pinned},
		{"", "core.example:8443/shop/web" + pinned, "core.example:8443/shop/web" + pinned},
		{"core.example:8443", "core.example:84431/shop/web" + pinned, "core.example:84431/shop/web" + pinned},
	} {
		l.mu.Lock()
		l.registryHost = tc.core
		l.mu.Unlock()
		if got := l.pullRef(tc.image); got != tc.want {
			t.Errorf("pullRef(%s) with the core at %q = %s, want %s", tc.image, tc.core, got, tc.want)
		}
	}
}

// TestSecretBytesReachFilesExactly: every byte value 0x00..0xff sealed as a file opens and is
// written exactly; as an environment variable a NUL byte cannot be carried, so the workload is
// refused with an error naming the key (the core refuses such a reference already; this is the
// node's own check for a value that got past it).
func TestSecretBytesReachFilesExactly(t *testing.T) {
	dir := t.TempDir()
	pub := nodeKey(t, dir)
	const id = "wl_1"
	every := make([]byte, 256)
	for i := range every {
		every[i] = byte(i)
	}
	file := sealFor(t, pub, id, node.WorkloadSecret{Key: "BIN", As: node.SecretAsFile, Secret: "bin", Version: 1}, string(every))
	_, files, err := openSecrets(dir, &node.WorkloadSpec{WorkloadID: id, Secrets: []node.WorkloadSecret{file}})
	if err != nil || !bytes.Equal(files["BIN"], every) {
		t.Fatalf("openSecrets = %x %v; want every byte value", files["BIN"], err)
	}
	sd := filepath.Join(t.TempDir(), "secrets")
	if err := writeSecretFiles(sd, files); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(sd, "BIN")); err != nil || !bytes.Equal(got, every) {
		t.Fatalf("secret file holds %x %v; want every byte value", got, err)
	}
	env := sealFor(t, pub, id, node.WorkloadSecret{Key: "BIN_ENV", As: node.SecretAsEnv, Secret: "bin", Version: 1}, string(every))
	e, f, err := openSecrets(dir, &node.WorkloadSpec{WorkloadID: id, Secrets: []node.WorkloadSecret{file, env}})
	if !errors.Is(err, ErrSecretOpen) || e != nil || f != nil || !strings.Contains(err.Error(), "BIN_ENV") || !strings.Contains(err.Error(), "NUL") {
		t.Fatalf("a NUL byte for an environment variable: %v; want ErrSecretOpen naming BIN_ENV and the NUL byte", err)
	}
	// Bytes that are not UTF-8 cannot cross the driver contract's protobuf strings either.
	high := sealFor(t, pub, id, node.WorkloadSecret{Key: "HIGH", As: node.SecretAsEnv, Secret: "high", Version: 1}, string(every[1:]))
	if _, _, err := openSecrets(dir, &node.WorkloadSpec{WorkloadID: id, Secrets: []node.WorkloadSecret{high}}); !errors.Is(err, ErrSecretOpen) || !strings.Contains(err.Error(), "HIGH") {
		t.Fatalf("bytes that are not UTF-8 for an environment variable: %v; want ErrSecretOpen naming HIGH", err)
	}
	text := sealFor(t, pub, id, node.WorkloadSecret{Key: "TEXT", As: node.SecretAsEnv, Secret: "text", Version: 1}, "grüße\x01\x7f")
	if e, _, err := openSecrets(dir, &node.WorkloadSpec{WorkloadID: id, Secrets: []node.WorkloadSecret{text}}); err != nil || string(e["TEXT"]) != "grüße\x01\x7f" {
		t.Fatalf("openSecrets = %q %v", e["TEXT"], err)
	}
}
