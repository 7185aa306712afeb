package logseg

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// File names inside a log directory (docs/logs.md section 3).
const (
	CurrentFile = "current.log"   // the open segment, uncompressed records
	IndexFile   = "index.jsonl"   // one [Segment] per line, in the order sealed
	DroppedFile = "dropped.jsonl" // one [Drop] per line
	WriterLock  = ".writer.lock"  // held (flock) by the live writer
	pruneLock   = ".prune.lock"
	segSuffix   = ".seg.gz"
	// ShippedSuffix names the marker file a shipper creates beside a segment
	// once the segment is safely stored elsewhere ("<segment>.shipped").
	ShippedSuffix = ".shipped"
)

// DirOf is the log directory that goes with a driver's log path: the path
// with its ".log" extension replaced by ".segments".
func DirOf(logPath string) string {
	return strings.TrimSuffix(logPath, ".log") + ".segments"
}

// Segment describes one sealed segment; it is one line of the index.
type Segment struct {
	Name      string    `json:"name"`       // file name: <first seq, 20 digits>-<last seq, 20 digits>.seg.gz
	FirstSeq  int64     `json:"first_seq"`  // sequence of its first record
	LastSeq   int64     `json:"last_seq"`   // sequence of its last record
	FirstTime time.Time `json:"first_time"` // stamp of its first record
	LastTime  time.Time `json:"last_time"`  // stamp of its last record
	Records   int64     `json:"records"`    // how many records it holds
	RawBytes  int64     `json:"raw_bytes"`  // bytes of records before compression
	Bytes     int64     `json:"bytes"`      // bytes of the file
	SHA256    string    `json:"sha256"`     // hex SHA-256 of the file: its content address
}

// Drop records segments removed before they were shipped because the disk
// bound forced it; one line of the dropped file.
type Drop struct {
	Segment  string    `json:"segment"`
	FirstSeq int64     `json:"first_seq"`
	LastSeq  int64     `json:"last_seq"`
	Bytes    int64     `json:"bytes"`
	At       time.Time `json:"at"`
	Reason   string    `json:"reason"` // "disk-limit"
}

func segName(first, last int64) string {
	return fmt.Sprintf("%020d-%020d%s", first, last, segSuffix)
}

// parseSegName returns the sequence range a segment's file name states.
func parseSegName(name string) (first, last int64, ok bool) {
	base, found := strings.CutSuffix(name, segSuffix)
	if !found {
		return 0, 0, false
	}
	a, b, found := strings.Cut(base, "-")
	if !found {
		return 0, 0, false
	}
	f, err1 := strconv.ParseInt(a, 10, 64)
	l, err2 := strconv.ParseInt(b, 10, 64)
	if err1 != nil || err2 != nil || f < 1 || l < f {
		return 0, 0, false
	}
	return f, l, true
}

// Segments lists the sealed segments of dir in sequence order, from the index
// where it has them and from the segment file otherwise (an index line lost to
// a crash). A missing directory has none.
func Segments(dir string) ([]Segment, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list log segments: %w", err)
	}
	indexed := map[string]Segment{}
	if raw, err := os.ReadFile(filepath.Join(dir, IndexFile)); err == nil {
		for line := range bytes.SplitSeq(raw, []byte("\n")) {
			var s Segment
			if len(line) > 0 && json.Unmarshal(line, &s) == nil {
				indexed[s.Name] = s
			}
		}
	}
	var out []Segment
	for _, e := range ents {
		first, last, ok := parseSegName(e.Name())
		if !ok {
			continue
		}
		if s, ok := indexed[e.Name()]; ok {
			out = append(out, s)
			continue
		}
		s, err := describe(dir, e.Name())
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		s.FirstSeq, s.LastSeq = first, last
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b Segment) int { return int(a.FirstSeq - b.FirstSeq) })
	return out, nil
}

// describe reads a segment file to make its index entry.
func describe(dir, name string) (Segment, error) {
	s := Segment{Name: name}
	raw, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return s, fmt.Errorf("read log segment %s: %w", name, err)
	}
	sum := sha256.Sum256(raw)
	s.SHA256, s.Bytes = hex.EncodeToString(sum[:]), int64(len(raw))
	err = decodeSegment(bytes.NewReader(raw), func(r Record, n int) error {
		if s.Records == 0 {
			s.FirstSeq, s.FirstTime = r.Seq, r.Time
		}
		s.LastSeq, s.LastTime = r.Seq, r.Time
		s.Records++
		s.RawBytes += int64(n)
		return nil
	})
	if err != nil {
		return s, fmt.Errorf("read log segment %s: %w", name, err)
	}
	return s, nil
}

// decodeSegment calls fn with each record of a compressed segment and its
// encoded size.
func decodeSegment(r io.Reader, fn func(Record, int) error) error {
	zr, err := gzip.NewReader(r)
	if err != nil {
		return err
	}
	defer zr.Close()
	return scanRecords(zr, fn)
}

// scanRecords calls fn with each complete record of r; an unterminated last
// line (a write cut by a crash) is ignored, a line that is not a record is an error.
func scanRecords(r io.Reader, fn func(Record, int) error) error {
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			// A record is at most MaxText plus its header: longer is not ours.
			return fmt.Errorf("%w: line longer than a record", ErrBadRecord)
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		rec, perr := Parse(line[:len(line)-1])
		if perr != nil {
			return perr
		}
		if err := fn(rec, len(line)); err != nil {
			return err
		}
	}
}

// ReadSegment calls fn with each record of the sealed segment file path.
func ReadSegment(r io.Reader, fn func(Record) error) error {
	return decodeSegment(r, func(rec Record, _ int) error { return fn(rec) })
}

// Drops lists what the disk bound removed from dir before it was shipped.
func Drops(dir string) ([]Drop, error) {
	raw, err := os.ReadFile(filepath.Join(dir, DroppedFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read log drops: %w", err)
	}
	var out []Drop
	for line := range bytes.SplitSeq(raw, []byte("\n")) {
		var d Drop
		if len(line) > 0 && json.Unmarshal(line, &d) == nil {
			out = append(out, d)
		}
	}
	return out, nil
}

// appendLine appends one JSON line to dir/name and syncs it.
func appendLine(dir, name string, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return err
	}
	_, err = f.Write(append(raw, '\n'))
	if serr := f.Sync(); err == nil {
		err = serr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
