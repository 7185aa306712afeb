package runtime

import abiruntime "github.com/berthhq/berth/abi/runtime"

// FenceWorkload is [abiruntime.FenceWorkload]: the fence resource and lock
// name of one workload.
func FenceWorkload(workloadID string) string { return abiruntime.FenceWorkload(workloadID) }

// FenceLease is [abiruntime.FenceLease]: the fence resource of a lease.
func FenceLease(leaseID string) string { return abiruntime.FenceLease(leaseID) }

// FenceOf returns the resource a Start or Stop request's fencing token is
// about: fenceResource when set, else the workload itself. A driver passes
// it to guard.MutateFenced with [FenceWorkload] as the resource changed
// (docs/plugins.md section 3.4).
func FenceOf(workloadID, fenceResource string) string {
	if fenceResource != "" {
		return fenceResource
	}
	return abiruntime.FenceWorkload(workloadID)
}
