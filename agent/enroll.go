package agent

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/crypto/nacl/box"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/agent/localstore"
	"github.com/berthhq/berth/sdk/client"
)

// SecretKeyFileName is the node's X25519 private key (32 raw bytes, 0600) in the data directory:
// the key workload secrets are sealed to (docs/node-protocol.md section 6.6). A copy of the data
// directory without it opens no secret.
const SecretKeyFileName = "secrets.key"

// KeyFileName is the node's Ed25519 private key (PKCS#8 PEM, 0600) in the data directory.
const KeyFileName = "node.key"

// allocatableOf is a as the enrollment request carries it.
func allocatableOf(a node.Allocatable) *client.Resources {
	return &client.Resources{CPUMilli: a.CPUMilli, MemoryMiB: a.MemoryMiB, DiskMiB: a.DiskMiB, Extended: a.Extended}
}

// EnrollConfig configures [Enroll]. Server, JoinToken and DataDir are required.
type EnrollConfig struct {
	Server    string // berthd base URL, e.g. https://berth.example.com
	JoinToken string // one-time join token (brj_...); a secret, never logged
	// Fingerprint pins berthd's TLS certificate, "sha256:<64 hex>" as the join
	// command carries it (docs/node-protocol.md section 2.2): the node refuses
	// any other certificate, now and in every later session. Empty trusts the
	// system CAs (an operator-supplied, CA-issued certificate).
	Fingerprint string
	DataDir     string            // the agent's data directory; created 0700 when absent
	Labels      map[string]string // node labels; nil means none
	Region      string            // empty means none
	// Address is the host address workloads bind to, where the gateway and other nodes reach
	// them. Empty means 127.0.0.1 (one machine); [AddressAuto] means the address this host
	// uses to reach Server (the source address its routing table picks).
	Address  string
	Hostname string // empty means os.Hostname()
	// Resources are the extended resources declared and what the host keeps,
	// as for [Config.Resources]; reported at enrollment as the node's
	// allocatable capacity.
	Resources Resources
	// HTTPClient sends the enroll request; nil means the client package default.
	HTTPClient *http.Client
	Logger     *slog.Logger     // nil means slog.Default()
	Now        func() time.Time // nil means time.Now
}

// AddressAuto as [EnrollConfig.Address] asks Enroll to pick the node's address itself: the
// source address of this host's route to berthd (docs/joining.md section 3).
const AddressAuto = "auto"

// SourceAddress returns the local IP address this host would send from to reach the host of
// server (a URL; its port, 443 by default): the routing table's choice, found by connecting a
// UDP socket, which sends nothing. Errors: a server URL without a host, a name that does not
// resolve, no route.
func SourceAddress(ctx context.Context, server string) (string, error) {
	u, err := url.Parse(server)
	if err != nil || u.Hostname() == "" {
		return "", fmt.Errorf("server %q is not a URL with a host", server)
	}
	port := u.Port()
	if port == "" {
		port = "443"
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "udp", net.JoinHostPort(u.Hostname(), port))
	if err != nil {
		return "", fmt.Errorf("find the address this host reaches %s from: %w", u.Host, err)
	}
	defer c.Close()
	ip := c.LocalAddr().(*net.UDPAddr).IP
	if ip.IsUnspecified() {
		return "", fmt.Errorf("no source address toward %s", u.Host)
	}
	return ip.String(), nil
}

