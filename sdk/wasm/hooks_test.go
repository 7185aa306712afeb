package wasm

import (
	"encoding/json"
	"errors"
	"testing"

	abiwasm "github.com/berthhq/berth/abi/wasm"
)

func TestHookHelpers(t *testing.T) {
	svc := json.RawMessage(`{"project":"p","name":"web","port":8080,"health_check":{"path":"/h","interval_s":0,"timeout_s":0,"failures":0}}`)
	node := json.RawMessage(`{"id":"nod_1","hostname":"h1","labels":{},"address":"10.0.0.1","cpus":2,"memory_mb":1024}`)
	null := json.RawMessage("null")

	s, old, err := ServiceApplyInput(abiwasm.PolicyInput{Hook: abiwasm.HookServiceApply, Object: svc, OldObject: null})
	if err != nil || s.Name != "web" || s.HealthCheck.Path != "/h" || old != nil {
		t.Errorf("ServiceApplyInput new = %+v, %v, %v", s, old, err)
	}
	s, old, err = ServiceApplyInput(abiwasm.PolicyInput{Hook: abiwasm.HookServiceApply, Object: svc, OldObject: svc})
	if err != nil || old == nil || old.Port != 8080 {
		t.Errorf("ServiceApplyInput replace = %+v, %v, %v", s, old, err)
	}
	if d, err := ServiceDeleteInput(abiwasm.PolicyInput{Hook: abiwasm.HookServiceDelete, Object: null, OldObject: svc}); err != nil || d.Name != "web" {
		t.Errorf("ServiceDeleteInput = %+v, %v", d, err)
	}
	if n, err := NodeEnrollInput(abiwasm.PolicyInput{Hook: abiwasm.HookNodeEnroll, Object: node, OldObject: null}); err != nil || n.Hostname != "h1" {
		t.Errorf("NodeEnrollInput = %+v, %v", n, err)
	}
	pl, _ := json.Marshal(map[string]any{"service": svc, "slot": 2, "node": node})
	if p, err := DeployInput(abiwasm.PolicyInput{Hook: abiwasm.HookDeploy, Object: pl, OldObject: null}); err != nil || p.Slot != 2 || p.Node.ID != "nod_1" || p.Service.Name != "web" {
		t.Errorf("DeployInput = %+v, %v", p, err)
	}
	if _, err := DeployInput(abiwasm.PolicyInput{Hook: abiwasm.HookNodeEnroll, Object: node}); !errors.Is(err, ErrWrongHook) {
		t.Errorf("DeployInput of node.enroll: %v, want ErrWrongHook", err)
	}
	if _, err := NodeEnrollInput(abiwasm.PolicyInput{Hook: abiwasm.HookNodeEnroll, Object: null}); !errors.Is(err, ErrNoObject) {
		t.Errorf("NodeEnrollInput of null: %v, want ErrNoObject", err)
	}
	if _, _, err := ServiceApplyInput(abiwasm.PolicyInput{Hook: abiwasm.HookServiceApply, Object: json.RawMessage(`[1]`)}); err == nil {
		t.Error("ServiceApplyInput decoded an array")
	}
}
