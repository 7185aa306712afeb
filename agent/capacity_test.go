package agent

import (
	goruntime "runtime"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/berthhq/berth/abi/node"
)

func TestParseResourceAndReserve(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in    string
		name  string
		count int64
		err   string
	}{
		{"gpu=1", "gpu", 1, ""},
		{"example.com/fpga=0", "example.com/fpga", 0, ""},
		{"gpu", "", 0, "want <name>=<count>"},
		{"GPU=1", "", 0, "lowercase label"},
		{"gpu=-1", "", 0, "whole number"},
		{"gpu=x", "", 0, "whole number"},
	} {
		name, n, err := ParseResource(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseResource(%q) = %v, want an error saying %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || name != tc.name || n != tc.count {
			t.Errorf("ParseResource(%q) = %q, %d, %v", tc.in, name, n, err)
		}
	}
	got, err := ParseReserve("cpu_m=500, memory_mib=512,disk_mib=1024")
	if err != nil || !cmp.Equal(got, node.Allocatable{CPUMilli: 500, MemoryMiB: 512, DiskMiB: 1024}) {
		t.Fatalf("ParseReserve = %+v, %v", got, err)
	}
	for _, bad := range []string{"cpu=500", "cpu_m=-1", "memory_mib", "disk_mib=1x"} {
		if _, err := ParseReserve(bad); err == nil {
			t.Errorf("ParseReserve(%q) accepted", bad)
		}
	}
}

func TestAllocatableSubtractsReserve(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	full := Allocatable(dir, Resources{})
	if full.CPUMilli != int64(goruntime.NumCPU())*1000 || full.MemoryMiB <= 0 || full.DiskMiB <= 0 || full.Extended != nil {
		t.Fatalf("Allocatable without a reserve = %+v", full)
	}
	got := Allocatable(dir, Resources{Extended: map[string]int64{"gpu": 1}, Reserve: node.Allocatable{CPUMilli: 500, MemoryMiB: 256, DiskMiB: 1 << 40}})
	if got.CPUMilli != full.CPUMilli-500 || got.MemoryMiB != full.MemoryMiB-256 || got.DiskMiB != 0 || got.Extended["gpu"] != 1 {
		t.Fatalf("Allocatable with a reserve = %+v (without: %+v); want cpu and memory less the reserve, disk floored at 0, gpu=1", got, full)
	}
}
