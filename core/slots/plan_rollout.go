package slots

import "time"

// Running reports whether s counts against a rollout's surge: it runs (generation run), or it
// was told to stop and the node has not acknowledged the stop yet (its process may still run).
func Running(s Slot) bool {
	return s.Exists && (s.Generation == GenRun || s.Generation == GenStop && s.Acked < GenStop)
}

// Ready reports whether s serves: it runs and the node last reported it running and ready.
func Ready(s Slot) bool {
	return s.Exists && s.Generation == GenRun && s.Observed.Phase == PhaseRunning && s.Observed.Ready
}

// failedRun reports whether the node reported s's run failed or stopped on its own.
func failedRun(s Slot) bool {
	return s.Observed.Phase == PhaseFailed || s.Observed.Phase == PhaseStopped
}

// job is one desired replica and its slots (at most its two names), primary name first.
type job struct {
	d    DesiredSlot
	rows []Slot
	// incumbents are the rows that run another attempt or on another node than the desire.
	incumbents []Slot
	// target reports whether a row is (or will be) the desired attempt on the desired node.
	target bool
	// rank orders replacements: 0 when no row of the replica is ready (replacing it costs no
	// availability), 1 otherwise.
	rank int
}

// matches reports whether s is the desired attempt on the desired node, in any generation.
func (j job) matches(s Slot) bool { return s.Attempt.Key == j.d.Key && s.NodeID == j.d.NodeID }

// planner spends a sweep's rollout bounds over the desired replicas and records each slot's
// decision input.
type planner struct {
	now     time.Time
	rollout Rollout
	inputs  map[string]Input
	nodes   map[string]string
	held    map[string]bool
	// starts is how many more runs the surge bound admits; stops how many more ready replicas
	// the unavailability bound lets the rollout stop.
	starts, stops int
	// incomplete reports whether a desired replica has no run of its desired attempt;
	// paused whether the pause held a replacement back.
	incomplete, paused bool
}

// set records s's input: desired at key on node when want, undesired otherwise.
func (p *planner) set(s Slot, want bool, key, node string) {
	p.inputs[s.Replica] = Input{Slot: s, Desired: want, DesiredKey: key, Now: p.now}
	p.nodes[s.Replica] = node
}

// hold keeps incumbent s running at its own attempt while its replica's successor comes up; a
// failed incumbent, and one that is not running, ends instead.
func (p *planner) hold(s Slot) {
	if s.Generation != GenRun || failedRun(s) {
		p.set(s, false, "", s.NodeID)
		return
	}
	p.set(s, true, s.Attempt.Key, s.NodeID)
	p.held[s.Replica] = true
}

// target records t (a row of j, or an absent slot named for it) as j's target. A run takes one
// of the surge bound's starts; a run the bound has no start left for is held (start-held), as
// is a run that begins a replacement (replacing) while the rollout is paused. A target at the
// desired attempt that failed, and one whose restart is under way (stopped or removed), keeps
// a start reserved, so another replica's replacement does not take its place meanwhile.
func (p *planner) target(j job, t Slot, replacing bool) {
	p.set(t, true, j.d.Key, j.d.NodeID)
	in := p.inputs[t.Replica]
	if DecideSlotTransition(in).Step != StepRun {
		if j.matches(t) && (t.Generation != GenRun || failedRun(t)) {
			p.starts--
		}
		return
	}
	ok := p.starts > 0
	p.starts--
	switch {
	case replacing && p.rollout.Paused:
		p.paused = true
		in.StartHeld = true
	case !ok:
		in.StartHeld = true
	}
	p.inputs[t.Replica] = in
}

// settled reports whether s reached its removal with both receipts.
func settled(s Slot) bool { return s.Generation == GenRemove && s.Acked == GenRemove }

// pick returns the row of rows a replica's successor should follow: one at the desired attempt
// that runs, else a removal waiting for its receipt, else a stop; then a settled row; the
// primary name on ties. ok is false for no rows.
func pick(rows []Slot) (Slot, bool) {
	best, ok := Slot{}, false
	score := func(s Slot) int {
		switch {
		case s.Generation == GenRun:
			return 4
		case s.Generation == GenRemove && s.Acked < GenRemove:
			return 3
		case s.Generation == GenStop:
			return 2
		}
		return 1
	}
	for _, s := range rows {
		if !ok || score(s) > score(best) {
			best, ok = s, true
		}
	}
	return best, ok
}

