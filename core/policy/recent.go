package policy

import (
	"sync"

	abierrors "github.com/berthhq/berth/abi/errors"
)

// RecentInputs is how many distinct inputs an engine keeps in memory for
// [Engine.RecordedInput], newest first; older ones are dropped.
const RecentInputs = 256

// ErrInputNotRecorded is returned by [Engine.RecordedInput] for a digest this
// engine does not keep.
var ErrInputNotRecorded = abierrors.New(abierrors.InputNotRecorded,
	"no recorded input with that digest on this berthd (decided by another replica, before a restart, or among older decisions)")

// inputRing keeps the last RecentInputs distinct inputs by their SHA-256. Its
// zero value is ready; safe for concurrent use.
type inputRing struct {
	mu    sync.Mutex
	order []string          // oldest first; mu must be held
	raw   map[string][]byte // by hex SHA-256; mu must be held
}

func (r *inputRing) put(sum string, raw []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.raw == nil {
		r.raw = map[string][]byte{}
	}
	if _, ok := r.raw[sum]; ok {
		return
	}
	r.raw[sum] = append([]byte(nil), raw...)
	r.order = append(r.order, sum)
	if len(r.order) > RecentInputs {
		delete(r.raw, r.order[0])
		r.order = append(r.order[:0], r.order[1:]...)
	}
}

func (r *inputRing) get(sum string) ([]byte, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	raw, ok := r.raw[sum]
	return raw, ok
}

// RecordedInput returns the exact input (JSON) of a recent decision by its
// input_sha256, for `berth policy test --record` (docs/wasm-abi.md section
// 8). Inputs are kept in this process's memory only, never in the store or
// the change log: the RecentInputs newest distinct ones. An unknown digest
// gives ErrInputNotRecorded. The caller must not modify the result.
func (e *Engine) RecordedInput(sum string) ([]byte, error) {
	raw, ok := e.recent.get(sum)
	if !ok {
		return nil, ErrInputNotRecorded
	}
	return raw, nil
}
