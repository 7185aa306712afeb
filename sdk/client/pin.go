package client

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// ErrFingerprintMismatch is returned (wrapped, inside the transport error) by
// a connection made with [PinnedTLSConfig] when the server presents a
// certificate whose SHA-256 differs from the pin (docs/node-protocol.md
// section 2.2). It is not retryable: a rotated certificate needs a new pin.
var ErrFingerprintMismatch = errors.New("berth: server certificate does not match the pinned fingerprint")

// Fingerprint returns the pin of a certificate: "sha256:" followed by the 64
// lowercase hex digits of the SHA-256 of its DER encoding (docs/node-protocol.md
// section 2.2). It is what berthd writes to DATA/server-fingerprint and puts
// in join commands.
func Fingerprint(der []byte) string {
	sum := sha256.Sum256(der)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// ParseFingerprint normalises a fingerprint as an operator may paste it: an
// optional "sha256:" or "SHA256:" prefix, upper or lower case hex, colons or
// spaces between bytes. It returns the canonical form of [Fingerprint], or an
// error when what remains is not 32 bytes of hex.
func ParseFingerprint(s string) (string, error) {
	t := strings.TrimSpace(s)
	if p, ok := strings.CutPrefix(strings.ToLower(t), "sha256:"); ok {
		t = p
	}
	t = strings.NewReplacer(":", "", " ", "").Replace(strings.ToLower(t))
	raw, err := hex.DecodeString(t)
	if err != nil || len(raw) != sha256.Size {
		return "", fmt.Errorf("berth: fingerprint %q: want sha256: and 64 hex digits", s)
	}
	return "sha256:" + hex.EncodeToString(raw), nil
}

// PinnedTLSConfig returns a TLS client configuration that accepts exactly the
// certificate whose [Fingerprint] is fingerprint, whatever its names, issuer or
// validity: the pin replaces the CA system, so a self-signed berthd is as safe
// as a CA-issued one (docs/node-protocol.md sections 2.2 and 11). An empty
// fingerprint returns nil, which means the system's CA roots and the usual
// host name checks. A malformed fingerprint is an error.
func PinnedTLSConfig(fingerprint string) (*tls.Config, error) {
	if fingerprint == "" {
		return nil, nil
	}
	want, err := ParseFingerprint(fingerprint)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		// The chain is not verified against CAs; VerifyConnection checks the
		// pin on every handshake, resumed ones included.
		InsecureSkipVerify: true, //nolint:gosec // replaced by the pin check below
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return fmt.Errorf("%w: no certificate presented", ErrFingerprintMismatch)
			}
			got := Fingerprint(cs.PeerCertificates[0].Raw)
			if got != want {
				return fmt.Errorf("%w: got %s, pinned %s", ErrFingerprintMismatch, got, want)
			}
			return nil
		},
	}, nil
}

// PinnedHTTPClient returns an *http.Client whose transport pins fingerprint
// (see [PinnedTLSConfig]; empty means system CAs) and otherwise behaves like
// http.DefaultTransport. It has no overall timeout: bound calls with their ctx.
func PinnedHTTPClient(fingerprint string) (*http.Client, error) {
	cfg, err := PinnedTLSConfig(fingerprint)
	if err != nil {
		return nil, err
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = cfg
	tr.TLSHandshakeTimeout = 10 * time.Second
	return &http.Client{Transport: tr}, nil
}

// WithFingerprint makes the client accept only the server certificate whose
// SHA-256 fingerprint is fp (see [PinnedTLSConfig]); empty keeps the system
// CAs. It replaces the *http.Client, so give it before [WithHTTPClient] or
// not at all beside it. A malformed fingerprint makes [New] fail.
func WithFingerprint(fp string) Option {
	return func(c *Client) {
		if fp == "" {
			return
		}
		hc, err := PinnedHTTPClient(fp)
		if err != nil {
			c.optErr = err
			return
		}
		c.hc = hc
	}
}

// ServerFingerprint connects to the https server at server and returns the
// [Fingerprint] of the certificate it presents, without trusting it, and
// whether that certificate also verifies against the system's CA roots for
// the server's host name. It is what `berth login` shows before it pins.
func ServerFingerprint(server string, timeout time.Duration) (fp string, systemTrusted bool, err error) {
	host, err := tlsHost(server)
	if err != nil {
		return "", false, err
	}
	d := &tls.Dialer{
		NetDialer: &net.Dialer{Timeout: timeout},
		Config:    &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}, //nolint:gosec // only reads the certificate
	}
	conn, err := d.Dial("tcp", host)
	if err != nil {
		return "", false, fmt.Errorf("berth: connect to %s: %w", host, err)
	}
	defer conn.Close()
	cs := conn.(*tls.Conn).ConnectionState()
	if len(cs.PeerCertificates) == 0 {
		return "", false, fmt.Errorf("berth: %s presented no certificate", host)
	}
	leaf := cs.PeerCertificates[0]
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	name, _, err := net.SplitHostPort(host)
	if err != nil {
		return "", false, fmt.Errorf("berth: server address %s: %w", host, err)
	}
	_, verr := leaf.Verify(x509.VerifyOptions{DNSName: name, Intermediates: inter})
	return Fingerprint(leaf.Raw), verr == nil, nil
}

// tlsHost returns host:port of an https server URL (port 443 by default).
func tlsHost(server string) (string, error) {
	u, err := url.Parse(strings.TrimSpace(server))
	if err != nil {
		return "", fmt.Errorf("berth: server URL: %w", err)
	}
	if u.Scheme != "https" {
		return "", fmt.Errorf("berth: server URL %q: only https servers present a certificate", server)
	}
	if u.Port() == "" {
		return net.JoinHostPort(u.Hostname(), "443"), nil
	}
	return u.Host, nil
}
