package plugin_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/berthhq/berth/host/plugin"
)

// BenchmarkLaunchToReady measures a provider launch: checksum, process
// start, handshake, Describe, ValidateConfig and Configure.
func BenchmarkLaunchToReady(b *testing.B) {
	path := filepath.Join(binDir, "berth-plugin-gateway")
	sum := sha256Bench(b, path)
	var total time.Duration
	for b.Loop() {
		start := time.Now()
		p, err := plugin.LaunchProvider(context.Background(), plugin.Config{
			Name: "gateway", Path: path, SHA256: sum, Args: []string{"--listen", "127.0.0.1:0"},
		})
		if err != nil {
			b.Fatal(err)
		}
		total += time.Since(start)
		b.StopTimer()
		p.Close()
		b.StartTimer()
	}
	b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/launch")
}

// BenchmarkUnaryCall measures List on the process driver through the
// supervised handle and a real plugin process, from 1 and 8 callers.
func BenchmarkUnaryCall(b *testing.B) {
	path := filepath.Join(binDir, "berth-plugin-process")
	d, err := plugin.LaunchDriver(context.Background(), plugin.Config{
		Name: "process", Path: path, Args: []string{"--state-dir", b.TempDir()},
	})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	for _, callers := range []int{1, 8} {
		b.Run(map[int]string{1: "sequential", 8: "callers8"}[callers], func(b *testing.B) {
			ctx := context.Background()
			start := time.Now()
			var wg sync.WaitGroup
			per := b.N/callers + 1
			for range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range per {
						if _, err := d.List(ctx); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.ReportMetric(float64(per*callers)/time.Since(start).Seconds(), "calls/s")
		})
	}
}

func sha256Bench(b *testing.B, path string) string {
	b.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		b.Fatal(err)
	}
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:])
}
