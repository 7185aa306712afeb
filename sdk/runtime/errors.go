package runtime

import "errors"

// ErrNotFound is returned by Stop and Inspect for a workload the driver does not know.
var ErrNotFound = errors.New("berth: workload not found")
