package store

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
	"net"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// FerretWriteBatch is the most statements one insert, update or delete command carries when the
// server is FerretDB (docs/store.md section 2.1). FerretDB v1 keeps each update statement's
// cursor open until its command ends and has 100 SQLite connections, so an update or upsert
// command of 100 statements (measured: 90 finish, 100 never do) waits for a connection for good
// and stalls the store; 64 leaves room for the read view's connections and FerretDB's own. It
// must also stay at most FerretDB's insert batch (100 documents): an ordered insert command of
// more than that goes on with the next 100 after a duplicate key. Larger writes are split by the
// driver into commands of at most this many statements, sent in order.
const FerretWriteBatch = 64

// maxWireMessage bounds one wire-protocol message read from the server: FerretDB announces
// 48,000,000 bytes as its maximum.
const maxWireMessage = 64 << 20

// Wire-protocol opcodes and OP_MSG flags the batch cap reads.
const (
	opReply         = 1
	opMsg           = 2013
	checksumPresent = 1 << 0
)

// batchCapDialer dials TCP like the driver's default dialer and hands out connections whose
// hello replies announce at most limit as maxWriteBatchSize. The driver splits every
// InsertMany, BulkWrite, insert, update and delete into commands of at most the announced size
// (one command per batch, on one connection, in order); an ordered write stops at the first
// batch that reports an error and the driver offsets the statement indexes of later batches, so
// callers see the BulkWriteResult and BulkWriteException a single command would have given.
type batchCapDialer struct {
	d     net.Dialer
	limit int32
}

func newBatchCapDialer(limit int32) *batchCapDialer { return &batchCapDialer{limit: limit} }

// DialContext implements options.ContextDialer.
func (d *batchCapDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := d.d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &batchCapConn{Conn: c, limit: d.limit}, nil
}

// batchCapConn reads the server's byte stream one whole message at a time, lowers the
// maxWriteBatchSize of a hello reply in place (the value keeps its type and width, so no length
// changes) and hands the bytes on unchanged otherwise. Writes pass through, except a write
// command above limit (see Write). Read is called by one goroutine at a time, as the driver does.
type batchCapConn struct {
	net.Conn
	limit int32
	in    []byte // the message being read, header first
	out   []byte // the rest of a whole message not yet handed to the reader
}

// Write implements net.Conn. It refuses, sending nothing, one whole OP_MSG that is an insert,
// update or delete command of more than limit statements ([ErrWriteBatchTooLarge]); the driver
// writes each message in one call and splits its own batches below the limit, so only a command
// built by hand (RunCommand) is refused.
func (c *batchCapConn) Write(p []byte) (int, error) {
	if cmd, n := writeStatements(p); n > int(c.limit) {
		return 0, fmt.Errorf("store: refuse a %s command of %d statements (at most %d): %w", cmd, n, c.limit, ErrWriteBatchTooLarge)
	}
	return c.Conn.Write(p)
}

// writeStatements returns the command name and statement count of msg when msg is exactly one
// OP_MSG carrying an insert, update or delete command, counting both the command's array and a
// document sequence (kind 1 section) of the same name; "" and 0 otherwise.
func writeStatements(msg []byte) (string, int) {
	if len(msg) < 26 || int(binary.LittleEndian.Uint32(msg[:4])) != len(msg) ||
		binary.LittleEndian.Uint32(msg[12:16]) != opMsg || msg[20] != 0 {
		return "", 0
	}
	end := len(msg)
	if binary.LittleEndian.Uint32(msg[16:20])&checksumPresent != 0 {
		end -= 4
	}
	body, _, ok := bsoncore.ReadDocument(msg[21:end])
	if !ok {
		return "", 0
	}
	first, err := body.IndexErr(0)
	if err != nil {
		return "", 0
	}
	cmd := first.Key()
	var field string
	switch cmd {
	case "insert":
		field = "documents"
	case "update":
		field = "updates"
	case "delete":
		field = "deletes"
	default:
		return "", 0
	}
	n := 0
	if v, err := body.LookupErr(field); err == nil {
		if arr, ok := v.ArrayOK(); ok {
			if vals, err := arr.Values(); err == nil {
				n += len(vals)
			}
		}
	}
	// Document sequences follow the body: kind 1, size, identifier, then documents.
	for pos := 21 + len(body); pos+5 <= end && msg[pos] == 1; {
		size := int(binary.LittleEndian.Uint32(msg[pos+1:]))
		if size < 5 || pos+1+size > end {
			break
		}
		seq := msg[pos+5 : pos+1+size]
		id, rest, ok := bsoncore.ReadKey(seq) // a C string, as a key is
		if ok && id == field {
			for len(rest) > 0 {
				if _, rest, ok = bsoncore.ReadDocument(rest); !ok {
					break
				}
				n++
			}
		}
		pos += 1 + size
	}
	return cmd, n
}

