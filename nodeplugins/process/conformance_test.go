package process_test

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/berthhq/berth/conformance"
	"github.com/berthhq/berth/nodeplugins/process"
	"github.com/berthhq/berth/sdk/runtime"
)

// TestConformance runs the runtime-driver suite on the process driver in
// process (over real gRPC) and as the built binary.
func TestConformance(t *testing.T) {
	t.Parallel()
	// Runs after every case ended its workloads: drop the cgroups the
	// drivers made for them.
	var mu sync.Mutex
	var dirs []string
	used := func(dir string) string {
		mu.Lock()
		dirs = append(dirs, dir)
		mu.Unlock()
		return dir
	}
	t.Cleanup(func() {
		for _, d := range dirs {
			if err := process.RemoveCgroups(context.Background(), d); err != nil {
				t.Errorf("remove cgroups of %s: %v", d, err)
			}
		}
	})
	t.Run("in-process", func(t *testing.T) {
		conformance.RunRuntimeDriver(t, conformance.RuntimeConfig{
			// The suite closes the driver at the end of each case.
			Factory: func(dir string) (runtime.Driver, error) { return process.New(process.Config{StateDir: used(dir)}) },
		})
	})
	t.Run("binary", func(t *testing.T) {
		bin := filepath.Join(os.Getenv("BERTH_BIN_DIR"), "berth-plugin-process")
		if os.Getenv("BERTH_BIN_DIR") == "" {
			bin = conformance.BuildPlugin(t, "github.com/berthhq/berth/cmd/berth-plugin-process")
		}
		conformance.RunRuntimeDriver(t, conformance.RuntimeConfig{
			Binary: bin,
			Args:   func(dir string) []string { return []string{"--state-dir", used(dir)} },
		})
	})
}
