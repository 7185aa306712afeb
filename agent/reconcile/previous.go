package reconcile

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/berthhq/berth/internal/logseg"
)

// Limits of the output kept of removed workloads (docs/node-protocol.md section 5.17).
const (
	PreviousLogBytes = 64 << 10 // the newest bytes of a removed workload's output that are kept
	PreviousLogFiles = 64       // how many removed workloads' output is kept, newest first
)

// PreviousRecordsPath is where the newest stamped records of removed workload id are kept
// under dataDir, in the record format of docs/logs.md section 2, when its driver stamped them.
func PreviousRecordsPath(dataDir, id string) string {
	return filepath.Join(dataDir, "previous-logs", id+".records")
}

// keepPreviousRecords keeps the newest [PreviousLogBytes] of the records in log directory dir
// at [PreviousRecordsPath], written to a temporary file and renamed.
func keepPreviousRecords(dataDir, id, dir string) error {
	var all []byte
	if _, err := logseg.ReadFrom(dir, 1, func(r logseg.Record) error {
		all = logseg.AppendRecord(all, r)
		if len(all) > 2*PreviousLogBytes {
			all = append(all[:0], all[len(all)-PreviousLogBytes:]...)
		}
		return nil
	}); err != nil {
		return fmt.Errorf("keep output of %s: %w", id, err)
	}
	if len(all) > PreviousLogBytes {
		all = all[len(all)-PreviousLogBytes:]
		if i := slices.Index(all, '\n'); i >= 0 {
			all = all[i+1:] // whole records only
		}
	}
	dst := PreviousRecordsPath(dataDir, id)
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return fmt.Errorf("keep output of %s: %w", id, err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".keep-*")
	if err != nil {
		return fmt.Errorf("keep output of %s: %w", id, err)
	}
	_, err = tmp.Write(all)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), dst)
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("keep output of %s: %w", id, err)
	}
	return prunePrevious(filepath.Dir(dst))
}

// PreviousLogPath is where the output of removed workload id is kept under dataDir.
func PreviousLogPath(dataDir, id string) string {
	return filepath.Join(dataDir, "previous-logs", id+".log")
}

// KeepPreviousLog copies the newest [PreviousLogBytes] of logPath, the output of workload id
// about to be removed, to [PreviousLogPath], so `berth logs SERVICE --previous` can read the
// attempt before the one a slot runs now; it then keeps only the [PreviousLogFiles] newest such
// files. A missing logPath keeps nothing and is no error. The copy is written to a temporary
// file and renamed, so a reader never sees half of it.
func KeepPreviousLog(dataDir, id, logPath string) error {
	if _, err := os.Stat(logseg.DirOf(logPath)); err == nil {
		return keepPreviousRecords(dataDir, id, logseg.DirOf(logPath))
	}
	src, err := os.Open(logPath)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("keep output of %s: %w", id, err)
	}
	defer func() { _ = src.Close() }()
	if st, err := src.Stat(); err == nil && st.Size() > PreviousLogBytes {
		if _, err := src.Seek(st.Size()-PreviousLogBytes, io.SeekStart); err != nil {
			return fmt.Errorf("keep output of %s: %w", id, err)
		}
	}
	dst := PreviousLogPath(dataDir, id)
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return fmt.Errorf("keep output of %s: %w", id, err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".keep-*")
	if err != nil {
		return fmt.Errorf("keep output of %s: %w", id, err)
	}
	_, err = io.Copy(tmp, io.LimitReader(src, PreviousLogBytes))
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), dst)
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("keep output of %s: %w", id, err)
	}
	return prunePrevious(filepath.Dir(dst))
}

// prunePrevious removes the oldest kept outputs beyond [PreviousLogFiles].
func prunePrevious(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("prune kept outputs: %w", err)
	}
	type kept struct {
		name string
		mod  int64
	}
	var all []kept
	for _, e := range ents {
		if !(strings.HasSuffix(e.Name(), ".log") || strings.HasSuffix(e.Name(), ".records")) || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if info, err := e.Info(); err == nil {
			all = append(all, kept{e.Name(), info.ModTime().UnixNano()})
		}
	}
	if len(all) <= PreviousLogFiles {
		return nil
	}
	slices.SortFunc(all, func(a, b kept) int {
		if c := cmp.Compare(b.mod, a.mod); c != 0 {
			return c
		}
		return strings.Compare(a.name, b.name)
	})
	for _, k := range all[PreviousLogFiles:] {
		if err := os.Remove(filepath.Join(dir, k.name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("prune kept outputs: %w", err)
		}
	}
	return nil
}

// PendingLogsDir is where the log directories of removed workloads wait until their segments
// are shipped (docs/logs.md section 6).
func PendingLogsDir(dataDir string) string { return filepath.Join(dataDir, "logs-pending") }

// KeepForShipping moves the log directory of removed workload id (inside its workload
// directory, about to be deleted) to [PendingLogsDir], so its unshipped segments outlive the
// workload until the shipper has them stored by berthd. A directory with nothing unshipped is
// left to be deleted.
func KeepForShipping(dataDir, id string) error {
	src := LogDir(dataDir, id)
	segs, err := logseg.Segments(src)
	if err != nil || !slices.ContainsFunc(segs, func(s logseg.Segment) bool { return !logseg.Shipped(src, s.Name) }) {
		return err
	}
	dst := filepath.Join(PendingLogsDir(dataDir), id)
	if err := os.MkdirAll(PendingLogsDir(dataDir), 0o700); err != nil {
		return fmt.Errorf("keep log of %s for shipping: %w", id, err)
	}
	if err := os.RemoveAll(dst); err != nil {
		return fmt.Errorf("keep log of %s for shipping: %w", id, err)
	}
	if err := os.Rename(src, dst); err != nil {
		return fmt.Errorf("keep log of %s for shipping: %w", id, err)
	}
	return nil
}