// Read implements net.Conn. A read error (a deadline, a closed connection) keeps what was read
// of the current message, so a later Read goes on from there.
func (c *batchCapConn) Read(p []byte) (int, error) {
	for len(c.out) == 0 {
		if err := c.fill(); err != nil {
			return 0, err
		}
	}
	n := copy(p, c.out)
	c.out = c.out[n:]
	return n, nil
}

// fill reads from the server until c.in holds one whole message, then moves it to c.out.
func (c *batchCapConn) fill() error {
	need := 4
	if len(c.in) >= 4 {
		need = int(binary.LittleEndian.Uint32(c.in[:4]))
		if need < 16 || need > maxWireMessage {
			return fmt.Errorf("store: the server sent a wire message of %d bytes", need)
		}
	}
	if len(c.in) < need {
		if cap(c.in) < need {
			grown := make([]byte, len(c.in), need)
			copy(grown, c.in)
			c.in = grown
		}
		n, err := c.Conn.Read(c.in[len(c.in):need])
		c.in = c.in[:len(c.in)+n]
		if err != nil && len(c.in) < need {
			return err
		}
		if len(c.in) < need || need == 4 {
			return nil
		}
	}
	capWriteBatch(c.in, c.limit)
	c.out, c.in = c.in, nil
	return nil
}

// capWriteBatch lowers a top-level maxWriteBatchSize above limit in the reply document of msg
// (an OP_REPLY, the legacy handshake's answer, or an OP_MSG's body section) to limit, and
// recomputes an OP_MSG checksum it changed. Only hello and isMaster replies carry that field.
// Anything it cannot parse is left alone.
func capWriteBatch(msg []byte, limit int32) {
	var off int
	switch binary.LittleEndian.Uint32(msg[12:16]) {
	case opReply:
		off = 16 + 4 + 8 + 4 + 4 // flags, cursor id, starting from, number returned
	case opMsg:
		if len(msg) < 21 || msg[20] != 0 { // the body section (kind 0) comes first
			return
		}
		off = 21
	default:
		return
	}
	if len(msg) < off+5 {
		return
	}
	n := int(binary.LittleEndian.Uint32(msg[off:]))
	if n < 5 || off+n > len(msg) {
		return
	}
	pos, rem := off+4, msg[off+4:off+n-1]
	changed := false
	for len(rem) > 0 {
		elem, rest, ok := bsoncore.ReadElement(rem)
		if !ok {
			return
		}
		if key := elem.Key(); key == "maxWriteBatchSize" {
			v := msg[pos+1+len(key)+1:]
			switch bsoncore.Type(elem[0]) {
			case bsoncore.TypeInt32:
				if int32(binary.LittleEndian.Uint32(v)) > limit {
					binary.LittleEndian.PutUint32(v, uint32(limit))
					changed = true
				}
			case bsoncore.TypeInt64:
				if int64(binary.LittleEndian.Uint64(v)) > int64(limit) {
					binary.LittleEndian.PutUint64(v, uint64(limit))
					changed = true
				}
			case bsoncore.TypeDouble:
				if math.Float64frombits(binary.LittleEndian.Uint64(v)) > float64(limit) {
					binary.LittleEndian.PutUint64(v, math.Float64bits(float64(limit)))
					changed = true
				}
			}
		}
		pos += len(elem)
		rem = rest
	}
	if changed && binary.LittleEndian.Uint32(msg[12:16]) == opMsg &&
		binary.LittleEndian.Uint32(msg[16:20])&checksumPresent != 0 {
		sum := crc32.Checksum(msg[:len(msg)-4], crc32.MakeTable(crc32.Castagnoli))
		binary.LittleEndian.PutUint32(msg[len(msg)-4:], sum)
	}
}