// Enroll enrolls this machine once (docs/node-protocol.md section 2): it
// generates the node's Ed25519 key (written 0600 to DataDir/node.key), detects
// capacity, calls POST /api/v1/nodes/enroll with the join token, and stores the
// node id, credential, pinned cluster key and server URL in the local store. It
// returns the node id. It refuses, with an error wrapping
// [localstore.ErrAlreadyEnrolled], a data directory that is already enrolled.
func Enroll(ctx context.Context, cfg EnrollConfig) (string, error) {
	if cfg.Server == "" || cfg.JoinToken == "" || cfg.DataDir == "" {
		return "", errors.New("enroll: server, join token and data directory are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	switch cfg.Address {
	case "":
		cfg.Address = "127.0.0.1"
	case AddressAuto:
		a, err := SourceAddress(ctx, cfg.Server)
		if err != nil {
			return "", fmt.Errorf("enroll: --address auto: %w", err)
		}
		cfg.Address = a
		cfg.Logger.Info("node address chosen: the one this host reaches berthd from", "address", a)
	}
	if cfg.Hostname == "" {
		h, err := os.Hostname()
		if err != nil {
			return "", fmt.Errorf("enroll: hostname: %w", err)
		}
		cfg.Hostname = h
	}
	dir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return "", fmt.Errorf("enroll: data directory: %w", err)
	}
	if err := ensurePrivateDir(dir); err != nil {
		return "", fmt.Errorf("enroll: %w", err)
	}
	store, err := localstore.Open(ctx, filepath.Join(dir, localstore.FileName))
	if err != nil {
		return "", fmt.Errorf("enroll: %w", err)
	}
	defer func() { _ = store.Close() }()
	if id, err := store.Identity(ctx); err == nil {
		return "", fmt.Errorf("enroll: data directory %[1]s is already enrolled as %[2]s; to start over, stop any berth-agent run on it, "+
			"remove the node (berth node remove %[2]s), then delete %[1]s or pick a fresh --data-dir and enroll with a new join command: %[3]w",
			dir, id.NodeID, localstore.ErrAlreadyEnrolled)
	} else if !errors.Is(err, localstore.ErrNotEnrolled) {
		return "", fmt.Errorf("enroll: %w", err)
	}

	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", fmt.Errorf("enroll: generate node key: %w", err)
	}
	keyPath := filepath.Join(dir, KeyFileName)
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return "", fmt.Errorf("enroll: encode node key: %w", err)
	}
	if err := writePrivateFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})); err != nil {
		return "", fmt.Errorf("enroll: write node key: %w", err)
	}

	boxPub, boxPriv, err := box.GenerateKey(rand.Reader)
	if err != nil {
		return "", fmt.Errorf("enroll: generate node secret key: %w", err)
	}
	err = writePrivateFile(filepath.Join(dir, SecretKeyFileName), boxPriv[:])
	clear(boxPriv[:])
	if err != nil {
		return "", fmt.Errorf("enroll: write node secret key: %w", err)
	}

	pin := ""
	if cfg.Fingerprint != "" {
		if pin, err = client.ParseFingerprint(cfg.Fingerprint); err != nil {
			return "", fmt.Errorf("enroll: %w", err)
		}
	}
	opts := []client.Option{client.WithFingerprint(pin)}
	if cfg.HTTPClient != nil {
		opts = append(opts, client.WithHTTPClient(cfg.HTTPClient))
	}
	cl, err := client.New(cfg.Server, opts...)
	if err != nil {
		return "", fmt.Errorf("enroll: %w", err)
	}
	capacity := DetectCapacity()
	resp, err := cl.Enroll(ctx, client.EnrollRequest{
		JoinToken:    cfg.JoinToken,
		PublicKey:    base64.StdEncoding.EncodeToString(pub),
		BoxPublicKey: base64.StdEncoding.EncodeToString(boxPub[:]),
		Hostname:     cfg.Hostname,
		Region:       cfg.Region,
		Labels:       cfg.Labels,
		Address:      cfg.Address,
		Capacity:     client.Capacity{CPUs: capacity.CPUs, MemoryMB: capacity.MemoryMB},
		Allocatable:  allocatableOf(Allocatable(dir, cfg.Resources)),
	})
	if err != nil {
		return "", fmt.Errorf("enroll: %w", err)
	}
	if resp.NodeID == "" || resp.Credential == "" {
		return "", errors.New("enroll: the server answered without a node id or credential")
	}
	if _, err := parseClusterKey(resp.ClusterPublicKey); err != nil {
		return "", fmt.Errorf("enroll: %w", err)
	}
	if pin != "" {
		// Stored before the identity: an identity without its pin would
		// make the agent trust the system CAs instead.
		if err := store.SetMeta(ctx, localstore.MetaServerFingerprint, pin); err != nil {
			return "", fmt.Errorf("enroll: %w", err)
		}
	}
	if err := store.SaveIdentity(ctx, localstore.Identity{
		NodeID:           resp.NodeID,
		Credential:       resp.Credential,
		ClusterPublicKey: resp.ClusterPublicKey,
		ClusterID:        resp.ClusterID,
		ServerURL:        cl.Server(),
		PrivateKeyPath:   keyPath,
		Address:          cfg.Address,
		Hostname:         cfg.Hostname,
		EnrolledAt:       cfg.Now(),
	}); err != nil {
		return "", fmt.Errorf("enroll: %w", err)
	}
	cfg.Logger.Info("node enrolled", "node_id", resp.NodeID, "cluster_id", resp.ClusterID, "server", cl.Server())
	return resp.NodeID, nil
}

func parseClusterKey(b64 string) (ed25519.PublicKey, error) {
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return nil, fmt.Errorf("cluster public key is not base64: %w", err)
	}
	if len(raw) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("cluster public key has %d bytes, want %d", len(raw), ed25519.PublicKeySize)
	}
	return ed25519.PublicKey(raw), nil
}

// ensurePrivateDir creates dir 0700 (and its parents) and refuses a symlink or
// a directory others can read.
func ensurePrivateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create data directory: %w", err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("data directory: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("data directory %s is not a directory", dir)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("restrict data directory: %w", err)
		}
	}
	return nil
}

// writePrivateFile writes data to path owner-only, atomically: temp file, fsync, rename.
func writePrivateFile(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(f.Name()) }()
	if err := f.Chmod(0o600); err != nil {
		_ = f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
