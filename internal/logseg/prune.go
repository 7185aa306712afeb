package logseg

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// DropReasonDiskLimit is [Drop.Reason] of a segment the disk bound removed unshipped.
const DropReasonDiskLimit = "disk-limit"

// Prune keeps the sealed segments of dir within maxBytes: it removes the
// oldest shipped segments (those with a "<name>.shipped" marker) first, and
// an unshipped one only when the shipped ones do not free enough; each of
// those is appended to the dropped file and returned. It is safe to run from
// the writer and a shipper at once (it holds an flock while it works).
// maxBytes <= 0 removes nothing.
func Prune(dir string, maxBytes int64, now time.Time) ([]Drop, error) {
	if maxBytes <= 0 {
		return nil, nil
	}
	lock, err := os.OpenFile(filepath.Join(dir, pruneLock), os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return nil, fmt.Errorf("prune log directory: %w", err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return nil, fmt.Errorf("prune log directory: %w", err)
	}
	segs, err := Segments(dir)
	if err != nil {
		return nil, err
	}
	var total int64
	for _, s := range segs {
		total += s.Bytes
	}
	removed := map[string]bool{}
	for _, s := range segs {
		if total <= maxBytes {
			break
		}
		if Shipped(dir, s.Name) {
			if err := removeSegment(dir, s.Name); err != nil {
				return nil, err
			}
			removed[s.Name] = true
			total -= s.Bytes
		}
	}
	var drops []Drop
	for _, s := range segs {
		if total <= maxBytes {
			break
		}
		if removed[s.Name] {
			continue
		}
		d := Drop{Segment: s.Name, FirstSeq: s.FirstSeq, LastSeq: s.LastSeq, Bytes: s.Bytes, At: now.UTC(), Reason: DropReasonDiskLimit}
		// The drop is on record before the segment goes, so it is never silent.
		if err := appendLine(dir, DroppedFile, d); err != nil {
			return drops, fmt.Errorf("record log drop: %w", err)
		}
		if err := removeSegment(dir, s.Name); err != nil {
			return drops, err
		}
		drops = append(drops, d)
		total -= s.Bytes
	}
	return drops, nil
}

// Shipped reports whether segment name of dir carries its shipped marker.
func Shipped(dir, name string) bool {
	_, err := os.Stat(filepath.Join(dir, name+ShippedSuffix))
	return err == nil
}

// MarkShipped records that segment name of dir is safely stored elsewhere.
func MarkShipped(dir, name string) error {
	if !strings.HasSuffix(name, segSuffix) || strings.ContainsRune(name, '/') {
		return fmt.Errorf("mark log segment shipped: bad name %q", name)
	}
	f, err := os.OpenFile(filepath.Join(dir, name+ShippedSuffix), os.O_WRONLY|os.O_CREATE, 0o640)
	if err != nil {
		return fmt.Errorf("mark log segment shipped: %w", err)
	}
	return f.Close()
}

func removeSegment(dir, name string) error {
	if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove log segment: %w", err)
	}
	if err := os.Remove(filepath.Join(dir, name+ShippedSuffix)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove log segment marker: %w", err)
	}
	return nil
}
