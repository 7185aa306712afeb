package client

import (
	"context"
	"net/http"
	"net/url"
	"time"
)

// RuntimeSpec is a service's runtime spec (docs/reconciliation.md section 1): placement, replica
// counts, hold, resources, readiness and network. Zero fields take their defaults when written.
type RuntimeSpec struct {
	// Revision is the stored revision; ignored on writes (see SpecWrite.ExpectedRevision).
	Revision  int64            `json:"revision"`
	Placement RuntimePlacement `json:"placement"`
	Replicas  RuntimeReplicas  `json:"replicas"`
	Hold      bool             `json:"hold"`
	Resources RuntimeResources `json:"resources"`
	Readiness ReadinessProbe   `json:"readiness"`
	// Network is "host" (default) or "isolated".
	Network string `json:"network"`
}

// RuntimePlacement is "scheduled" (default), "every-node" or "pinned" with Nodes.
type RuntimePlacement struct {
	Mode  string   `json:"mode"`
	Nodes []string `json:"nodes,omitempty"`
}

// RuntimeReplicas states Total for scheduled placement and PerNode otherwise.
type RuntimeReplicas struct {
	PerNode int `json:"per_node,omitempty"`
	Total   int `json:"total,omitempty"`
}

// RuntimeResources limit each workload; zero is no limit.
type RuntimeResources struct {
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	CPUMillis   int64 `json:"cpu_millis,omitempty"`
}

// ReadinessProbe is "process" (default), "tcp" or "http"; timings are milliseconds.
type ReadinessProbe struct {
	Kind           string `json:"kind"`
	Port           int    `json:"port,omitempty"`
	Path           string `json:"path,omitempty"`
	InitialDelayMS int64  `json:"initial_delay_ms,omitempty"`
	StartupGraceMS int64  `json:"startup_grace_ms,omitempty"`
	IntervalMS     int64  `json:"interval_ms,omitempty"`
	TimeoutMS      int64  `json:"timeout_ms,omitempty"`
	Successes      int    `json:"successes,omitempty"`
	Failures       int    `json:"failures,omitempty"`
}

// RuntimeSpecDoc is the answer of GET and PUT .../services/{name}/spec.
type RuntimeSpecDoc struct {
	Service string `json:"service"`
	// Source is "service" while the spec is derived from the service's replicas and health
	// check, "operator" once written through the spec endpoint (it then owns placement).
	Source string      `json:"source"`
	Spec   RuntimeSpec `json:"spec"`
}

// SpecWrite is the body of PUT .../services/{name}/spec. ExpectedRevision nil (JSON null) states
// "I read no operator spec"; a number is the revision read.
type SpecWrite struct {
	ExpectedRevision *int64      `json:"expected_revision"`
	Spec             RuntimeSpec `json:"spec"`
}

// Verdict is a service's production verdict (docs/reconciliation.md section 7): State is
// "converged", "converging", "waiting" or "refused"; Reason names the wait or refusal.
type Verdict struct {
	SpecRevision int64     `json:"spec_revision"`
	State        string    `json:"state"`
	Reason       string    `json:"reason,omitempty"`
	ChangedAt    time.Time `json:"changed_at"`
}

// String returns "converged", "converging", "waiting(reason)" or "refused(reason)".
func (v Verdict) String() string {
	if v.Reason == "" {
		return v.State
	}
	return v.State + "(" + v.Reason + ")"
}

// SlotObservation is what the slot's node last reported of its current attempt.
type SlotObservation struct {
	// Phase is "", "starting", "running", "failed" or "stopped".
	Phase      string     `json:"phase"`
	Ready      bool       `json:"ready"`
	ObservedAt *time.Time `json:"observed_at,omitempty"`
	// Message is the node's own words for a failed run (exit code, pull refusal), if any.
	Message string `json:"message,omitempty"`
}

// SlotView is one replica slot of a service as GET .../services/{name}/workloads answers it
// (docs/reconciliation.md section 11).
type SlotView struct {
	ServiceID string `json:"service_id"`
	// Replica is "<i>" for scheduled placement and "<node id>.<i>" otherwise.
	Replica    string `json:"replica"`
	NodeID     string `json:"node_id"`
	WorkloadID string `json:"workload_id"`
	AttemptID  string `json:"attempt_id"`
	// Current reports whether the attempt runs the service's current desired attempt key.
	Current bool `json:"current"`
	// Disposition is "run", "stop" or "remove" (the generation committed for the attempt).
	Disposition string `json:"disposition"`
	// TerminalReceipts counts the stop and remove receipts the node returned (0 to 2).
	TerminalReceipts int             `json:"terminal_receipts"`
	Observation      SlotObservation `json:"observation"`
	// Delivery is "delivered" once the node applied a desired state carrying the disposition,
	// "undelivered" until then.
	Delivery string `json:"delivery"`
	// LastFailure is the newest failure of the slot across its attempts; nil when none failed.
	LastFailure *Failure `json:"last_failure,omitempty"`
	// PreviousWorkloadID is the workload of the attempt before the current one ("" for the
	// slot's first), whose output the node keeps for a while after removing it
	// (GET /nodes/{node_id}/logs?workload=...).
	PreviousWorkloadID string `json:"previous_workload_id,omitempty"`
}

