package logseg

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Defaults of [WriterOptions] fields left zero.
const (
	DefaultSegmentBytes = 4 << 20         // raw record bytes that seal a segment
	DefaultSegmentAge   = 5 * time.Minute // age of a segment's first record that seals it
	DefaultMaxDiskBytes = 256 << 20       // bytes of sealed segments kept in one log directory
)

// ErrWriterHeld is returned (wrapped) by [OpenWriter] when another live writer holds the directory.
var ErrWriterHeld = errors.New("berth: another log writer holds this log directory")

// WriterOptions configures a [Writer]. The zero value works.
type WriterOptions struct {
	// SegmentBytes seals the open segment once its records reach this many
	// bytes (uncompressed); zero means DefaultSegmentBytes.
	SegmentBytes int64
	// SegmentAge seals the open segment once its first record is this old,
	// checked by [Writer.SealIfOlder]; zero means DefaultSegmentAge.
	SegmentAge time.Duration
	// MaxDiskBytes bounds the sealed segments kept in the directory (see
	// [Prune]); zero means DefaultMaxDiskBytes, negative no bound.
	MaxDiskBytes int64
	// Now stamps records; nil means time.Now.
	Now func() time.Time
}

// Writer appends stamped records to one log directory and seals segments. It
// is safe for concurrent use by the streams of one workload; exactly one
// Writer (one process) holds a directory at a time.
type Writer struct {
	dir  string
	opts WriterOptions
	lock *os.File

	mu        sync.Mutex
	cur       *os.File  // mu must be held
	curBytes  int64     // mu must be held
	curFirst  int64     // seq of the open segment's first record; 0 when empty; mu must be held
	curStart  time.Time // stamp of that record; mu must be held
	next      int64     // the next record's seq; mu must be held
	lastStamp time.Time // the newest stamp given; mu must be held
	buf       []byte    // mu must be held
	err       error     // the first write error; mu must be held
}

// OpenWriter takes dir (created 0750) for writing: it locks it, seals what a
// previous writer left in the open segment (records a sealed segment already
// holds are dropped, so none is sealed twice), and continues the sequence
// after the newest record. It fails with [ErrWriterHeld] when a live writer
// holds dir.
func OpenWriter(dir string, opts WriterOptions) (*Writer, error) {
	if opts.SegmentBytes <= 0 {
		opts.SegmentBytes = DefaultSegmentBytes
	}
	if opts.SegmentAge <= 0 {
		opts.SegmentAge = DefaultSegmentAge
	}
	if opts.MaxDiskBytes == 0 {
		opts.MaxDiskBytes = DefaultMaxDiskBytes
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("open log directory: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, WriterLock), os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return nil, fmt.Errorf("open log directory: %w", err)
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		_ = lock.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("open log directory %s: %w", dir, ErrWriterHeld)
		}
		return nil, fmt.Errorf("open log directory: %w", err)
	}
	w := &Writer{dir: dir, opts: opts, lock: lock}
	if err := w.recover(); err != nil {
		_ = lock.Close()
		return nil, fmt.Errorf("open log directory %s: %w", dir, err)
	}
	return w, nil
}

// recover seals the records a previous writer left in the open segment and
// sets the next sequence.
func (w *Writer) recover() error {
	segs, err := Segments(w.dir)
	if err != nil {
		return err
	}
	var sealed int64
	if n := len(segs); n > 0 {
		sealed = segs[n-1].LastSeq
	}
	if drops, err := Drops(w.dir); err == nil {
		for _, d := range drops {
			sealed = max(sealed, d.LastSeq)
		}
	}
	w.next = sealed + 1
	cur, err := os.OpenFile(filepath.Join(w.dir, CurrentFile), os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return err
	}
	w.cur = cur
	var keep bytes.Buffer
	var first Record
	err = scanRecords(cur, func(r Record, _ int) error {
		if r.Seq <= sealed || r.Seq < w.next {
			return nil
		}
		if keep.Len() == 0 {
			first = r
		}
		keep.Write(AppendRecord(nil, r))
		w.next = r.Seq + 1
		w.lastStamp = r.Time
		return nil
	})
	if err != nil {
		return fmt.Errorf("read the open segment: %w", err)
	}
	if err := w.resetCurrentLocked(); err != nil {
		return err
	}
	if keep.Len() > 0 {
		if _, err := w.cur.Write(keep.Bytes()); err != nil {
			return err
		}
		w.curBytes, w.curFirst, w.curStart = int64(keep.Len()), first.Seq, first.Time
		return w.sealLocked()
	}
	return nil
}

// resetCurrentLocked empties the open segment. mu must be held.
func (w *Writer) resetCurrentLocked() error {
	if err := w.cur.Truncate(0); err != nil {
		return fmt.Errorf("empty the open segment: %w", err)
	}
	if _, err := w.cur.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("empty the open segment: %w", err)
	}
	w.curBytes, w.curFirst, w.curStart = 0, 0, time.Time{}
	return nil
}

// Stream returns the writer of one stream's raw output: it cuts the output
// into lines and lines into records of at most MaxText bytes. Use one per
// stream, from one goroutine.
func (w *Writer) Stream(name string) *StreamWriter {
	return &StreamWriter{w: w, stream: name}
}

// StreamWriter turns one stream's raw output into records (see [Writer.Stream]).
type StreamWriter struct {
	w       *Writer
	stream  string
	pending []byte // output after the last newline not yet written as a record
}

