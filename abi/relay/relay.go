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