// SlotWait names the slot a rollout waits on: the first slot in replica order that does not
// yet run the current attempt ready, with why (the verdict's reason when the verdict waits on
// it, otherwise its state: "not ready", "starting", "outdated", "stopping", "removing") and its
// last failure.
type SlotWait struct {
	Replica     string   `json:"replica"`
	NodeID      string   `json:"node_id"`
	WorkloadID  string   `json:"workload_id"`
	Reason      string   `json:"reason"`
	LastFailure *Failure `json:"last_failure,omitempty"`
}

// RolloutStatus is the answer of GET .../services/{name}/rollout: how far the service is on its
// way to the current desire.
type RolloutStatus struct {
	Service      string `json:"service"`
	Revision     int64  `json:"revision"`
	SpecRevision int64  `json:"spec_revision"`
	// Release is the bundle digest or image the service runs now; PreviousRelease is what
	// `rollout undo` returns to ("" when there is none).
	Release         string  `json:"release"`
	PreviousRelease string  `json:"previous_release,omitempty"`
	Verdict         Verdict `json:"verdict"`
	// Desired counts the replicas the service desires; Updated those running the current
	// desired attempt, observed ready; Outdated those still running an older attempt.
	Desired  int `json:"desired"`
	Updated  int `json:"updated"`
	Outdated int `json:"outdated"`
	// Deleting reports whether the service is being deleted.
	Deleting bool `json:"deleting"`
	// WaitingOn is the slot the rollout waits on; nil when every desired slot runs the current
	// attempt ready.
	WaitingOn *SlotWait `json:"waiting_on,omitempty"`
}

