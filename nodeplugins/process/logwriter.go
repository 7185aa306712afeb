package process

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"
)

// writerWait bounds how long Stop waits for a workload's log writer to seal
// its last segment once the workload's process group is gone.
const writerWait = 5 * time.Second

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
