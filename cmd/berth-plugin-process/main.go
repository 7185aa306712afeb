// Command berth-plugin-process is the "process" runtime driver plugin of the
// agent: plain processes supervised through /proc. Launched by the agent, not by hand.
// `berth-plugin-process logwriter` is the per-workload log writer the driver
// starts for each workload (docs/logs.md section 4).
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/berthhq/berth/internal/version"
	"github.com/berthhq/berth/nodeplugins/logwriter"
	"github.com/berthhq/berth/nodeplugins/process"
	"github.com/berthhq/berth/sdk/runtime"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == logwriter.Command {
		os.Exit(logwriter.Main(os.Args[2:]))
	}
	stateDir := flag.String("state-dir", "", "directory of the driver's workload records (required)")
	logWriter := flag.Bool("log-writer", true, "give each workload a log writer process that stamps its output into segments (docs/logs.md); false appends it to one file")
	segBytes := flag.Int64("log-segment-bytes", 0, "bytes of records that seal a log segment (0: 4 MiB)")
	segAge := flag.Duration("log-segment-age", 0, "age of a log segment's first record that seals it (0: 5m)")
	maxDisk := flag.Int64("log-max-disk-bytes", 0, "bytes of sealed log segments kept per workload, shipped ones dropped first (0: 256 MiB)")
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *showVersion {
		_ = version.Print(os.Stdout, "berth-plugin-process")
		return
	}
	cfg := process.Config{StateDir: *stateDir, Logger: runtime.NewLogger(os.Stderr),
		LogSegmentBytes: *segBytes, LogSegmentAge: *segAge, LogMaxDiskBytes: *maxDisk}
	if *logWriter {
		exe, err := os.Executable()
		if err != nil {
			fmt.Fprintf(os.Stderr, "berth-plugin-process: find own binary for the log writer: %v\n", err)
			os.Exit(1)
		}
		cfg.LogWriter = []string{exe, logwriter.Command}
	}
	d, err := process.New(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "berth-plugin-process: %v\n", err)
		os.Exit(1)
	}
	defer d.Close()
	runtime.Serve(d)
}
