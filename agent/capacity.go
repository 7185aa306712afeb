package agent

import (
	"bufio"
	"os"
	goruntime "runtime"
	"strconv"
	"strings"

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
