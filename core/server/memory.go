package server

import (
	"bufio"
	"os"
	"strconv"
	"strings"
)

// machineMemory is the memory berthd may use, in bytes: MemTotal of /proc/meminfo, or the
// cgroup v2 limit (/sys/fs/cgroup/memory.max) when that is lower; 0 when neither is readable.
func machineMemory() uint64 {
	var total uint64
	if f, err := os.Open("/proc/meminfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) >= 2 && fields[0] == "MemTotal:" {
				if kb, err := strconv.ParseUint(fields[1], 10, 64); err == nil {
					total = kb * 1024
				}
				break
			}
		}
		_ = f.Close()
	}
	if raw, err := os.ReadFile("/sys/fs/cgroup/memory.max"); err == nil {
		if limit, err := strconv.ParseUint(strings.TrimSpace(string(raw)), 10, 64); err == nil && (total == 0 || limit < total) {
			total = limit
		}
	}
	return total
}
