package reconciler

import "sync"

// DefaultQueueLimit is how many distinct keys a [Queue] holds before it overflows.
const DefaultQueueLimit = 4096

// Queue is a deduplicating work queue of keys (service ids, node ids), as controller work
// queues are (docs/reconciliation.md section 6):
//
//   - a key added twice before it is taken is processed once;
//   - a key added while it is being processed (taken, not yet [Queue.Done]) is not handed out
//     beside itself: it is queued again when Done is called, so the change that arrived during
//     the work is seen by one more round of it;
//   - the queue holds at most its limit of distinct keys. A key added to a full queue is dropped
//     and the queue records an overflow, which [Queue.Take] reports once: the caller then owes a
//     full sweep, which covers every dropped key.
//
// Keys come out in the order they were first queued. A Queue is safe for concurrent use; its
// zero value is not usable, make one with [NewQueue].
type Queue[K comparable] struct {
	mu         sync.Mutex
	order      []K            // queued keys, oldest first; mu must be held
	dirty      map[K]struct{} // keys waiting to be taken (queued or re-queued at Done); mu must be held
	processing map[K]struct{} // keys taken and not yet done; mu must be held
	limit      int
	overflow   bool // a key was dropped since the last Take; mu must be held
	ready      chan struct{}
}

// NewQueue returns an empty queue holding at most limit distinct keys (limit < 1:
// [DefaultQueueLimit]).
func NewQueue[K comparable](limit int) *Queue[K] {
	if limit < 1 {
		limit = DefaultQueueLimit
	}
	return &Queue[K]{dirty: map[K]struct{}{}, processing: map[K]struct{}{}, limit: limit, ready: make(chan struct{}, 1)}
}

// Add queues k and reports whether it is (now or already) queued; false means the queue was full,
// k was dropped and an overflow is recorded. It never blocks.
func (q *Queue[K]) Add(k K) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if _, ok := q.dirty[k]; ok {
		return true
	}
	if len(q.dirty) >= q.limit {
		q.overflow = true
		q.signalLocked()
		return false
	}
	q.dirty[k] = struct{}{}
	if _, busy := q.processing[k]; busy {
		return true // queued again by Done
	}
	q.order = append(q.order, k)
	q.signalLocked()
	return true
}

// Take hands out up to max queued keys (max < 1: all of them), marking them processing, and
// reports whether keys were dropped since the last Take (the caller then owes a full sweep). The
// caller calls [Queue.Done] for every key returned once its work ended, successful or not.
func (q *Queue[K]) Take(max int) (keys []K, overflowed bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := len(q.order)
	if max > 0 && max < n {
		n = max
	}
	keys = make([]K, n)
	copy(keys, q.order[:n])
	q.order = append(q.order[:0:0], q.order[n:]...)
	for _, k := range keys {
		delete(q.dirty, k)
		q.processing[k] = struct{}{}
	}
	overflowed, q.overflow = q.overflow, false
	if len(q.order) > 0 {
		q.signalLocked()
	}
	return keys, overflowed
}

// Done ends the processing of k; a k added meanwhile is queued again. Done of a key that is not
// processing does nothing.
func (q *Queue[K]) Done(k K) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if _, ok := q.processing[k]; !ok {
		return
	}
	delete(q.processing, k)
	if _, again := q.dirty[k]; again {
		q.order = append(q.order, k)
		q.signalLocked()
	}
}

// Len returns how many keys wait to be taken (re-queued keys still processing included).
func (q *Queue[K]) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.dirty)
}

// Ready receives a value after an Add, a Done that queued again or a Take that left keys behind;
// a receiver then calls Take. One value stands for any number of such calls.
func (q *Queue[K]) Ready() <-chan struct{} { return q.ready }

// signalLocked makes Ready receivable. mu must be held.
func (q *Queue[K]) signalLocked() {
	select {
	case q.ready <- struct{}{}:
	default:
	}
}
