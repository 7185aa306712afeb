package process_test

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/berthhq/berth/abi/pluginapi"
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

// notOutliving is the process driver declaring outlives_driver false.
// When honest, its Close ends every workload first, as such a driver must;
// otherwise its workloads outlive it, which the suite must catch.
type notOutliving struct {
	*process.Driver
	honest bool
}

func (d notOutliving) Describe(ctx context.Context) (*runtime.DescribeResponse, error) {
	r, err := d.Driver.Describe(ctx)
	if err != nil {
		return nil, err
	}
	c := *r
	c.Capabilities.OutlivesDriver = false
	return &c, nil
}

func (d notOutliving) Close() error {
	if d.honest {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		list, err := d.List(ctx)
		if err != nil {
			return err
		}
		for _, w := range list {
			_, _ = d.Stop(ctx, &runtime.StopRequest{WorkloadID: w.WorkloadID, Mode: runtime.StopForced,
				Mutation: pluginapi.Mutation{IdempotencyKey: "close-" + w.WorkloadID, FencingToken: math.MaxUint32}})
		}
	}
	return d.Driver.Close()
}

// TestConformanceCatchesWorkloadsOutlivingTheirDriver: restart_recover
// fails a driver that declares outlives_driver false but leaves its
// workloads running when the host stops it, and passes one that ends them.
func TestConformanceCatchesWorkloadsOutlivingTheirDriver(t *testing.T) {
	t.Parallel()
	for _, honest := range []bool{false, true} {
		var dirs []string
		rep, err := conformance.CheckRuntimeDriver(t.Context(), conformance.RuntimeConfig{
			Factory: func(dir string) (runtime.Driver, error) {
				dirs = append(dirs, dir)
				d, err := process.New(process.Config{StateDir: dir})
				if err != nil {
					return nil, err
				}
				return notOutliving{Driver: d, honest: honest}, nil
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range dirs {
			if err := process.RemoveCgroups(context.Background(), d); err != nil {
				t.Errorf("remove cgroups of %s: %v", d, err)
			}
		}
		want := []string{"restart_recover"}
		if honest {
			want = nil
		}
		if got := rep.Failed(); !slices.Equal(got, want) {
			for _, r := range rep.Results {
				t.Logf("%s %s %v", r.Name, r.Status, r.Messages)
			}
			t.Errorf("honest=%v: failed cases %v; want %v", honest, got, want)
		}
	}
}