// restore plans a replica with nothing running to replace: its target (a row at the desired
// attempt, else a row whose stop is under way, else a settled row, else its primary name) runs
// or restarts, and the replica's other rows end once the target is ready and are held until
// then. A stop under way is preferred to a settled row so that a replacement begun in place
// this sweep spends no start its plan did not count.
func (p *planner) restore(j job) {
	// Among rows at the desired attempt, the first that has not settled (a stop of one never
	// moves the target to the other), else the first.
	t, ok := Slot{}, false
	for _, s := range j.rows {
		if j.matches(s) && (!ok || settled(t) && !settled(s)) {
			t, ok = s, true
		}
	}
	if !ok {
		if t, ok = pick(j.rows); !ok {
			t = Slot{Replica: j.d.Replica}
		}
	}
	p.target(j, t, false)
	p.others(j, t)
}

// others plans the rows of j beside its target t: they end when t is ready, are held while it
// is not.
func (p *planner) others(j job, t Slot) {
	for _, s := range j.rows {
		switch {
		case s.Replica == t.Replica:
		case Ready(t) && j.matches(t):
			p.set(s, false, "", s.NodeID)
		default:
			p.hold(s)
		}
	}
}

// replace plans a replica whose incumbents run and whose desired attempt does not: while one of
// its stops is under way, that row is its target; otherwise a failed or unready incumbent stops
// first (in place, costing no availability), a lone ready incumbent gets its successor beside
// it (surge), or stops first when the unavailability bound allows (in place); otherwise it waits.
func (p *planner) replace(j job) {
	var stopping, free []Slot
	for _, s := range j.rows {
		switch {
		case settled(s):
			free = append(free, s)
		case s.Generation != GenRun:
			stopping = append(stopping, s)
		}
	}
	for _, s := range free {
		p.set(s, false, "", s.NodeID) // settled; used below when a surge starts in its name
	}
	if t, ok := pick(stopping); ok {
		p.target(j, t, true)
		p.others(j, t)
		return
	}
	if p.rollout.Paused {
		p.paused = true
		p.wait(j)
		return
	}
	victim, cost := Slot{}, 1
	for _, s := range j.incumbents {
		if failedRun(s) {
			victim, cost = s, 0
			break
		}
	}
	if cost > 0 {
		for _, s := range j.incumbents {
			if !Ready(s) {
				victim, cost = s, 0
				break
			}
		}
	}
	if cost > 0 && len(j.incumbents) == 1 && p.rollout.MaxSurge > 0 && p.starts > 0 {
		t := Slot{Replica: otherName(j.incumbents[0].Replica)}
		if len(free) > 0 {
			t = free[0]
		}
		p.target(j, t, true)
		p.hold(j.incumbents[0])
		return
	}
	if cost > 0 {
		victim = j.incumbents[0]
		if len(j.incumbents) > 1 {
			cost = 0 // another incumbent stays ready
		}
	}
	// A stop that costs no availability is never held by the unavailability bound: the bound
	// may already be overspent (a replica that is not ready spends it, so stops is negative
	// while it crash-loops), and waiting would keep the failed incumbent forever.
	if cost > 0 && cost > p.stops {
		p.wait(j)
		return
	}
	p.stops -= cost
	if victim.NodeID == j.d.NodeID {
		p.set(victim, true, j.d.Key, j.d.NodeID) // drift: it stops, and its successor follows in its name
	} else {
		p.set(victim, false, "", victim.NodeID) // it moves node: it stops, its successor runs on the desired node
	}
	for _, s := range j.incumbents {
		if s.Replica != victim.Replica {
			p.hold(s)
		}
	}
}

// wait keeps every incumbent of j as it is: the first, when it drifted on the desired node,
// waits as replacement-in-flight; the others are held.
func (p *planner) wait(j job) {
	for i, s := range j.incumbents {
		if i == 0 && s.NodeID == j.d.NodeID && s.Attempt.Key != j.d.Key {
			p.set(s, true, j.d.Key, j.d.NodeID)
			in := p.inputs[s.Replica]
			in.ReplacementInFlight = true
			p.inputs[s.Replica] = in
			continue
		}
		p.hold(s)
	}
}
