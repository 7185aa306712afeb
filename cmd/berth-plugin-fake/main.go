// Command berth-plugin-fake is the "fake" runtime driver plugin of the agent:
// a deterministic driver for tests (see nodeplugins/fake). Launched by the agent, not by hand.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/berthhq/berth/internal/version"
	"github.com/berthhq/berth/nodeplugins/fake"
	"github.com/berthhq/berth/sdk/runtime"
)

func main() {
	stateDir := flag.String("state-dir", "", "directory of the driver's records, log and fault file (required)")
	logPath := flag.String("log", "", "start/stop log (default: STATE_DIR/driver.log)")
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *showVersion {
		_ = version.Print(os.Stdout, "berth-plugin-fake")
		return
	}

	d, err := fake.New(fake.Config{StateDir: *stateDir, LogPath: *logPath,
		FailForcedStop: fake.ParseFailForcedStop(os.Getenv(fake.EnvFailForcedStop)),
		Logger:         runtime.NewLogger(os.Stderr)})
	if err != nil {
		fmt.Fprintf(os.Stderr, "berth-plugin-fake: %v\n", err)
		os.Exit(1)
	}
	defer d.Close()
	runtime.Serve(d)
}
