package interrupt

// Go's WebAssembly back end compiles every function into one dispatch loop:
//
//	loop $L
//	  block block ... block        ;; m blocks, one per later basic block
//	    local.get $pc
//	    br_table 0 1 1 2 ...       ;; resume at the block $pc names
//	  end  code of block 1
//	  end  code of block 2 ...
//	end
//
// and every jump between its basic blocks, forward or backward, is
// "i32.const K; local.set $pc; br $L". A check at $L's header would run at
// every such jump, most of them the forward branches of ifs and switches
// (measured: the fuel check made Go code 35 to 70 percent slower, against a
// few percent for other compilers' loops). So in a loop of exactly that
// shape the check moves from the header to the branches that can close a
// cycle:
//
//   - "i32.const K; local.set $pc; br $L" whose target segment (the code
//     after the end of the block br_table entry K names) lies after the
//     branch's own segment needs none: along a path of such branches and
//     fall-throughs the segment only grows, so it leaves the loop within m
//     of them;
//   - every other branch to $L (to the same or an earlier segment, with a
//     selector the pass cannot see, br_if, br_table) gets the check just
//     before it.
//
// Every cycle through $L therefore passes a check, as with a check at the
// header. The first entry into $L is not counted, like any straight-line
// code; function entries are counted as before (entryChecks). A function
// using exception handling or typed-reference branches keeps the header
// checks (none of Go's code does).

// dispatch is one recognised dispatch loop while its body is rewritten.
type dispatch struct {
	pc      uint32   // the selector local
	targets []uint32 // br_table's labels, the default last
	seg     int      // dispatch blocks ended so far: the current segment
}

// segmentOf is the segment a jump with selector k lands in.
func (d *dispatch) segmentOf(k uint32) int {
	if int64(k) < int64(len(d.targets)-1) {
		return int(d.targets[k]) + 1
	}
	return int(d.targets[len(d.targets)-1]) + 1
}

// dispatchAt reports whether the loop whose block type starts at off in
// code has the dispatch shape, and returns it with its number of blocks.
func dispatchAt(code []byte, off int) (*dispatch, int, bool) {
	r := &reader{b: code, off: off}
	if err := r.blockType(); err != nil {
		return nil, 0, false
	}
	m := 0
	for r.off+1 < len(code) && code[r.off] == 0x02 && code[r.off+1] == 0x40 {
		r.off += 2
		m++
	}
	if m == 0 {
		return nil, 0, false
	}
	if op, err := r.byte(); err != nil || op != 0x20 {
		return nil, 0, false
	}
	pc, err := r.u32()
	if err != nil {
		return nil, 0, false
	}
	if op, err := r.byte(); err != nil || op != 0x0e {
		return nil, 0, false
	}
	n, err := r.u32()
	if err != nil || uint64(n) >= uint64(len(code)) {
		return nil, 0, false
	}
	d := &dispatch{pc: pc, targets: make([]uint32, 0, n+1)}
	for i := uint32(0); i <= n; i++ {
		l, err := r.u32()
		if err != nil || l >= uint32(m) { // a label past the blocks would re-enter $L unchecked
			return nil, 0, false
		}
		d.targets = append(d.targets, l)
	}
	return d, m, true
}

// plainControl reports whether code (a function body's instructions) uses
// only the control instructions dispatch tracking follows: no exception
// handling (try, catch, throw, rethrow, delegate, try_table) and no
// br_on_* branches.
func plainControl(code []byte) bool {
	r := &reader{b: code}
	for r.off < len(r.b) {
		op, err := r.byte()
		if err != nil {
			return false
		}
		switch op {
		case 0x06, 0x07, 0x08, 0x09, 0x0a, 0x18, 0x19, 0x1f, 0xd5, 0xd6, 0xfb:
			return false
		}
		if err := r.skipImmediates(op); err != nil {
			return false
		}
	}
	return true
}
