package machines

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	abiprovider "github.com/berthhq/berth/abi/provider"
	"github.com/berthhq/berth/core/nodes"
	"github.com/berthhq/berth/core/operations"
	"github.com/berthhq/berth/core/store/storetest"
	"github.com/berthhq/berth/internal/proctest"
)

// cloud stands for a machine provider plugin over a cloud API (the Hetzner plugin's contract:
// Apply finds the machine's server or creates it, Delete removes it). A server "boots" by
// enrolling, with the join code its user data carries, through the real registry, unless
// boot is false.
type cloud struct {
	reg  *nodes.Registry
	boot bool

	mu      sync.Mutex
	servers map[string]string // machine id -> user data
	created int
	deleted int
}

func (c *cloud) Plan(_ context.Context, req *abiprovider.PlanRequest) (*abiprovider.PlanResponse, error) {
	return &abiprovider.PlanResponse{Planned: req.Desired, Changes: true}, nil
}

func (c *cloud) Apply(ctx context.Context, req *abiprovider.ApplyRequest) (*abiprovider.ApplyResponse, error) {
	var a struct {
		UserData string `json:"user_data"`
	}
	if err := json.Unmarshal(req.Planned.Attributes, &a); err != nil {
		return nil, err
	}
	c.mu.Lock()
	_, exists := c.servers[req.Planned.ID]
	if !exists {
		c.servers[req.Planned.ID] = a.UserData
		c.created++
	}
	c.mu.Unlock()
	if !exists && c.boot {
		code := strings.TrimPrefix(a.UserData, "code:")
		pub, _, _ := ed25519.GenerateKey(rand.Reader)
		if _, _, err := c.reg.Enroll(ctx, nodes.EnrollRequest{JoinToken: code, PublicKey: base64.StdEncoding.EncodeToString(pub), Hostname: req.Planned.ID, Address: "127.0.0.1"}); err != nil {
			return nil, fmt.Errorf("server %s: enroll: %w", req.Planned.ID, err)
		}
	}
	return &abiprovider.ApplyResponse{State: req.Planned}, nil
}

func (c *cloud) Delete(_ context.Context, req *abiprovider.DeleteRequest) (*abiprovider.DeleteResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.servers[req.ID]; ok {
		delete(c.servers, req.ID)
		c.deleted++
	}
	return &abiprovider.DeleteResponse{}, nil
}

var _ Provider = (*cloud)(nil)

func setup(t *testing.T, boot bool, joinTimeout time.Duration) (*Machines, *cloud, *nodes.Registry) {
	t.Helper()
	st := storetest.Open(t)
	reg := nodes.NewRegistry(st, nil)
	cl := &cloud{reg: reg, boot: boot, servers: map[string]string{}}
	q := operations.NewQueue(st, operations.Config{Policy: operations.Policy{BaseDelay: 10 * time.Millisecond}})
	m, err := New(Config{Store: st, Queue: q, Joins: reg, Providers: map[string]ProviderEntry{"sim": {Plugin: cl, ResourceType: "sim.server"}},
		UserData: func(code string) string { return "code:" + code }, JoinTimeout: joinTimeout, Poll: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); m.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return m, cl, reg
}

// A machine is recorded, its server made once with a join code in its user data, its node
// enrolls with that code and is bound; deleting the machine deletes its server.
func TestMachineIsBoundToTheNodeItsCodeEnrolled(t *testing.T) {
	m, cl, reg := setup(t, true, time.Minute)
	ctx := context.Background()
	mc, err := m.Create(ctx, CreateRequest{Provider: "sim", Type: "cx22", Location: "fsn1", Labels: map[string]string{"role": "web"}})
	if err != nil {
		t.Fatal(err)
	}
	proctest.WaitFor(t, 30*time.Second, "machine ready", func() (bool, string) {
		cur, err := m.Get(ctx, mc.ID)
		if err != nil {
			return false, err.Error()
		}
		return cur.State == Ready && cur.NodeID != "", fmt.Sprintf("%+v", cur)
	})
	cur, _ := m.Get(ctx, mc.ID)
	n, err := reg.Get(ctx, cur.NodeID)
	if err != nil || n.Labels[NodeLabel] != mc.ID || n.Labels["role"] != "web" {
		t.Fatalf("bound node %+v (%v): want labels berth-machine=%s and role=web", n, err, mc.ID)
	}
	if _, err := m.Create(ctx, CreateRequest{Provider: "nope", Type: "cx22", Location: "fsn1"}); err == nil {
		t.Fatal("a create for a provider berthd does not run was accepted")
	}
	if _, err := m.Delete(ctx, mc.ID); err != nil {
		t.Fatal(err)
	}
	proctest.WaitFor(t, 30*time.Second, "machine deleted", func() (bool, string) {
		cur, _ := m.Get(ctx, mc.ID)
		return cur.State == Deleted, fmt.Sprintf("%+v", cur)
	})
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.created != 1 || cl.deleted != 1 || len(cl.servers) != 0 {
		t.Fatalf("servers created %d, deleted %d, left %d: want 1, 1, 0", cl.created, cl.deleted, len(cl.servers))
	}
}

// A server whose node never enrolls is deleted after the join timeout, and the machine fails
// with the reason; a repeat of the create's idempotency key returns the same machine.
func TestMachineWhoseNodeNeverEnrollsFails(t *testing.T) {
	m, cl, _ := setup(t, false, time.Second)
	ctx := context.Background()
	mc, err := m.Create(ctx, CreateRequest{Provider: "sim", Type: "cx22", Location: "fsn1", IdempotencyKey: "k1"})
	if err != nil {
		t.Fatal(err)
	}
	again, err := m.Create(ctx, CreateRequest{Provider: "sim", Type: "cx22", Location: "fsn1", IdempotencyKey: "k1"})
	if err != nil || again.ID != mc.ID {
		t.Fatalf("repeat of the key: %v %v, want machine %s", again, err, mc.ID)
	}
	proctest.WaitFor(t, 30*time.Second, "machine failed", func() (bool, string) {
		cur, _ := m.Get(ctx, mc.ID)
		return cur.State == Failed && strings.Contains(cur.LastError, "did not enroll"), fmt.Sprintf("%+v", cur)
	})
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.created > 1 || len(cl.servers) != 0 {
		t.Fatalf("servers created %d, left %d: want at most 1 and 0", cl.created, len(cl.servers))
	}
}
