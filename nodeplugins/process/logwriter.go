package process

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/berthhq/berth/internal/logseg"
)

// LogWriterCommand is the hidden subcommand of the driver's binary that runs
// one workload's log writer: `berth-plugin-process logwriter --dir DIR ...`
// (docs/logs.md section 4).
const LogWriterCommand = "logwriter"

// partialWait is how long text without its newline waits for more output
// before the log writer writes it as a record tagged P.
const partialWait = 250 * time.Millisecond

// writerWait bounds how long Stop waits for a workload's log writer to seal
// its last segment once the workload's process group is gone.
const writerWait = 5 * time.Second

// LogWriterMain is the body of the log writer process (args without the
// subcommand): it reads the workload's stdout from fd 3 and its stderr from
// fd 4, stamps and writes them into the log directory --dir with
// internal/logseg, and exits 0 once both are closed and the open segment is
// sealed. It ignores SIGTERM, SIGINT and SIGHUP: it ends with the
// workload's output, never before it, so the workload never writes into a
// closed pipe. A write error is reported on stderr once and the output read
// after it is discarded, so the workload never blocks on a full pipe.
func LogWriterMain(args []string) int {
	fs := flag.NewFlagSet(LogWriterCommand, flag.ContinueOnError)
	dir := fs.String("dir", "", "log directory (required)")
	segBytes := fs.Int64("segment-bytes", 0, "record bytes that seal a segment (0: default)")
	segAge := fs.Duration("segment-age", 0, "age of a segment's first record that seals it (0: default)")
	maxDisk := fs.Int64("max-disk-bytes", 0, "bytes of sealed segments kept (0: default, negative: unbounded)")
	if err := fs.Parse(args); err != nil || *dir == "" {
		fmt.Fprintln(os.Stderr, "logwriter: --dir is required")
		return 2
	}
	signal.Ignore(syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGPIPE)
	opts := logseg.WriterOptions{SegmentBytes: *segBytes, SegmentAge: *segAge, MaxDiskBytes: *maxDisk}
	w, err := logseg.OpenWriter(*dir, opts)
	// A previous run's writer may still be sealing its last segment.
	for deadline := time.Now().Add(writerWait); errors.Is(err, logseg.ErrWriterHeld) && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		w, err = logseg.OpenWriter(*dir, opts)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "logwriter: %v\n", err)
		// Keep draining, so the workload does not block or die of SIGPIPE.
		w = nil
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

// logWriter is a started log writer: its pid and start time, and the write
// ends of the pipes the workload gets as stdout and stderr.
type logWriter struct {
	pid            int
	ticks          uint64
	stdout, stderr *os.File
}

// startLogWriter starts the log writer of a workload on dir. The caller hands
// lw.stdout and lw.stderr to the workload and closes them after its start;
// closing them without a start makes the log writer exit.
func (d *Driver) startLogWriter(dir string) (*logWriter, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("create log directory: %w", err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("log pipe: %w", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, fmt.Errorf("log pipe: %w", err)
	}
	diag, err := os.OpenFile(dir+"/writer.err", os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		for _, f := range []*os.File{outR, outW, errR, errW} {
			f.Close()
		}
		return nil, fmt.Errorf("log writer diagnostics: %w", err)
	}
	defer diag.Close()
	argv := append([]string{}, d.cfg.LogWriter...)
	argv = append(argv, "--dir", dir,
		"--segment-bytes", strconv.FormatInt(d.cfg.LogSegmentBytes, 10),
		"--segment-age", d.cfg.LogSegmentAge.String(),
		"--max-disk-bytes", strconv.FormatInt(d.cfg.LogMaxDiskBytes, 10))
	cmd := &exec.Cmd{
		Path:       argv[0],
		Args:       argv,
		Env:        os.Environ(),
		Stderr:     diag,
		Stdout:     diag,
		ExtraFiles: []*os.File{outR, errR},
		// Its own session: it outlives the driver and the agent like the
		// workload does, and no signal to the workload's group reaches it.
		SysProcAttr: &syscall.SysProcAttr{Setsid: true},
	}
	err = cmd.Start()
	outR.Close()
	errR.Close()
	if err != nil {
		outW.Close()
		errW.Close()
		return nil, fmt.Errorf("start log writer: %w", err)
	}
	st, _ := readProcStat(cmd.Process.Pid)
	go func() { _ = cmd.Wait() }() // reaped by this driver life; a later one finds it reparented
	return &logWriter{pid: cmd.Process.Pid, ticks: st.StartTicks, stdout: outW, stderr: errW}, nil
}

// awaitLogWriter waits, up to writerWait, for the log writer of r to seal its
// last segment and exit; the workload's group is gone by then, so its
// output has ended.
func awaitLogWriter(ctx context.Context, r record) {
	if r.WriterPID <= 0 {
		return
	}
	deadline := time.Now().Add(writerWait)
	for alive(r.WriterPID, r.WriterTicks) && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(procPollInterval)
	}
}
