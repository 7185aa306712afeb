package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/berthhq/berth/sdk/client"
)

// procInfo is what the test reads of /proc/<pid>/stat: the process group
// and the start time, which tells a live process from a reused pid.
type procInfo struct {
	pgrp  int
	ticks string
}

func readProc(pid int) (procInfo, bool) {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procInfo{}, false
	}
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 20 || f[0] == "Z" || f[0] == "X" {
		return procInfo{}, false
	}
	g, _ := strconv.Atoi(f[2])
	return procInfo{pgrp: g, ticks: f[19]}, true
}

// TestProcessGroupLeftoversEnd is the leaked-children scenario: a process
// workload whose shell leaves children (one of them ignoring SIGTERM) is
// killed with SIGKILL at its shell. The restart first ends the old process
// group, so none of the old processes survive it, and deleting the service
// ends the new group (docs/plugins.md section 3, "The process driver").
func TestProcessGroupLeftoversEnd(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	ctx := context.Background()
	cl.pushBundle(t, env.helloDir, "hello")
	startProcessAgent(t, cl, "a")
	one := 1
	if _, err := cl.c.ApplyService(ctx, "default", "orphans", client.ServiceSpec{
		Bundle: "hello", Replicas: &one,
		Command: []string{"/bin/sh", "-c", `trap "" TERM; sleep 3600 & ./hello; wait`},
	}); err != nil {
		t.Fatal(err)
	}

	// The running workload: its shell leads a group of at least three.
	var wl string
	old := map[int]procInfo{}
	leader := 0
	waitFor(t, converge, "the workload's shell, sleep and server running", func() (bool, string) {
		ws := cl.workloads(t, "orphans")
		if len(ws) != 1 || ws[0].ObservedStatus != "running" {
			return false, fmt.Sprintf("%+v", ws)
		}
		wl = ws[0].ID
		clear(old)
		leader = 0
		for _, pid := range cl.workloadPIDs(t)[wl] {
			if p, ok := readProc(pid); ok {
				old[pid] = p
				if p.pgrp == pid {
					leader = pid
				}
			}
		}
		return leader != 0 && len(old) >= 3, fmt.Sprintf("processes %v, leader %d", old, leader)
	})
	for pid, p := range old {
		if p.pgrp != leader {
			t.Fatalf("process %d of the workload is in group %d, not its shell's %d", pid, p.pgrp, leader)
		}
	}

	// kill -9 of the shell leaves its children behind; the restart must end them.
	if err := syscall.Kill(leader, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, converge, "restarted, with nothing left of the old group", func() (bool, string) {
		var left []int
		for pid, p := range old {
			if now, ok := readProc(pid); ok && now.ticks == p.ticks {
				left = append(left, pid)
			}
		}
		newLeader := 0
		for _, pid := range cl.workloadPIDs(t)[wl] {
			if p, ok := readProc(pid); ok && p.pgrp == pid && pid != leader {
				newLeader = pid
			}
		}
		return len(left) == 0 && newLeader != 0, fmt.Sprintf("old processes left %v, new leader %d", left, newLeader)
	})

	if err := cl.c.DeleteService(ctx, "default", "orphans", nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, converge, "no process of the deleted service left", func() (bool, string) {
		pids := cl.workloadPIDs(t)[wl]
		return len(pids) == 0, fmt.Sprintf("workload %s processes %v", wl, pids)
	})
}
