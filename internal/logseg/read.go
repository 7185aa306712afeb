package logseg

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// readPasses bounds how often [ReadFrom] lists the directory again when a
// segment was sealed while it read.
const readPasses = 4

// ReadFrom calls fn with every record of dir whose sequence is at least from,
// in sequence order: sealed segments first, then the open segment. It returns
// the sequence to ask for next (one past the last record delivered, or from
// when there was none). Sequences a drop removed are simply absent. A segment
// sealed while ReadFrom runs is read in a further pass, so a record is never
// skipped between the open segment and the sealed one; when the writer seals
// faster than that, ReadFrom returns early and the next call goes on where it
// stopped. A segment removed meanwhile is skipped. An error of fn stops the read and is returned.
func ReadFrom(dir string, from int64, fn func(Record) error) (int64, error) {
	next := max(from, 1)
	for pass := 0; pass < readPasses; pass++ {
		segs, err := Segments(dir)
		if err != nil {
			return next, err
		}
		for _, s := range segs {
			if s.LastSeq < next {
				continue
			}
			if next, err = readSegmentFile(dir, s.Name, next, fn); err != nil {
				return next, err
			}
		}
		var cur []Record
		err = readCurrent(dir, func(r Record) error {
			if r.Seq >= next {
				r.Text = append([]byte(nil), r.Text...)
				cur = append(cur, r)
			}
			return nil
		})
		if err != nil {
			return next, err
		}
		if len(cur) > 0 && cur[0].Seq > next {
			// The records in between were sealed meanwhile, unless a drop
			// removed them: read the new segments first. When the writer
			// keeps sealing faster than this reads, stop here and let the
			// caller come back rather than skip them.
			later, err := Segments(dir)
			if err != nil {
				return next, err
			}
			if len(later) > 0 && later[len(later)-1].LastSeq >= next {
				if pass < readPasses-1 {
					continue
				}
				return next, nil
			}
			next = cur[0].Seq // a drop: the records in between are gone
		}
		// Only a run without a hole is delivered: the open segment may have
		// been emptied and refilled while it was read.
		for _, r := range cur {
			if r.Seq != next {
				break
			}
			if err := fn(r); err != nil {
				return next, err
			}
			next = r.Seq + 1
		}
		return next, nil
	}
	return next, nil
}

func readSegmentFile(dir, name string, next int64, fn func(Record) error) (int64, error) {
	f, err := os.Open(filepath.Join(dir, name))
	if errors.Is(err, fs.ErrNotExist) {
		return next, nil // pruned meanwhile
	}
	if err != nil {
		return next, fmt.Errorf("read log segment %s: %w", name, err)
	}
	defer f.Close()
	err = decodeSegment(f, func(r Record, _ int) error {
		if r.Seq < next {
			return nil
		}
		if err := fn(r); err != nil {
			return err
		}
		next = r.Seq + 1
		return nil
	})
	if err != nil {
		return next, fmt.Errorf("read log segment %s: %w", name, err)
	}
	return next, nil
}

func readCurrent(dir string, fn func(Record) error) error {
	f, err := os.Open(filepath.Join(dir, CurrentFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read the open log segment: %w", err)
	}
	defer f.Close()
	err = scanRecords(f, func(r Record, _ int) error { return fn(r) })
	if errors.Is(err, ErrBadRecord) {
		// The writer emptied the open segment while it was read and this
		// read went on in the middle of a new record: what came before it
		// stands, the rest is read next time.
		return nil
	}
	if err != nil {
		return fmt.Errorf("read the open log segment: %w", err)
	}
	return nil
}
