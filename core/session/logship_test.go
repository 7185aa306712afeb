package session

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/blobs"
	"github.com/berthhq/berth/core/logs"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/store/storetest"
	"github.com/berthhq/berth/internal/logseg"
)

// sealedSegment writes n lines through a real log writer into a fresh directory and returns
// the one sealed segment's description and bytes.
func sealedSegment(t *testing.T, workloadID string, n int) (node.LogSegmentInfo, []byte) {
	t.Helper()
	dir := t.TempDir()
	w, err := logseg.OpenWriter(dir, logseg.WriterOptions{SegmentBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	noise := make([]byte, 64)
	for i := 1; i <= n; i++ {
		_, _ = rand.Read(noise) // text that does not compress, so the segment needs several pieces
		fmt.Fprintf(w.Stream(logseg.Stdout), "line %d %x\n", i, noise)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	segs, err := logseg.Segments(dir)
	if err != nil || len(segs) != 1 {
		t.Fatalf("segments %v, %v", segs, err)
	}
	s := segs[0]
	raw, err := os.ReadFile(filepath.Join(dir, s.Name))
	if err != nil {
		t.Fatal(err)
	}
	return node.LogSegmentInfo{WorkloadID: workloadID, Name: s.Name, FirstSeq: s.FirstSeq, LastSeq: s.LastSeq, FirstTime: s.FirstTime,
		LastTime: s.LastTime, Records: s.Records, RawBytes: s.RawBytes, Bytes: s.Bytes, SHA256: s.SHA256}, raw
}

// ack sends one log_segment and returns its answer.
func (p *peer) ack(m node.LogSegment) node.LogSegmentAck {
	p.t.Helper()
	p.send(1, node.TypeLogSegment, m)
	for {
		env := p.next()
		if env.Type != node.TypeLogSegmentAck {
			continue // a status or log message of the session
		}
		var a node.LogSegmentAck
		if err := json.Unmarshal(env.Body, &a); err != nil {
			p.t.Fatal(err)
		}
		return a
	}
}

// TestLogSegmentShippedOnceInPieces: a node ships a segment of its own workload in pieces; the
// core stores it once, answers have when it is offered again, refuses a piece out of order and
// the log of a workload that is not the node's, and the segment reads back from the index.
func TestLogSegmentShippedOnceInPieces(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bs, err := blobs.NewFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	x, err := logs.New(ctx, logs.Config{Store: storetest.Open(t), Blobs: bs})
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, func(c *Config) { c.Logs = x })
	p, _, err := f.dial(t, f.cred)
	if err != nil {
		t.Fatal(err)
	}
	f.handshake(t, p)
	prj, _, _ := f.cat.EnsureProject(ctx, "p")
	svc, _, err := f.cat.PutService(ctx, prj, &services.Service{Name: "s", BundleDigest: "sha256:x", Command: []string{"x"}, Replicas: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	own, err := f.cat.CreateWorkload(ctx, svc, 0, f.node.ID)
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := f.cat.CreateWorkload(ctx, svc, 1, "nod_other")
	if err != nil {
		t.Fatal(err)
	}

	// Registration, then the segment in pieces of at most LogSegmentChunkBytes.
	if a := p.ack(node.LogSegment{Segment: node.LogSegmentInfo{WorkloadID: own.ID}}); !a.Stored {
		t.Fatalf("registration: %+v", a)
	}
	info, raw := sealedSegment(t, own.ID, 15000)
	if len(raw) <= node.LogSegmentChunkBytes {
		t.Fatalf("the segment (%d bytes) fits one piece; the test needs several", len(raw))
	}
	send := func() node.LogSegmentAck {
		var a node.LogSegmentAck
		for off := 0; ; {
			end := min(off+node.LogSegmentChunkBytes, len(raw))
			a = p.ack(node.LogSegment{Segment: info, Offset: int64(off), Data: raw[off:end], Last: end == len(raw)})
			if a.Stored || a.Code != "" || end == len(raw) {
				return a
			}
			if a.NextOffset != int64(end) {
				t.Fatalf("next offset %d, want %d", a.NextOffset, end)
			}
			off = end
		}
	}
	if a := send(); !a.Stored || a.Have {
		t.Fatalf("first upload: %+v", a)
	}
	// Offered again (an agent restarted before its shipped mark): have, at the first piece.
	if a := p.ack(node.LogSegment{Segment: info, Data: raw[:10]}); !a.Stored || !a.Have {
		t.Fatalf("second offer: %+v", a)
	}
	n := 0
	if err := bs.List(ctx, "logs/", func(blobs.Info) error { n++; return nil }); err != nil || n != 1 {
		t.Fatalf("%d blobs (%v), want 1", n, err)
	}

	// A piece out of order is refused and nothing is stored.
	other, raw2 := sealedSegment(t, own.ID, 100)
	other.FirstSeq, other.LastSeq = 15001, 15000+other.Records
	if a := p.ack(node.LogSegment{Segment: other, Offset: int64(node.LogSegmentChunkBytes), Data: raw2[:10]}); a.Code != string(abierrors.BadMessage) {
		t.Fatalf("a piece out of order: %+v", a)
	}
	// The log of another node's workload is refused for good.
	if a := p.ack(node.LogSegment{Segment: node.LogSegmentInfo{WorkloadID: foreign.ID}}); a.Code != string(abierrors.NotFound) {
		t.Fatalf("another node's workload: %+v", a)
	}

	w, err := x.Workload(ctx, own.ID)
	if err != nil || len(w.Segments) != 1 || w.ProjectID != prj.ID || w.NodeID != f.node.ID {
		t.Fatalf("indexed log: %+v, %v", w, err)
	}
	records := 0
	if err := x.ReadSegment(ctx, w.Segments[0], func(logseg.Record) error { records++; return nil }); err != nil || records != 15000 {
		t.Fatalf("read back %d records, %v", records, err)
	}
}
