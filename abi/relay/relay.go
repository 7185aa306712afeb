// Package relay holds the wire contract between a cluster relay and berthd: the WebSocket
// subprotocol that names the protocol version, and the header that opens every node stream.
//
// The transport is one WebSocket carrying a yamux session (docs/relay.md). The relay opens one
// stream per node connection and writes a StreamHeader first; everything after it is the node's own
// bytes, which the relay never reads.
package relay

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Subprotocol is the WebSocket subprotocol of version 1 of the relay protocol. The relay offers it
// on its dial and the core accepts it before it judges any credential; a core that does not speak it
// refuses the upgrade, and a relay that is not answered with it closes the connection.
const Subprotocol = "berth-relay.v1"

// HeaderVersion is the version of StreamHeader this package writes and reads.
const HeaderVersion = 1

// MaxHeaderSize bounds the encoded header (the JSON body, without its two length bytes). A longer
// header is refused before it is read.
const MaxHeaderSize = 1024

// Registration names the relay session a stream was opened on: the relay's process-unique id and
// the sequence of its core session, which only grows within one relay process.
type Registration struct {
	RelayID string `json:"relay_id"`
	Session uint64 `json:"session"`
}

// StreamHeader opens every stream the relay opens: which node connection it carries and under
// which registration. Encoded as a two-byte big-endian length followed by that many bytes of JSON.
type StreamHeader struct {
	Version      int          `json:"v"`
	RemoteAddr   string       `json:"remote_addr"`
	Registration Registration `json:"registration"`
}

// ErrHeaderTooLarge is returned for a header whose declared length exceeds MaxHeaderSize.
var ErrHeaderTooLarge = errors.New("relay stream header exceeds the size limit")

// ErrHeaderMalformed is returned for a header that is not a valid StreamHeader of HeaderVersion.
var ErrHeaderMalformed = errors.New("relay stream header is malformed")

// Validate reports whether h is a header this version accepts.
func (h StreamHeader) Validate() error {
	switch {
	case h.Version != HeaderVersion:
		return fmt.Errorf("%w: version %d, want %d", ErrHeaderMalformed, h.Version, HeaderVersion)
	case h.RemoteAddr == "" || len(h.RemoteAddr) > 256 || strings.ContainsAny(h.RemoteAddr, "\x00\r\n"):
		return fmt.Errorf("%w: remote address %q", ErrHeaderMalformed, h.RemoteAddr)
	case h.Registration.RelayID == "" || len(h.Registration.RelayID) > 128:
		return fmt.Errorf("%w: relay id %q", ErrHeaderMalformed, h.Registration.RelayID)
	case h.Registration.Session == 0:
		return fmt.Errorf("%w: session sequence 0", ErrHeaderMalformed)
	}
	return nil
}

// Encode returns the wire form of h: the length prefix and the JSON body.
func (h StreamHeader) Encode() ([]byte, error) {
	if err := h.Validate(); err != nil {
		return nil, err
	}
	body, err := json.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("encode relay stream header: %w", err)
	}
	if len(body) > MaxHeaderSize {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrHeaderTooLarge, len(body), MaxHeaderSize)
	}
	out := make([]byte, 2, 2+len(body))
	binary.BigEndian.PutUint16(out, uint16(len(body)))
	return append(out, body...), nil
}

