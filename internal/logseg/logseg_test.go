package logseg

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func readAll(t *testing.T, dir string) []Record {
	t.Helper()
	var out []Record
	if _, err := ReadFrom(dir, 1, func(r Record) error {
		r.Text = append([]byte(nil), r.Text...)
		out = append(out, r)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestRecordRoundTrip(t *testing.T) {
	t.Parallel()
	r := Record{Time: time.Date(2026, 12, 2, 13, 40, 0, 5, time.UTC), Stream: Stderr, Seq: 42, Partial: true, Text: []byte("a b\tc \x00 ü")}
	line := AppendRecord(nil, r)
	if got := string(line); got != "2026-12-02T13:40:00.000000005Z stderr 42 P a b\tc \x00 ü\n" {
		t.Fatalf("encoded %q", got)
	}
	back, err := Parse(line[:len(line)-1])
	if err != nil {
		t.Fatal(err)
	}
	if !back.Time.Equal(r.Time) || back.Stream != r.Stream || back.Seq != r.Seq || !back.Partial || !bytes.Equal(back.Text, r.Text) {
		t.Fatalf("decoded %+v", back)
	}
	for _, bad := range []string{"", "x stdout 1 F a", "2026-12-02T13:40:00.000000005Z stdin 1 F a", "2026-12-02T13:40:00.000000005Z stdout 0 F a", "2026-12-02T13:40:00.000000005Z stdout 1 X a"} {
		if _, err := Parse([]byte(bad)); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
}

func TestWriterLinesSequenceAndSegments(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	w, err := OpenWriter(dir, WriterOptions{SegmentBytes: 4 << 10})
	if err != nil {
		t.Fatal(err)
	}
	out, errs := w.Stream(Stdout), w.Stream(Stderr)
	for i := 1; i <= 500; i++ {
		s := out
		if i%7 == 0 {
			s = errs
		}
		// Lines arrive cut at arbitrary places.
		line := fmt.Sprintf("line %d\n", i)
		if _, err := s.Write([]byte(line[:3])); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Write([]byte(line[3:])); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	segs, err := Segments(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(segs) < 2 {
		t.Fatalf("%d segments, want several at 4 KiB each", len(segs))
	}
	recs := readAll(t, dir)
	if len(recs) != 500 {
		t.Fatalf("%d records, want 500", len(recs))
	}
	for i, r := range recs {
		want := fmt.Sprintf("line %d", i+1)
		if r.Seq != int64(i+1) || string(r.Text) != want || r.Partial {
			t.Fatalf("record %d: %+v %q", i, r, r.Text)
		}
		if (i+1)%7 == 0 != (r.Stream == Stderr) {
			t.Fatalf("record %d on %s", i, r.Stream)
		}
		if i > 0 && r.Time.Before(recs[i-1].Time) {
			t.Fatalf("record %d stamped before the one before it", i)
		}
	}
	// A second writer continues the sequence.
	w, err = OpenWriter(dir, WriterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, _ = w.Stream(Stdout).Write([]byte("after\n"))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	recs = readAll(t, dir)
	if n := len(recs); n != 501 || recs[n-1].Seq != 501 || string(recs[n-1].Text) != "after" {
		t.Fatalf("after reopen: %d records, last %+v", n, recs[n-1])
	}
}

func TestWriterSplitsLongAndPartialLines(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	w, err := OpenWriter(dir, WriterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s := w.Stream(Stdout)
	long := bytes.Repeat([]byte("0123456789abcdef"), 10<<20/16) // 10 MiB
	for chunk := long; len(chunk) > 0; {
		n := min(len(chunk), 64<<10)
		if _, err := s.Write(chunk[:n]); err != nil {
			t.Fatal(err)
		}
		chunk = chunk[n:]
	}
	_, _ = s.Write([]byte("\nprompt> "))
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	recs := readAll(t, dir)
	if want := 10<<20/MaxText + 1; len(recs) != want {
		t.Fatalf("%d records, want %d", len(recs), want)
	}
	var joined []byte
	for i, r := range recs[:len(recs)-1] {
		if len(r.Text) > MaxText {
			t.Fatalf("record %d holds %d bytes", i, len(r.Text))
		}
		if last := i == len(recs)-2; r.Partial == last {
			t.Fatalf("record %d partial=%v", i, r.Partial)
		}
		joined = append(joined, r.Text...)
	}
	if !bytes.Equal(joined, long) {
		t.Fatal("the pieces do not make the line again")
	}
	if p := recs[len(recs)-1]; !p.Partial || string(p.Text) != "prompt> " {
		t.Fatalf("unfinished line: %+v", p)
	}
}

func TestWriterRecoversOpenSegment(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	w, err := OpenWriter(dir, WriterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := OpenWriter(dir, WriterOptions{}); err == nil {
		t.Fatal("a second writer took a held directory")
	}
	_, _ = w.Stream(Stdout).Write([]byte("a\nb\n"))
	if err := w.Seal(); err != nil {
		t.Fatal(err)
	}
	_, _ = w.Stream(Stdout).Write([]byte("c\nd\n"))
	// A crash: the writer dies with records in the open segment, one of them
	// also sealed (as if it died between rename and truncation), and half a
	// record at the end.
	sealed, _ := os.ReadFile(filepath.Join(dir, CurrentFile))
	_ = w.lock.Close()
	stale := AppendRecord(nil, Record{Time: time.Now(), Stream: Stdout, Seq: 2, Text: []byte("b")})
	if err := os.WriteFile(filepath.Join(dir, CurrentFile), append(append(stale, sealed...), "2026-12-02T1"...), 0o640); err != nil {
		t.Fatal(err)
	}
	w, err = OpenWriter(dir, WriterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, _ = w.Stream(Stderr).Write([]byte("e\n"))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range readAll(t, dir) {
		got = append(got, fmt.Sprintf("%d:%s", r.Seq, r.Text))
	}
	if strings.Join(got, " ") != "1:a 2:b 3:c 4:d 5:e" {
		t.Fatalf("records %v", got)
	}
}

func TestPruneShippedFirstAndRecordsDrops(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	w, err := OpenWriter(dir, WriterOptions{MaxDiskBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		_, _ = w.Stream(Stdout).Write(fmt.Appendf(nil, "segment %d %s\n", i, strings.Repeat("z", 100)))
		if err := w.Seal(); err != nil {
			t.Fatal(err)
		}
	}
	_ = w.Close()
	segs, _ := Segments(dir)
	if len(segs) != 6 {
		t.Fatalf("%d segments", len(segs))
	}
	// Segments 1 and 3 are shipped; a bound of exactly what segments 2, 4 and 5
	// hold removes those two first, then the oldest unshipped one, and no more.
	// (The bound is taken from those three: compressed sizes differ by a byte or
	// two with the stamps, so any other three segments' sum may be one short.)
	for _, i := range []int{1, 3} {
		if err := MarkShipped(dir, segs[i].Name); err != nil {
			t.Fatal(err)
		}
	}
	three := segs[2].Bytes + segs[4].Bytes + segs[5].Bytes
	drops, err := Prune(dir, three, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if len(drops) != 1 || drops[0].Segment != segs[0].Name || drops[0].Reason != DropReasonDiskLimit {
		t.Fatalf("drops %+v", drops)
	}
	left, _ := Segments(dir)
	var names []int64
	for _, s := range left {
		names = append(names, s.FirstSeq)
	}
	if fmt.Sprint(names) != "[3 5 6]" {
		t.Fatalf("left %v", names)
	}
	recorded, _ := Drops(dir)
	if len(recorded) != 1 || recorded[0].FirstSeq != 1 {
		t.Fatalf("recorded drops %+v", recorded)
	}
	// The sequence goes on after what was dropped, never reusing a number.
	w, _ = OpenWriter(dir, WriterOptions{MaxDiskBytes: -1})
	_, _ = w.Stream(Stdout).Write([]byte("x\n"))
	_ = w.Close()
	all := readAll(t, dir)
	if all[len(all)-1].Seq != 7 {
		t.Fatalf("last seq %d", all[len(all)-1].Seq)
	}
}

// TestReadFromWhileSealing: a reader that reads on from the sequence after the last record it
// got, while the writer keeps sealing tiny segments, gets every record once, in order.
func TestReadFromWhileSealing(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	w, err := OpenWriter(dir, WriterOptions{SegmentBytes: 300, MaxDiskBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	const n = 1500
	done := make(chan error, 1)
	go func() {
		s := w.Stream(Stdout)
		for i := 1; i <= n; i++ {
			if _, err := fmt.Fprintf(s, "line %d\n", i); err != nil {
				done <- err
				return
			}
		}
		done <- w.Close()
	}()
	next, got := int64(1), 0
	writing := true
	defer func() {
		if writing {
			<-done // the writer ends before the directory is removed
		}
	}()
	for deadline := time.Now().Add(time.Minute); got < n && time.Now().Before(deadline); {
		if writing {
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
				writing = false
			default:
			}
		}
		var err error
		next, err = ReadFrom(dir, next, func(r Record) error {
			got++
			if r.Seq != int64(got) || string(r.Text) != fmt.Sprintf("line %d", got) {
				return fmt.Errorf("record %d: seq %d %q", got, r.Seq, r.Text)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if got != n {
		t.Fatalf("read %d of %d records", got, n)
	}
}
