package relay

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
)

func TestHeaderRoundTrip(t *testing.T) {
	h := StreamHeader{Version: HeaderVersion, RemoteAddr: "192.0.2.1:51000", Registration: Registration{RelayID: "r1", Session: 3}}
	b, err := h.Encode()
	if err != nil {
		t.Fatal(err)
	}
	r := bytes.NewReader(append(b, "payload"...))
	got, err := ReadHeader(r)
	if err != nil || got != h {
		t.Fatalf("got %+v, %v", got, err)
	}
	if r.Len() != len("payload") {
		t.Fatalf("ReadHeader consumed %d bytes of the payload", len("payload")-r.Len())
	}
}

func TestHeaderRefusals(t *testing.T) {
	big := binary.BigEndian.AppendUint16(nil, MaxHeaderSize+1)
	if _, err := ReadHeader(bytes.NewReader(big)); !errors.Is(err, ErrHeaderTooLarge) {
		t.Fatalf("oversized: %v", err)
	}
	long := StreamHeader{Version: 1, RemoteAddr: "a:1", Registration: Registration{RelayID: strings.Repeat("r", 100), Session: 1}}
	if _, err := long.Encode(); err != nil {
		t.Fatalf("a valid header failed to encode: %v", err)
	}
	for name, body := range map[string]string{
		"unknown field": `{"v":1,"remote_addr":"a:1","registration":{"relay_id":"r","session":1},"x":1}`,
		"no session":    `{"v":1,"remote_addr":"a:1","registration":{"relay_id":"r"}}`,
		"trailing":      `{"v":1,"remote_addr":"a:1","registration":{"relay_id":"r","session":1}}{}`,
		"version 2":     `{"v":2,"remote_addr":"a:1","registration":{"relay_id":"r","session":1}}`,
		"no address":    `{"v":1,"registration":{"relay_id":"r","session":1}}`,
	} {
		raw := append(binary.BigEndian.AppendUint16(nil, uint16(len(body))), body...)
		if _, err := ReadHeader(bytes.NewReader(raw)); !errors.Is(err, ErrHeaderMalformed) {
			t.Errorf("%s: %v", name, err)
		}
	}
}
