// Package logwriter is the per-workload log writer process the runtime drivers start (the
// process driver directly, the containerd driver as the shim's binary logger), and the
// rendering of its records back into the output a workload wrote (docs/logs.md section 4).
package logwriter

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/berthhq/berth/internal/logseg"
	"github.com/berthhq/berth/sdk/runtime"
)

// followInterval is how often Render with Follow looks for new records.
const followInterval = 100 * time.Millisecond

// Command is the hidden subcommand of a driver's binary that runs one
// workload's log writer: `berth-plugin-process logwriter --dir DIR ...`
// (docs/logs.md section 4).
const Command = "logwriter"

// heldWait bounds how long a new log writer waits for the previous one of the
// same directory (a run restarted in place) to seal its last segment.
const heldWait = 5 * time.Second

// ShimEnv names the variables containerd's shim sets, and only it, when it
// starts a binary logger (`binary://` log URIs): a driver's main runs [Main]
// when both are set (see [StartedByShim]).
var ShimEnv = [2]string{"CONTAINER_ID", "CONTAINER_NAMESPACE"}

// StartedByShim reports whether this process was started by containerd's
// shim as a binary logger: the shim passes only CONTAINER_ID and
// CONTAINER_NAMESPACE in the environment and the logger's flags in an order
// it does not keep, so the subcommand cannot lead the arguments.
func StartedByShim() bool {
	return os.Getenv(ShimEnv[0]) != "" && os.Getenv(ShimEnv[1]) != ""
}

// partialWait is how long text without its newline waits for more output
// before the log writer writes it as a record tagged P.
const partialWait = 250 * time.Millisecond

// Main is the body of the log writer process (args without the subcommand,
// flags in any order): it reads the workload's stdout from fd 3 and its stderr from
// fd 4, stamps and writes them into the log directory --dir with
// internal/logseg, and exits 0 once both are closed and the open segment is
// sealed. It ignores SIGTERM, SIGINT and SIGHUP: it ends with the
// workload's output, never before it, so the workload never writes into a
// closed pipe. A write error is reported on stderr once and the output read
// after it is discarded, so the workload never blocks on a full pipe.
//
// With --ready-fd N (containerd's shim passes a pipe as fd 5) it closes fd N
// once the log directory is open, or could not be: the shim waits for that
// before it starts the workload.
func Main(args []string) int {
	fs := flag.NewFlagSet(Command, flag.ContinueOnError)
	dir := fs.String("dir", "", "log directory (required)")
	segBytes := fs.Int64("segment-bytes", 0, "record bytes that seal a segment (0: default)")
	segAge := fs.Duration("segment-age", 0, "age of a segment's first record that seals it (0: default)")
	maxDisk := fs.Int64("max-disk-bytes", 0, "bytes of sealed segments kept (0: default, negative: unbounded)")
	readyFD := fs.Int("ready-fd", 0, "a descriptor to close once ready (containerd's binary logger protocol: 5); 0: none")
	if err := fs.Parse(args); err != nil || *dir == "" {
		fmt.Fprintln(os.Stderr, "logwriter: --dir is required")
		return 2
	}
	signal.Ignore(syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGPIPE)
	opts := logseg.WriterOptions{SegmentBytes: *segBytes, SegmentAge: *segAge, MaxDiskBytes: *maxDisk}
	w, err := logseg.OpenWriter(*dir, opts)
	// A previous run's writer may still be sealing its last segment.
	for deadline := time.Now().Add(heldWait); errors.Is(err, logseg.ErrWriterHeld) && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		w, err = logseg.OpenWriter(*dir, opts)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "logwriter: %v\n", err)
		// Keep draining, so the workload does not block or die of SIGPIPE.
		w = nil
	}
	if *readyFD > 2 {
		_ = syscall.Close(*readyFD)
	}
	var wg sync.WaitGroup
	for i, name := range []string{logseg.Stdout, logseg.Stderr} {
		fd := 3 + i
		_ = syscall.SetNonblock(fd, true) // lets the runtime poller give reads a deadline
		f := os.NewFile(uintptr(fd), name)
		if f == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			pump(f, w, name)
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	if w == nil {
		<-done
		return 1
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-done:
			if err := w.Close(); err != nil {
				fmt.Fprintf(os.Stderr, "logwriter: seal the last segment: %v\n", err)
				return 1
			}
			return 0
		case <-tick.C:
			if err := w.SealIfOlder(); err != nil {
				fmt.Fprintf(os.Stderr, "logwriter: seal a segment: %v\n", err)
			}
		}
	}
}

// pump copies one stream into w until it ends.
func pump(f *os.File, w *logseg.Writer, name string) {
	defer f.Close()
	var s *logseg.StreamWriter
	if w != nil {
		s = w.Stream(name)
	}
	reported := false
	buf := make([]byte, 64<<10)
	for {
		if s != nil && s.Pending() {
			_ = f.SetReadDeadline(time.Now().Add(partialWait))
		} else {
			_ = f.SetReadDeadline(time.Time{})
		}
		n, err := f.Read(buf)
		if n > 0 && s != nil {
			if _, werr := s.Write(buf[:n]); werr != nil && !reported {
				fmt.Fprintf(os.Stderr, "logwriter: %s: %v (further output is discarded)\n", name, werr)
				reported = true
			}
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			if s != nil {
				_ = s.Flush()
			}
			continue
		}
		if err != nil {
			if s != nil {
				_ = s.Flush()
			}
			if !errors.Is(err, io.EOF) {
				fmt.Fprintf(os.Stderr, "logwriter: read %s: %v\n", name, err)
			}
			return
		}
	}
}

// Render is a driver's Logs of a workload with a log writer: the records of dir
// rendered as the output the workload wrote (each record's text, with a
// newline after those that end their line), its last TailBytes when
// positive, then with Follow new records as they are written.
func Render(ctx context.Context, req *runtime.LogsRequest, dir string, w io.Writer) error {
	from := int64(1)
	if req.TailBytes > 0 {
		// Start at the newest segments that hold the tail, then cut the front.
		segs, err := logseg.Segments(dir)
		if err != nil {
			return fmt.Errorf("logs of workload %s: %w", req.WorkloadID, err)
		}
		var raw int64
		for i := len(segs) - 1; i >= 0 && raw < req.TailBytes; i-- {
			raw += segs[i].RawBytes
			from = segs[i].FirstSeq
		}
		if len(segs) > 0 && raw < req.TailBytes {
			from = 1
		}
	}
	var out []byte
	next, err := logseg.ReadFrom(dir, from, func(r logseg.Record) error {
		out = appendText(out, r)
		return nil
	})
	if err != nil {
		return fmt.Errorf("logs of workload %s: %w", req.WorkloadID, err)
	}
	if req.TailBytes > 0 && int64(len(out)) > req.TailBytes {
		out = out[int64(len(out))-req.TailBytes:]
	}
	if _, err := w.Write(out); err != nil || !req.Follow {
		return err
	}
	t := time.NewTicker(followInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		out = out[:0]
		if next, err = logseg.ReadFrom(dir, next, func(r logseg.Record) error {
			out = appendText(out, r)
			return nil
		}); err != nil {
			return fmt.Errorf("logs of workload %s: %w", req.WorkloadID, err)
		}
		if len(out) > 0 {
			if _, err := w.Write(out); err != nil {
				return err
			}
		}
	}
}

// appendText appends r's text as the workload wrote it.
func appendText(b []byte, r logseg.Record) []byte {
	b = append(b, r.Text...)
	if !r.Partial {
		b = append(b, '\n')
	}
	return b
}
