package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// IntOrPercent is a rollout bound: a whole number of replicas (JSON 3) or a percentage of the
// desired replicas (JSON "25%"); a surge percentage rounds up, an unavailability one down.
type IntOrPercent struct {
	Value   int
	Percent bool
}

// String returns "3" or "25%".
func (b IntOrPercent) String() string {
	if b.Percent {
		return strconv.Itoa(b.Value) + "%"
	}
	return strconv.Itoa(b.Value)
}

// MarshalJSON writes a count as a number and a percentage as "N%".
func (b IntOrPercent) MarshalJSON() ([]byte, error) {
	if b.Percent {
		return json.Marshal(b.String())
	}
	return json.Marshal(b.Value)
}

// UnmarshalJSON reads a number, or a string "N" or "N%".
func (b *IntOrPercent) UnmarshalJSON(raw []byte) error {
	var n int
	if err := json.Unmarshal(raw, &n); err == nil {
		*b = IntOrPercent{Value: n}
		return nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return fmt.Errorf("a rollout bound is a whole number of replicas or a percentage such as \"25%%\", not %s", raw)
	}
	v, err := ParseIntOrPercent(s)
	if err != nil {
		return err
	}
	*b = v
	return nil
}

// ParseIntOrPercent reads "3" or "25%".
func ParseIntOrPercent(s string) (IntOrPercent, error) {
	s = strings.TrimSpace(s)
	num, pct := strings.CutSuffix(s, "%")
	n, err := strconv.Atoi(num)
	if err != nil || strconv.Itoa(n) != num {
		return IntOrPercent{}, fmt.Errorf("a rollout bound is a whole number of replicas or a percentage such as \"25%%\", not %q", s)
	}
	return IntOrPercent{Value: n, Percent: pct}, nil
}

// RolloutSpec is a service's `rollout:` block (docs/reconciliation.md section 5.2): how many
// replicas a rollout may run above the desired count (MaxSurge, default 1) and how many desired
// replicas it may leave not ready (MaxUnavailable, default 0). Each is 0 to 256 replicas or 0%
// to 100%; both 0 is refused. A stateful service replaces its replica stop-before-start under
// its lease and takes no surge.
type RolloutSpec struct {
	MaxSurge       *IntOrPercent `json:"max_surge,omitempty"`
	MaxUnavailable *IntOrPercent `json:"max_unavailable,omitempty"`
}

// RolloutControl is the answer of POST .../rollout/{pause,resume,restart}: the service after
// the action and whether it wrote (a pause of a paused service writes nothing).
type RolloutControl struct {
	Service Service `json:"service"`
	Changed bool    `json:"changed"`
}

// RolloutPause holds the service's rollout where it is: no replacement begins; those under way
// finish, and the verdict waits on rollout-paused (POST .../rollout/pause). Idempotent.
// Errors: "service_not_found", "service_deleting", "revision_conflict".
func (c *Client) RolloutPause(ctx context.Context, project, name string) (*RolloutControl, error) {
	return c.rolloutControl(ctx, project, name, "pause")
}

// RolloutResume lets a paused rollout continue (POST .../rollout/resume). Idempotent. Errors
// as [Client.RolloutPause].
func (c *Client) RolloutResume(ctx context.Context, project, name string) (*RolloutControl, error) {
	return c.rolloutControl(ctx, project, name, "resume")
}

// RolloutRestart replaces every replica of the service under its rollout bounds: a new restart
// generation (POST .../rollout/restart). Each call is a new restart unless it repeats an
// Idempotency-Key. Errors as [Client.RolloutPause].
func (c *Client) RolloutRestart(ctx context.Context, project, name string) (*RolloutControl, error) {
	return c.rolloutControl(ctx, project, name, "restart")
}

func (c *Client) rolloutControl(ctx context.Context, project, name, action string) (*RolloutControl, error) {
	var out RolloutControl
	if err := c.doJSON(ctx, http.MethodPost, servicePath(project, name)+"/rollout/"+action, struct{}{}, true, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