// Write stamps and appends every complete line of p (with what was pending
// before it); text after the last newline waits for more output or
// [StreamWriter.Flush], unless it grows past MaxText. It returns the writer's
// first write error, which sticks.
func (s *StreamWriter) Write(p []byte) (int, error) {
	data := p
	if len(s.pending) > 0 {
		data = append(s.pending, p...)
	}
	var parts []part
	for {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			break
		}
		parts = appendParts(parts, data[:i])
		data = data[i+1:]
	}
	for len(data) > MaxText {
		parts = append(parts, part{text: data[:MaxText], partial: true})
		data = data[MaxText:]
	}
	if err := s.w.append(s.stream, parts); err != nil {
		return 0, err
	}
	s.pending = append(s.pending[:0:0], data...)
	return len(p), nil
}

// Flush writes pending text without a newline as a record tagged P: a line
// the workload has not finished (it paused, or its output ended).
func (s *StreamWriter) Flush() error {
	if len(s.pending) == 0 {
		return nil
	}
	err := s.w.append(s.stream, []part{{text: s.pending, partial: true}})
	s.pending = nil
	return err
}

// Pending reports whether text waits for its newline.
func (s *StreamWriter) Pending() bool { return len(s.pending) > 0 }

type part struct {
	text    []byte
	partial bool
}

// appendParts adds the records of one complete line: pieces of MaxText tagged
// P, the last one F.
func appendParts(parts []part, line []byte) []part {
	for len(line) > MaxText {
		parts = append(parts, part{text: line[:MaxText], partial: true})
		line = line[MaxText:]
	}
	return append(parts, part{text: line})
}

// append stamps parts with one time and writes them with one write.
func (w *Writer) append(stream string, parts []part) error {
	if len(parts) == 0 {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	now := w.opts.Now().UTC()
	if now.Before(w.lastStamp) {
		now = w.lastStamp // stamps never go back, so sequence and time agree
	}
	w.lastStamp = now
	for _, p := range parts {
		w.buf = AppendRecord(w.buf[:0], Record{Time: now, Stream: stream, Seq: w.next, Partial: p.partial, Text: p.text})
		if w.curFirst == 0 {
			w.curFirst, w.curStart = w.next, now
		}
		w.next++
		if _, err := w.cur.Write(w.buf); err != nil {
			w.err = fmt.Errorf("write log record: %w", err)
			return w.err
		}
		w.curBytes += int64(len(w.buf))
		if w.curBytes >= w.opts.SegmentBytes {
			if err := w.sealLocked(); err != nil {
				w.err = err
				return err
			}
		}
	}
	return nil
}

// SealIfOlder seals the open segment when its first record is at least
// SegmentAge old. The log writer calls it on a timer.
func (w *Writer) SealIfOlder() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.curFirst == 0 || w.opts.Now().Sub(w.curStart) < w.opts.SegmentAge {
		return nil
	}
	return w.sealLocked()
}

// Seal seals the open segment now (nothing when it is empty).
func (w *Writer) Seal() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.sealLocked()
}

// sealLocked compresses the open segment into a sealed one: temporary file,
// fsync, rename, index line, then the open segment is emptied. A crash at any
// point leaves records either in the open segment or in a sealed one; the
// next writer drops those already sealed. mu must be held.
func (w *Writer) sealLocked() error {
	if w.curFirst == 0 {
		return nil
	}
	if _, err := w.cur.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("seal log segment: %w", err)
	}
	tmp, err := os.CreateTemp(w.dir, ".seal-*")
	if err != nil {
		return fmt.Errorf("seal log segment: %w", err)
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	h := sha256.New()
	zw, _ := gzip.NewWriterLevel(io.MultiWriter(tmp, h), gzip.BestSpeed)
	s := Segment{}
	err = scanRecords(w.cur, func(r Record, n int) error {
		if s.Records == 0 {
			s.FirstSeq, s.FirstTime = r.Seq, r.Time
		}
		s.LastSeq, s.LastTime = r.Seq, r.Time
		s.Records++
		s.RawBytes += int64(n)
		w.buf = AppendRecord(w.buf[:0], r)
		_, err := zw.Write(w.buf)
		return err
	})
	if err == nil {
		err = zw.Close()
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("seal log segment: %w", err)
	}
	if _, err := w.cur.Seek(0, io.SeekEnd); err != nil {
		return fmt.Errorf("seal log segment: %w", err)
	}
	if s.Records == 0 {
		return w.resetCurrentLocked()
	}
	st, err := os.Stat(tmp.Name())
	if err != nil {
		return fmt.Errorf("seal log segment: %w", err)
	}
	s.Name, s.Bytes, s.SHA256 = segName(s.FirstSeq, s.LastSeq), st.Size(), hex.EncodeToString(h.Sum(nil))
	if err := os.Rename(tmp.Name(), filepath.Join(w.dir, s.Name)); err != nil {
		return fmt.Errorf("seal log segment: %w", err)
	}
	if err := syncDir(w.dir); err != nil {
		return fmt.Errorf("seal log segment: %w", err)
	}
	if err := appendLine(w.dir, IndexFile, s); err != nil {
		return fmt.Errorf("index log segment: %w", err)
	}
	if err := w.resetCurrentLocked(); err != nil {
		return err
	}
	if w.opts.MaxDiskBytes > 0 {
		if _, err := Prune(w.dir, w.opts.MaxDiskBytes, w.opts.Now()); err != nil {
			return fmt.Errorf("bound log directory: %w", err)
		}
	}
	return nil
}

// Close seals the open segment and releases the directory.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	var err error
	if w.err == nil {
		err = w.sealLocked()
	}
	if cerr := w.cur.Close(); err == nil {
		err = cerr
	}
	_ = w.lock.Close()
	w.err = errors.New("berth: log writer closed")
	return err
}
