package store

import (
	"encoding/binary"
	"hash/crc32"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// TestCapWriteBatch lowers maxWriteBatchSize in hello replies of both framings and each integer
// width, keeps a checksum valid, and leaves smaller values and other replies alone.
func TestCapWriteBatch(t *testing.T) {
	opMsgOf := func(doc []byte, checksum bool) []byte {
		var flags uint32
		if checksum {
			flags = checksumPresent
		}
		msg := make([]byte, 21, 25+len(doc))
		binary.LittleEndian.PutUint32(msg[12:], opMsg)
		binary.LittleEndian.PutUint32(msg[16:], flags)
		msg = append(msg, doc...)
		if !checksum {
			binary.LittleEndian.PutUint32(msg, uint32(len(msg)))
			return msg
		}
		binary.LittleEndian.PutUint32(msg, uint32(len(msg)+4))
		return binary.LittleEndian.AppendUint32(msg, crc32.Checksum(msg, crc32.MakeTable(crc32.Castagnoli)))
	}
	opReplyOf := func(doc []byte) []byte {
		msg := make([]byte, 36, 36+len(doc))
		binary.LittleEndian.PutUint32(msg[12:], opReply)
		binary.LittleEndian.PutUint32(msg[32:], 1)
		msg = append(msg, doc...)
		binary.LittleEndian.PutUint32(msg, uint32(len(msg)))
		return msg
	}
	marshal := func(d bson.D) []byte {
		b, err := bson.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, tc := range []struct {
		name  string
		value any
		want  int64
	}{
		{"int32 above", int32(100000), 64},
		{"int64 above", int64(100000), 64},
		{"double above", float64(100000), 64},
		{"int32 below", int32(10), 10},
	} {
		doc := marshal(bson.D{{Key: "isWritablePrimary", Value: true}, {Key: "maxWriteBatchSize", Value: tc.value}, {Key: "ok", Value: 1.0}})
		for _, framing := range []string{"OP_MSG", "OP_MSG with checksum", "OP_REPLY"} {
			var msg []byte
			var body func([]byte) []byte
			switch framing {
			case "OP_MSG":
				msg, body = opMsgOf(doc, false), func(m []byte) []byte { return m[21:] }
			case "OP_MSG with checksum":
				msg, body = opMsgOf(doc, true), func(m []byte) []byte { return m[21 : len(m)-4] }
			default:
				msg, body = opReplyOf(doc), func(m []byte) []byte { return m[36:] }
			}
			capWriteBatch(msg, 64)
			var got bson.M
			if err := bson.Unmarshal(body(msg), &got); err != nil {
				t.Fatalf("%s, %s: decode: %v", tc.name, framing, err)
			}
			var v int64
			switch x := got["maxWriteBatchSize"].(type) {
			case int32:
				v = int64(x)
			case int64:
				v = x
			case float64:
				v = int64(x)
			}
			if v != tc.want {
				t.Errorf("%s, %s: maxWriteBatchSize = %v, want %d", tc.name, framing, got["maxWriteBatchSize"], tc.want)
			}
			if framing == "OP_MSG with checksum" {
				sum := crc32.Checksum(msg[:len(msg)-4], crc32.MakeTable(crc32.Castagnoli))
				if binary.LittleEndian.Uint32(msg[len(msg)-4:]) != sum {
					t.Errorf("%s: checksum not recomputed", tc.name)
				}
			}
		}
	}
	// A nested field of the same name (a document a find returns) is not touched.
	nested := marshal(bson.D{{Key: "cursor", Value: bson.D{{Key: "maxWriteBatchSize", Value: int32(100000)}}}})
	msg := opMsgOf(nested, false)
	before := string(msg)
	capWriteBatch(msg, 64)
	if string(msg) != before {
		t.Error("a nested maxWriteBatchSize was changed")
	}
}

// TestWriteStatementsCountsDocumentSequences counts statements in the command's array and in a
// document sequence (as the driver sends InsertMany), and ignores other commands.
func TestWriteStatementsCountsDocumentSequences(t *testing.T) {
	build := func(body bson.D, seqID string, seqDocs int) []byte {
		b, err := bson.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		msg := make([]byte, 21, 64)
		binary.LittleEndian.PutUint32(msg[12:], opMsg)
		msg = append(msg, b...)
		if seqDocs > 0 {
			var seq []byte
			seq = append(seq, seqID...)
			seq = append(seq, 0)
			for i := range seqDocs {
				d, _ := bson.Marshal(bson.D{{Key: "_id", Value: i}})
				seq = append(seq, d...)
			}
			msg = append(msg, 1)
			msg = binary.LittleEndian.AppendUint32(msg, uint32(4+len(seq)))
			msg = append(msg, seq...)
		}
		binary.LittleEndian.PutUint32(msg, uint32(len(msg)))
		return msg
	}
	for _, tc := range []struct {
		name    string
		msg     []byte
		wantCmd string
		want    int
	}{
		{"insert sequence", build(bson.D{{Key: "insert", Value: "c"}, {Key: "$db", Value: "berth"}}, "documents", 65), "insert", 65},
		{"delete array", build(bson.D{{Key: "delete", Value: "c"}, {Key: "deletes", Value: bson.A{bson.M{}, bson.M{}, bson.M{}}}}, "", 0), "delete", 3},
		{"update array and sequence", build(bson.D{{Key: "update", Value: "c"}, {Key: "updates", Value: bson.A{bson.M{}}}}, "updates", 2), "update", 3},
		{"find", build(bson.D{{Key: "find", Value: "c"}}, "", 0), "", 0},
	} {
		cmd, n := writeStatements(tc.msg)
		if cmd != tc.wantCmd || n != tc.want {
			t.Errorf("%s: writeStatements = %q, %d, want %q, %d", tc.name, cmd, n, tc.wantCmd, tc.want)
		}
	}
}
