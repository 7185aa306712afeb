package storetest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"

	"github.com/berthhq/berth/core/store"
)

// SharedURI returns a mongodb:// URI on loopback through which other processes reach the embedded
// store s with the single-connection guarantee the store relies on (DESIGN.md section 4): every
// command of every client connection is forwarded, one at a time, over one connection to s's
// FerretDB server, so FerretDB applies them in one order, as one connection would. It lets a test
// run several control-plane processes on one embedded store, standing in for the real MongoDB they
// would share in production. The listener and every forwarded connection are closed at cleanup.
// s must be embedded.
func SharedURI(t *testing.T, s *store.Store) string {
	t.Helper()
	up, err := url.Parse(s.EmbeddedURI())
	if err != nil || up.Host == "" {
		t.Fatalf("storetest: SharedURI needs an embedded store (uri %q): %v", s.EmbeddedURI(), err)
	}
	upstream, err := net.Dial("tcp", up.Host)
	if err != nil {
		t.Fatalf("storetest: connect to the embedded store: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("storetest: listen: %v", err)
	}
	p := &serialProxy{addr: up.Host, upstream: upstream, conns: map[net.Conn]struct{}{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var wg sync.WaitGroup
		for {
			c, err := ln.Accept()
			if err != nil {
				wg.Wait()
				return
			}
			p.track(c, true)
			wg.Add(1)
			go func() { defer wg.Done(); defer p.track(c, false); p.serve(c) }()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		p.closeAll()
		<-done
		_ = upstream.Close()
	})
	u := *up
	u.Host = ln.Addr().String()
	return u.String()
}

type serialProxy struct {
	addr     string     // the embedded server
	mu       sync.Mutex // serialises round trips on upstream
	upstream net.Conn

	connsMu sync.Mutex
	conns   map[net.Conn]struct{}
}

func (p *serialProxy) track(c net.Conn, add bool) {
	p.connsMu.Lock()
	defer p.connsMu.Unlock()
	if add {
		p.conns[c] = struct{}{}
	} else {
		delete(p.conns, c)
		_ = c.Close()
	}
}

func (p *serialProxy) closeAll() {
	p.connsMu.Lock()
	defer p.connsMu.Unlock()
	for c := range p.conns {
		_ = c.Close()
	}
}

const (
	opMsg       = 2013
	moreToCome  = 1 << 1
	maxWireSize = 48 << 20
)

// readMessage reads one wire-protocol message (16-byte header with its total length first).
func readMessage(r io.Reader) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.LittleEndian.Uint32(hdr[:])
	if n < 16 || n > maxWireSize {
		return nil, fmt.Errorf("storetest: wire message of %d bytes", n)
	}
	msg := make([]byte, n)
	copy(msg, hdr[:])
	_, err := io.ReadFull(r, msg[4:])
	return msg, err
}

// expectsReply reports whether the server answers msg: every message but an OP_MSG with moreToCome.
func expectsReply(msg []byte) bool {
	if binary.LittleEndian.Uint32(msg[12:16]) != opMsg || len(msg) < 20 {
		return true
	}
	return binary.LittleEndian.Uint32(msg[16:20])&moreToCome == 0
}

// serve forwards one client connection. Handshake and monitoring commands (hello, isMaster),
// which read no data and may stream replies, go over a connection of this client's own, copied
// back as a byte stream; every other command goes over the shared upstream, one at a time.
func (p *serialProxy) serve(c net.Conn) {
	var wmu sync.Mutex // serialises whole messages written to c
	var side net.Conn
	defer func() {
		if side != nil {
			_ = side.Close()
		}
	}()
	for {
		msg, err := readMessage(c)
		if err != nil {
			return
		}
		if isHello(msg) {
			if side == nil {
				if side, err = net.Dial("tcp", p.addr); err != nil {
					return
				}
				go func(side net.Conn) {
					for {
						reply, err := readMessage(side)
						if err != nil {
							_ = c.Close()
							return
						}
						wmu.Lock()
						_, err = c.Write(reply)
						wmu.Unlock()
						if err != nil {
							return
						}
					}
				}(side)
			}
			if _, err := side.Write(msg); err != nil {
				return
			}
			continue
		}
		reply, err := p.roundTrip(msg)
		if err != nil {
			return
		}
		if reply != nil {
			wmu.Lock()
			_, err = c.Write(reply)
			wmu.Unlock()
			if err != nil {
				return
			}
		}
	}
}

// isHello reports whether msg is a handshake or monitoring command: an OP_QUERY (legacy
// handshake) or an OP_MSG whose command is hello or isMaster.
func isHello(msg []byte) bool {
	const opQuery = 2004
	switch binary.LittleEndian.Uint32(msg[12:16]) {
	case opQuery:
		return true
	case opMsg:
	default:
		return false
	}
	// flags (4 bytes), section kind 0 (1 byte), document length (4 bytes), element type (1 byte),
	// then the command name as a C string.
	if len(msg) < 26 || msg[20] != 0 {
		return false
	}
	name := msg[26:]
	if i := indexZero(name); i >= 0 {
		name = name[:i]
	}
	switch string(name) {
	case "hello", "isMaster", "ismaster":
		return true
	}
	return false
}

func indexZero(b []byte) int {
	for i, c := range b {
		if c == 0 {
			return i
		}
	}
	return -1
}

func (p *serialProxy) roundTrip(msg []byte) ([]byte, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, err := p.upstream.Write(msg); err != nil {
		return nil, err
	}
	if !expectsReply(msg) {
		return nil, nil
	}
	reply, err := readMessage(p.upstream)
	if errors.Is(err, io.EOF) {
		return nil, io.ErrUnexpectedEOF
	}
	return reply, err
}
