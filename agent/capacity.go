package agent

import (
	"bufio"
	"fmt"
	"maps"
	"os"
	"regexp"
	goruntime "runtime"
	"strconv"
	"strings"
	"syscall"

	"github.com/berthhq/berth/abi/node"
)

// DetectCapacity returns this machine's CPUs (runtime.NumCPU) and memory
// (MemTotal of /proc/meminfo; 0 when unreadable).
func DetectCapacity() node.Resources {
	r := node.Resources{CPUs: goruntime.NumCPU()}
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return r
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "MemTotal:" {
			if kb, err := strconv.ParseInt(fields[1], 10, 64); err == nil {
				r.MemoryMB = kb / 1024
			}
			break
		}
	}
	return r
}

// bootID returns the kernel's boot id, empty when unreadable.
func bootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// Resources is what an operator tells the agent about the node's resources
// (berth-agent run --resource and --reserve): the extended resources it
// declares, and what the host keeps for itself.
type Resources struct {
	// Extended are operator-declared countable resources by name (e.g.
	// "gpu": 1); the node reports them as they are.
	Extended map[string]int64
	// Reserve is what the host keeps for itself and the agent: subtracted from
	// the detected CPU, memory and disk (never below zero). Its Extended is
	// ignored.
	Reserve node.Allocatable
}

// Allocatable returns what this node can give to workloads: its CPUs
// (runtime.NumCPU, in thousandths), its memory (MemTotal) and the size of the
// file system holding dataDir (where volumes live), each less what r
// reserves, and r's extended resources. A quantity that cannot be detected is
// 0 (unknown).
func Allocatable(dataDir string, r Resources) node.Allocatable {
	detected := DetectCapacity()
	out := node.Allocatable{
		CPUMilli:  max(int64(detected.CPUs)*1000-r.Reserve.CPUMilli, 0),
		MemoryMiB: max(detected.MemoryMB-r.Reserve.MemoryMiB, 0),
	}
	var st syscall.Statfs_t
	if dataDir != "" && syscall.Statfs(dataDir, &st) == nil {
		out.DiskMiB = max(int64(st.Blocks)*int64(st.Bsize)>>20-r.Reserve.DiskMiB, 0)
	}
	if len(r.Extended) > 0 {
		out.Extended = maps.Clone(r.Extended)
	}
	return out
}

// ParseResource parses one --resource value, "<name>=<count>" (e.g. "gpu=1"):
// name a lowercase label, optionally after "<domain>/", count a whole number
// from 0.
func ParseResource(s string) (string, int64, error) {
	name, val, ok := strings.Cut(s, "=")
	if !ok || name == "" {
		return "", 0, fmt.Errorf("resource %q: want <name>=<count>, e.g. gpu=1", s)
	}
	if !resourceName.MatchString(name) {
		return "", 0, fmt.Errorf("resource %q: the name must be a lowercase label (a-z, 0-9, '-', '_'), optionally after '<domain>/'", s)
	}
	n, err := strconv.ParseInt(val, 10, 64)
	if err != nil || n < 0 {
		return "", 0, fmt.Errorf("resource %q: the count must be a whole number from 0", s)
	}
	return name, n, nil
}

// resourceName is the form of an extended resource's name (the core checks the same).
var resourceName = regexp.MustCompile(`^([a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?/)?[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?$`)

// ParseReserve parses --reserve, a comma-separated list of cpu_m=<millicores>,
// memory_mib=<MiB> and disk_mib=<MiB> (e.g. "cpu_m=500,memory_mib=512"); ""
// reserves nothing.
func ParseReserve(s string) (node.Allocatable, error) {
	var out node.Allocatable
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	for _, part := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		n, err := strconv.ParseInt(v, 10, 64)
		if !ok || err != nil || n < 0 {
			return out, fmt.Errorf("reserve %q: want <key>=<whole number from 0> with key cpu_m, memory_mib or disk_mib", part)
		}
		switch k {
		case "cpu_m":
			out.CPUMilli = n
		case "memory_mib":
			out.MemoryMiB = n
		case "disk_mib":
			out.DiskMiB = n
		default:
			return out, fmt.Errorf("reserve %q: unknown key %q (cpu_m, memory_mib or disk_mib)", part, k)
		}
	}
	return out, nil
}
