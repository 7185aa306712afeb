package containerd

import (
	"context"
	"encoding/json"
	"fmt"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/sdk/runtime"
)

// handleVersion is the version of the handles this driver writes. Bump it
// and keep a decoder for the old one when the layout changes.
const handleVersion = 1

// handleV1 is the data of a version 1 handle: where the workload's container
// lives. containerd keeps everything else.
type handleV1 struct {
	Namespace   string `json:"namespace"`
	ContainerID string `json:"container_id"`
	LogPath     string `json:"log_path"`
}

func encodeHandle(h handleV1) runtime.Handle {
	raw, _ := json.Marshal(h) // plain struct: cannot fail
	return runtime.Handle{Version: handleVersion, Data: raw}
}

// Recover implements runtime.Driver: it decodes the handle and reports the
// workload's container as Inspect would, running or exited, without touching
// its task. A handle of another version, or of another containerd namespace
// or container id, is refused with code validation_failed; a container that
// is gone is ErrNotFound.
func (d *Driver) Recover(ctx context.Context, req *runtime.RecoverRequest) (*runtime.WorkloadState, error) {
	if req.Handle.Version != handleVersion {
		return nil, abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("recover workload %s: handle version %d: this driver reads version %d", req.WorkloadID, req.Handle.Version, handleVersion))
	}
	var h handleV1
	if err := json.Unmarshal(req.Handle.Data, &h); err != nil {
		return nil, abierrors.Wrap(abierrors.ValidationFailed, "recover workload "+req.WorkloadID+": handle does not decode", err)
	}
	if h.Namespace != d.cfg.Namespace || h.ContainerID != req.WorkloadID {
		return nil, abierrors.New(abierrors.ValidationFailed, fmt.Sprintf("recover workload %s: the handle names container %s in namespace %q; this driver runs namespace %q", req.WorkloadID, h.ContainerID, h.Namespace, d.cfg.Namespace))
	}
	st, err := d.Inspect(ctx, &runtime.InspectRequest{WorkloadID: req.WorkloadID})
	if err != nil {
		return nil, fmt.Errorf("recover: %w", err)
	}
	return st, nil
}
