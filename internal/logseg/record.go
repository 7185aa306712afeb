// Package logseg is the on-disk format of a workload's stamped output: records
// stamped when written, sealed into compressed segments with an index (docs/logs.md).
//
// One log directory holds one workload's output. A [Writer] (in the per-workload
// log writer process) appends records to the open segment and seals it; [Read]
// and [Follow] (the agent, the driver's Logs) read closed segments and the open
// one in sequence order; [Prune] keeps the directory under its disk bound.
package logseg

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Streams a record comes from.
const (
	Stdout = "stdout"
	Stderr = "stderr"
)

// Tags of a record (docs/logs.md section 2).
const (
	TagFull    = 'F' // the record's text ends its line
	TagPartial = 'P' // the line continues in a later record of the same stream
)

// MaxText is the most bytes of line text one record carries; a longer line is
// split into records tagged P, the last one F (docs/logs.md section 2).
const MaxText = 16 << 10

// TimeLayout is the layout of a record's stamp: RFC 3339 in UTC with exactly
// nine digits of fraction, so stamps sort as text.
const TimeLayout = "2006-01-02T15:04:05.000000000Z"

// Record is one stamped piece of a workload's output.
type Record struct {
	Time    time.Time // when the log writer read it from the workload, UTC
	Stream  string    // Stdout or Stderr
	Seq     int64     // from 1, one more than the record before it in this log directory
	Partial bool      // reports whether the line continues in a later record (tag P)
	Text    []byte    // line text without its newline, at most MaxText bytes
}

// ErrBadRecord is returned (wrapped) by [Parse] for a line that is not a record.
var ErrBadRecord = errors.New("berth: not a log record")

// AppendRecord appends r in the record format, newline included, to b.
func AppendRecord(b []byte, r Record) []byte {
	b = r.Time.UTC().AppendFormat(b, TimeLayout)
	b = append(b, ' ')
	b = append(b, r.Stream...)
	b = append(b, ' ')
	b = strconv.AppendInt(b, r.Seq, 10)
	if r.Partial {
		b = append(b, ' ', TagPartial, ' ')
	} else {
		b = append(b, ' ', TagFull, ' ')
	}
	b = append(b, r.Text...)
	return append(b, '\n')
}

// Parse decodes one record from line (without its newline). Text aliases line.
// It returns an error wrapping [ErrBadRecord] for anything else.
func Parse(line []byte) (Record, error) {
	var r Record
	f := line
	next := func() ([]byte, bool) {
		i := bytes.IndexByte(f, ' ')
		if i < 0 {
			return nil, false
		}
		tok := f[:i]
		f = f[i+1:]
		return tok, true
	}
	ts, ok := next()
	if !ok || len(ts) != len(TimeLayout) {
		return r, fmt.Errorf("%w: bad time", ErrBadRecord)
	}
	t, err := time.Parse(TimeLayout, string(ts))
	if err != nil {
		return r, fmt.Errorf("%w: %w", ErrBadRecord, err)
	}
	st, ok := next()
	if !ok || (string(st) != Stdout && string(st) != Stderr) {
		return r, fmt.Errorf("%w: bad stream", ErrBadRecord)
	}
	sq, ok := next()
	if !ok {
		return r, fmt.Errorf("%w: no sequence", ErrBadRecord)
	}
	seq, err := strconv.ParseInt(string(sq), 10, 64)
	if err != nil || seq < 1 {
		return r, fmt.Errorf("%w: bad sequence", ErrBadRecord)
	}
	if len(f) < 2 || (f[0] != TagFull && f[0] != TagPartial) || f[1] != ' ' {
		return r, fmt.Errorf("%w: bad tag", ErrBadRecord)
	}
	r.Time, r.Seq, r.Partial, r.Text = t, seq, f[0] == TagPartial, f[2:]
	if string(st) == Stdout {
		r.Stream = Stdout
	} else {
		r.Stream = Stderr
	}
	return r, nil
}