// ReadHeader reads exactly one header from r and nothing after it. It refuses a zero or oversized
// length without reading the body, unknown fields, trailing bytes inside the declared length and a
// header that does not validate.
func ReadHeader(r io.Reader) (StreamHeader, error) {
	var h StreamHeader
	var lenb [2]byte
	if _, err := io.ReadFull(r, lenb[:]); err != nil {
		return h, fmt.Errorf("%w: reading its length: %w", ErrHeaderMalformed, err)
	}
	n := int(binary.BigEndian.Uint16(lenb[:]))
	if n == 0 {
		return h, fmt.Errorf("%w: empty", ErrHeaderMalformed)
	}
	if n > MaxHeaderSize {
		return h, fmt.Errorf("%w: %d bytes, limit %d", ErrHeaderTooLarge, n, MaxHeaderSize)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return h, fmt.Errorf("%w: reading %d bytes: %w", ErrHeaderMalformed, n, err)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&h); err != nil {
		return StreamHeader{}, fmt.Errorf("%w: %w", ErrHeaderMalformed, err)
	}
	if dec.More() {
		return StreamHeader{}, fmt.Errorf("%w: trailing data", ErrHeaderMalformed)
	}
	if err := h.Validate(); err != nil {
		return StreamHeader{}, err
	}
	return h, nil
}

// Header names of the upgrade request and its answer (docs/relay.md section 10).
const (
	// HeaderRegistration carries the relay's registration, one line of JSON (a Registration of
	// the session protocol, below), on every upgrade request.
	HeaderRegistration = "Berth-Relay-Registration"
	// HeaderCluster and HeaderGeneration answer an accepted upgrade: the cluster the relay's
	// credential belongs to and the credential generation the core accepted it as.
	HeaderCluster    = "Berth-Relay-Cluster"
	HeaderGeneration = "Berth-Relay-Generation"
)

// MaxRegistrationSize bounds the encoded registration header.
const MaxRegistrationSize = 1024

// RelayRegistration is what a relay tells the core about itself on each upgrade: its build, the
// node it runs on (optional), the address its node listener bound, and a sequence that only
// grows within one relay process (one per dial). The sequence of an accepted registration is
// the Session of every stream header on that session.
type RelayRegistration struct {
	RelayID  string `json:"relay_id"`
	Build    string `json:"build"`
	NodeID   string `json:"node_id,omitempty"`
	Address  string `json:"address"`
	Sequence uint64 `json:"sequence"`
}

// ErrRegistrationMalformed is returned by ParseRegistration for a header that is not one
// RelayRegistration.
var ErrRegistrationMalformed = errors.New("relay registration is malformed")

// Encode returns the header value of g.
func (g RelayRegistration) Encode() (string, error) {
	b, err := json.Marshal(g)
	if err != nil {
		return "", fmt.Errorf("encode relay registration: %w", err)
	}
	return string(b), nil
}

// ParseRegistration reads a HeaderRegistration value: exactly the fields of RelayRegistration,
// a relay id and address of at most 256 bytes, a build of at most 128, a sequence above 0.
func ParseRegistration(v string) (RelayRegistration, error) {
	var g RelayRegistration
	if v == "" || len(v) > MaxRegistrationSize {
		return g, fmt.Errorf("%w: %d bytes (1 to %d)", ErrRegistrationMalformed, len(v), MaxRegistrationSize)
	}
	dec := json.NewDecoder(strings.NewReader(v))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&g); err != nil || dec.More() {
		return RelayRegistration{}, fmt.Errorf("%w: not one JSON object of its fields", ErrRegistrationMalformed)
	}
	bad := func(s string, max int) bool { return len(s) > max || strings.ContainsAny(s, "\x00\r\n") }
	switch {
	case g.RelayID == "" || bad(g.RelayID, 128):
		return RelayRegistration{}, fmt.Errorf("%w: relay id %q", ErrRegistrationMalformed, g.RelayID)
	case g.Address == "" || bad(g.Address, 256):
		return RelayRegistration{}, fmt.Errorf("%w: address %q", ErrRegistrationMalformed, g.Address)
	case bad(g.Build, 128) || bad(g.NodeID, 128):
		return RelayRegistration{}, fmt.Errorf("%w: build or node id", ErrRegistrationMalformed)
	case g.Sequence == 0:
		return RelayRegistration{}, fmt.Errorf("%w: sequence 0", ErrRegistrationMalformed)
	}
	return g, nil
}
