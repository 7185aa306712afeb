// Command berth-plugin-process is the "process" runtime driver plugin of the
// agent: plain processes supervised through /proc. Launched by the agent, not by hand.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/berthhq/berth/internal/version"
	"github.com/berthhq/berth/nodeplugins/process"
	"github.com/berthhq/berth/sdk/runtime"
)

func main() {
	stateDir := flag.String("state-dir", "", "directory of the driver's workload records (required)")
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *showVersion {
		_ = version.Print(os.Stdout, "berth-plugin-process")
		return
	}

	d, err := process.New(process.Config{StateDir: *stateDir, Logger: runtime.NewLogger(os.Stderr)})
	if err != nil {
		fmt.Fprintf(os.Stderr, "berth-plugin-process: %v\n", err)
		os.Exit(1)
	}
	defer d.Close()
	runtime.Serve(d)
}
