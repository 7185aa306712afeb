package fake_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/berthhq/berth/conformance"
	"github.com/berthhq/berth/nodeplugins/fake"
	"github.com/berthhq/berth/sdk/runtime"
)

// TestConformance runs the runtime-driver suite on the fake driver in
// process (over real gRPC) and as the built binary.
func TestConformance(t *testing.T) {
	t.Parallel()
	t.Run("in-process", func(t *testing.T) {
		conformance.RunRuntimeDriver(t, conformance.RuntimeConfig{
			Factory: func(dir string) (runtime.Driver, error) { return fake.New(fake.Config{StateDir: dir}) },
		})
	})
	t.Run("binary", func(t *testing.T) {
		bin := filepath.Join(os.Getenv("BERTH_BIN_DIR"), "berth-plugin-fake")
		if os.Getenv("BERTH_BIN_DIR") == "" {
			bin = conformance.BuildPlugin(t, "github.com/berthhq/berth/cmd/berth-plugin-fake")
		}
		conformance.RunRuntimeDriver(t, conformance.RuntimeConfig{
			Binary: bin,
			Args:   func(dir string) []string { return []string{"--state-dir", dir} },
		})
	})
}
