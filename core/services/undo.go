package services

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/berthhq/berth/abi/node"
)

// UndoChange is one field `rollout undo` changes: its name and the values before and after, as
// an operator reads them. Environment variables are named, never shown: Field "env", From the
// keys removed or changed, To the keys added or changed, each prefixed "-", "+" or "~".
type UndoChange struct {
	Field string `json:"field"`
	From  string `json:"from"`
	To    string `json:"to"`
}

// UndoChanges returns what [Undone] would change of cur, in a fixed field order
// (release, runtime, command, env, port, user, memory_mb, cpu_millis, health_check); empty when
// Previous runs exactly what cur runs apart from the bundle name. Errors: ErrNoPreviousRelease.
func UndoChanges(cur *Service) ([]UndoChange, error) {
	if cur.Previous == nil || cur.Previous.Release().Digest() == "" {
		return nil, fmt.Errorf("%w: %s/%s", ErrNoPreviousRelease, cur.Project, cur.Name)
	}
	now, back := InvocationOf(cur), cur.Previous
	var out []UndoChange
	add := func(field, from, to string) {
		if from != to {
			out = append(out, UndoChange{Field: field, From: orNone(from), To: orNone(to)})
		}
	}
	add("release", now.Release().Digest(), back.Release().Digest())
	add("runtime", now.Runtime, back.Runtime)
	add("command", strings.Join(now.Command, " "), strings.Join(back.Command, " "))
	if from, to := envDiff(now.Env, back.Env); from != "" || to != "" {
		out = append(out, UndoChange{Field: "env", From: orNone(from), To: orNone(to)})
	}
	add("port", strconv.Itoa(now.Port), strconv.Itoa(back.Port))
	add("user", now.User, back.User)
	add("memory_mb", strconv.FormatInt(now.MemoryMB, 10), strconv.FormatInt(back.MemoryMB, 10))
	add("cpu_millis", strconv.FormatInt(now.CPUMillis, 10), strconv.FormatInt(back.CPUMillis, 10))
	add("health_check", healthText(now.HealthCheck), healthText(back.HealthCheck))
	return out, nil
}

func orNone(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// envDiff names the keys that leave (-) or change (~) in from, and that arrive (+) or change
// (~) in to, each list sorted.
func envDiff(now, back map[string]string) (from, to string) {
	var f, t []string
	for _, k := range slices.Sorted(maps.Keys(now)) {
		switch v, ok := back[k]; {
		case !ok:
			f = append(f, "-"+k)
		case v != now[k]:
			f = append(f, "~"+k)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(back)) {
		switch v, ok := now[k]; {
		case !ok:
			t = append(t, "+"+k)
		case v != back[k]:
			t = append(t, "~"+k)
		}
	}
	return strings.Join(f, " "), strings.Join(t, " ")
}

// healthText describes the probe a node runs for h: zero fields read as their defaults
// (abi/node HealthCheck.WithDefaults), so a check left at zero shows what it does.
func healthText(h HealthCheck) string {
	p := node.HealthCheck(h).WithDefaults()
	return fmt.Sprintf("GET %s every %ds, timeout %ds, %d failures", p.Path, p.IntervalS, p.TimeoutS, p.Failures)
}
