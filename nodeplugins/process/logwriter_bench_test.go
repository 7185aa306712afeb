package process

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/berthhq/berth/internal/logseg"
	"github.com/berthhq/berth/nodeplugins/logwriter"
	"github.com/berthhq/berth/sdk/runtime"
)

// floodN is how many lines the flood workload writes, each of about 100
// bytes with one write call, as a logger that flushes every line does.
const floodN = "FLOOD_N"

func floodLines() int {
	n, _ := strconv.Atoi(os.Getenv(floodN))
	line := make([]byte, 0, 128)
	for i := 1; i <= n; i++ {
		line = fmt.Appendf(line[:0], "level=info msg=\"request served\" n=%d path=/api/v1/things status=200 took=1.2ms\n", i)
		if _, err := os.Stdout.Write(line); err != nil {
			return 1
		}
	}
	return 0
}

// BenchmarkLogWriter measures lines per second a workload writes through its
// log writer (stamped, sealed and compressed, until the last segment is
// sealed) against the same workload writing to a file directly; the goal is
// a ratio of at least 0.8 (bench/goals.tsv).
func BenchmarkLogWriter(b *testing.B) {
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	const lines = 200_000
	var direct, through time.Duration
	for i := 0; i < b.N; i++ {
		dir := b.TempDir()
		f, err := os.Create(filepath.Join(dir, "direct.log"))
		if err != nil {
			b.Fatal(err)
		}
		cmd := exec.Command(exe)
		cmd.Env = append(os.Environ(), modeEnv+"=flood", floodN+"="+strconv.Itoa(lines))
		cmd.Stdout, cmd.Stderr = f, f
		start := time.Now()
		if err := cmd.Run(); err != nil {
			b.Fatal(err)
		}
		direct += time.Since(start)
		f.Close()

		d, err := New(Config{StateDir: filepath.Join(dir, "state"), LogWriter: []string{exe, logwriter.Command}})
		if err != nil {
			b.Fatal(err)
		}
		start = time.Now()
		_, err = d.Start(context.Background(), &runtime.StartRequest{WorkloadID: "wl_flood", Command: []string{exe}, WorkDir: dir,
			Env: map[string]string{modeEnv: "flood", floodN: strconv.Itoa(lines)}, LogPath: filepath.Join(dir, "output.log")})
		if err != nil {
			b.Fatal(err)
		}
		for {
			st, err := d.Inspect(context.Background(), &runtime.InspectRequest{WorkloadID: "wl_flood"})
			if err != nil {
				b.Fatal(err)
			}
			if st.State == runtime.StateExited {
				break
			}
			time.Sleep(time.Millisecond)
		}
		d.mu.Lock()
		rec := d.workloads["wl_flood"].rec
		d.mu.Unlock()
		awaitLogWriter(context.Background(), rec)
		through += time.Since(start)
		d.Close()
		var n int
		if _, err := logseg.ReadFrom(logseg.DirOf(filepath.Join(dir, "output.log")), 1, func(logseg.Record) error { n++; return nil }); err != nil || n != lines {
			b.Fatalf("the writer kept %d of %d lines: %v", n, lines, err)
		}
	}
	directRate := float64(lines*b.N) / direct.Seconds()
	writerRate := float64(lines*b.N) / through.Seconds()
	b.ReportMetric(directRate, "file_lines/s")
	b.ReportMetric(writerRate, "writer_lines/s")
	b.ReportMetric(writerRate/directRate, "writer_vs_file_ratio")
}