// GetRuntimeSpec reads a service's runtime spec (GET /projects/{project}/services/{name}/spec).
func (c *Client) GetRuntimeSpec(ctx context.Context, project, name string) (*RuntimeSpecDoc, error) {
	var out RuntimeSpecDoc
	if err := c.do(ctx, http.MethodGet, servicePath(project, name)+"/spec", nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// PutRuntimeSpec replaces a service's runtime spec with one compare-and-set on its revision
// (PUT /projects/{project}/services/{name}/spec). Refusals carry their code: "conflict",
// "service_not_found", "service_deleting", "spec_node_unknown", "spec_placement_invalid",
// "spec_replicas_invalid", "spec_readiness_target_undeclared", and the others of
// docs/reconciliation.md section 1 (dashes become underscores).
func (c *Client) PutRuntimeSpec(ctx context.Context, project, name string, w SpecWrite) (*RuntimeSpecDoc, error) {
	var out RuntimeSpecDoc
	if err := c.doJSON(ctx, http.MethodPut, servicePath(project, name)+"/spec", w, true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ServiceSlots lists a service's replica slots in replica order
// (GET /projects/{project}/services/{name}/workloads).
func (c *Client) ServiceSlots(ctx context.Context, project, name string) ([]SlotView, error) {
	var out List[SlotView]
	if err := c.do(ctx, http.MethodGet, servicePath(project, name)+"/workloads", nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return nonNil(out.Items), nil
}

// Rollout reads how far a service's rollout is (GET /projects/{project}/services/{name}/rollout).
func (c *Client) Rollout(ctx context.Context, project, name string) (*RolloutStatus, error) {
	var out RolloutStatus
	if err := c.do(ctx, http.MethodGet, servicePath(project, name)+"/rollout", nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Placement explains where each replica of a service stands or would go and why each node was
// taken or refused (GET /projects/{project}/services/{name}/placement; docs/placement.md).
func (c *Client) Placement(ctx context.Context, project, name string) (*PlacementExplanation, error) {
	var out PlacementExplanation
	if err := c.do(ctx, http.MethodGet, servicePath(project, name)+"/placement", nil, nil, "", true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// RolloutUndo returns a service to its previous release with one compare-and-set on the service
// (POST /projects/{project}/services/{name}/rollout/undo) and returns the service after it.
// Errors: "no_previous_release" when the service never ran another release, "revision_conflict"
// when the service changed concurrently, "service_deleting".
func (c *Client) RolloutUndo(ctx context.Context, project, name string) (*Service, error) {
	r, err := c.RolloutUndoWith(ctx, project, name, UndoRequest{})
	if err != nil {
		return nil, err
	}
	return &r.Service, nil
}

// UndoRequest is the body of POST .../rollout/undo: DryRun asks only for the changes;
// ExpectedRevision (nil: the revision the server reads) undoes only at that revision.
type UndoRequest struct {
	DryRun           bool   `json:"dry_run,omitempty"`
	ExpectedRevision *int64 `json:"expected_revision,omitempty"`
}

// UndoChange is one field an undo changes. Env names keys only: "-K" leaves, "+K" arrives, "~K"
// changes value.
type UndoChange struct {
	Field string `json:"field"`
	From  string `json:"from"`
	To    string `json:"to"`
}

// UndoResult answers POST .../rollout/undo: the service (before the write for a dry run, after
// it otherwise) and the changes of the undo.
type UndoResult struct {
	Service
	Changes []UndoChange `json:"changes"`
	DryRun  bool         `json:"dry_run,omitempty"`
}

// RolloutUndoWith is RolloutUndo with a body: a dry run, or an undo at an expected revision.
func (c *Client) RolloutUndoWith(ctx context.Context, project, name string, req UndoRequest) (*UndoResult, error) {
	var out UndoResult
	if err := c.doJSON(ctx, http.MethodPost, servicePath(project, name)+"/rollout/undo", req, true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Retirement is the answer of POST /nodes/{id}/retire: the node's retirement and what it waits on.
type Retirement struct {
	NodeID string `json:"node_id"`
	// Disposition is "withdrawn" (its slots are stopped and removed against the node's receipts)
	// or "lost" (its slots are released at once; it must not be reporting).
	Disposition string `json:"disposition"`
	// State is "retiring" until nothing is owed, then "retired".
	State string `json:"state"`
	// Wait names what a retiring node waits on ("slot-settlement-pending"), "" when retired.
	Wait      string    `json:"wait,omitempty"`
	Slots     int       `json:"slots"`
	CreatedAt time.Time `json:"created_at"`
}

// RetireNode retires a node from placement (POST /nodes/{id}/retire) with disposition
// "withdrawn" (default when "") or "lost". Errors: "node_not_found", "node_already_retired",
// "node_still_reporting" (lost asked of a node that reported recently).
func (c *Client) RetireNode(ctx context.Context, nodeID, disposition string) (*Retirement, error) {
	var out Retirement
	body := struct {
		Disposition string `json:"disposition,omitempty"`
	}{disposition}
	if err := c.doJSON(ctx, http.MethodPost, "/nodes/"+url.PathEscape(nodeID)+"/retire", body, true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// RebalanceRequest is the body of POST /projects/{p}/services/{s}/rebalance: DryRun asks only
// for the moves (nothing is written); ExpectedRevision (nil: the revision the server reads)
// records them only while the service is at that revision.
type RebalanceRequest struct {
	DryRun           bool   `json:"dry_run,omitempty"`
	ExpectedRevision *int64 `json:"expected_revision,omitempty"`
}

// RebalanceMove is one replica a rebalance moves: from the node it stands on to another, and
// why the spread improves.
type RebalanceMove struct {
	Replica string `json:"replica"`
	From    string `json:"from"`
	To      string `json:"to"`
	Why     string `json:"why"`
}

// SpreadScore is how unevenly a service's replicas are spread (docs/placement.md section 7):
// the sum over spread domains, then over nodes, of the square of the replicas in each; lower is
// better.
type SpreadScore struct {
	Domains int `json:"domains"`
	Nodes   int `json:"nodes"`
}

// RebalanceResult is the answer of a rebalance: the moves (empty when the spread is as good as
// the decider can make it), the spread score now and after the moves, whether the moves were
// written (Recorded; false for a dry run, for no moves, and when the service already carries
// the same moves), the rebalance generation the service carries, and the service's revision.
// Note says why a service has nothing to rebalance (stateful, pinned or every-node).
type RebalanceResult struct {
	Service    string          `json:"service"`
	Moves      []RebalanceMove `json:"moves"`
	Before     SpreadScore     `json:"before"`
	After      SpreadScore     `json:"after"`
	DryRun     bool            `json:"dry_run,omitempty"`
	Recorded   bool            `json:"recorded"`
	Generation int64           `json:"generation"`
	Revision   int64           `json:"revision"`
	Note       string          `json:"note,omitempty"`
}

// Rebalance moves replicas of a service for a better spread within its rollout's bounds
// (POST /projects/{project}/services/{name}/rebalance; docs/placement.md section 7). Errors:
// "service_not_found", "revision_conflict" (ExpectedRevision), "policy_denied".
func (c *Client) Rebalance(ctx context.Context, project, name string, req RebalanceRequest) (*RebalanceResult, error) {
	var out RebalanceResult
	if err := c.doJSON(ctx, http.MethodPost, servicePath(project, name)+"/rebalance", req, true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
