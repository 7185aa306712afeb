//go:build wasip1

package wasm

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"unsafe"

	abiwasm "github.com/berthhq/berth/abi/wasm"
)

// live keeps every buffer handed to the host reachable until the host gives
// it back with deallocate; the Go collector would reclaim it otherwise. A
// module instance serves one call at a time, so no lock is needed.
var live = map[uint32][]byte{}

//go:wasmexport berth_abi_version
func abiVersion() uint32 { return abiwasm.Version(abiwasm.Major, abiwasm.Minor) }

// spare is the last input buffer the host gave back, kept for the next
// allocate: inputs are alike in size from call to call, and a new buffer is
// fresh memory each time while the collector is off (exports_wasip1.go's
// collect). Only buffers up to maxSpare are kept, so a large input's memory
// is not held after its call.
var (
	spare    []byte
	inputs   = map[uint32]bool{} // buffers handed out by allocate, by pointer
	maxSpare = 64 << 10
)

//go:wasmexport allocate
func allocate(size uint32) uint32 {
	if !gcOff {
		debug.SetGCPercent(-1)
		gcOff = true
	}
	if size == 0 {
		size = 1
	}
	var b []byte
	if int(size) <= cap(spare) {
		b, spare = spare[:size], nil
	} else {
		b = make([]byte, size)
	}
	p := keep(b)
	inputs[p] = true
	return p
}

//go:wasmexport deallocate
func deallocate(ptr, size uint32) {
	if inputs[ptr] {
		delete(inputs, ptr)
		if b := live[ptr]; cap(b) <= maxSpare && cap(b) > cap(spare) {
			spare = b
		}
	}
	delete(live, ptr)
}

func keep(b []byte) uint32 {
	if len(b) == 0 {
		b = make([]byte, 1)[:0:1]
	}
	p := uint32(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
	live[p] = b
	return p
}

func out(b []byte) uint64 {
	p := abiwasm.Pack(keep(b), uint32(len(b)))
	collect()
	return p
}

// The Go runtime collects garbage with background goroutines, which in a
// reactor run only while an export blocks; a collection started during a call
// never finishes, and every later allocation pays for it (measured: a 1 KB
// evaluation took 0.8 ms instead of tens of µs). So the automatic collector
// is off and collect runs a whole, blocking collection after a call once the
// heap has doubled since the last one (at least minHeap).
//
// Reading the heap's size (runtime/metrics) costs 2-3 µs, so collect skips
// readings while the heap is far below its mark: from the heap's growth per
// call since the last reading it allows at most as many calls without one as
// would use half the room left (and never more than sampleEvery), and any
// call during which the linear memory grew (one memory.size instruction,
// mem_wasm.s) is followed by a reading. The bound stays as it was: a burst
// of allocation either fits in the memory the heap already has or grows it,
// and then the next reading, before the next call, finds it; after a large
// call the growth per call is large, so every call is read again.
const (
	minHeap     = 4 << 20
	sampleEvery = 16
)

var (
	gcOff      bool
	nextGC     uint64 = minHeap
	heapSample        = []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	sinceRead  uint64 // calls since the last reading
	skip       uint64 // calls allowed without a reading
	lastHeap   uint64 // the heap at the last reading
	seenPages  int32  // the memory's size at the last reading
)

// memoryPages is the linear memory's size in 64 KiB pages (memory.size).
func memoryPages() int32

func collect() {
	if !gcOff {
		debug.SetGCPercent(-1)
		gcOff = true
	}
	sinceRead++
	if sinceRead <= skip && memoryPages() == seenPages {
		return
	}
	metrics.Read(heapSample)
	heap := heapSample[0].Value.Uint64()
	var perCall uint64
	if heap > lastHeap {
		perCall = (heap - lastHeap) / sinceRead
	}
	if heap >= nextGC {
		runtime.GC()
		metrics.Read(heapSample)
		heap = heapSample[0].Value.Uint64()
		nextGC = max(minHeap, 2*heap)
		perCall = 0 // unknown until the next reading
	}
	skip = 0
	if perCall > 0 {
		skip = min(sampleEvery, (nextGC-heap)/(2*perCall))
	}
	sinceRead, lastHeap, seenPages = 0, heap, memoryPages()
}

func in(ptr, size uint32) []byte {
	if size == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(nil), uintptr(ptr))), size)
}

// Metadata returns berth_metadata's packed answer for a module of kind k.
func Metadata(k abiwasm.Kind, name, version string) uint64 {
	return out(MetadataJSON(k, name, version))
}

// Policy serves policy_evaluate: it reads the input at ptr, calls fn through
// [HandlePolicy] and returns the packed output for the host to read and
// deallocate.
func Policy(ptr, size uint32, fn PolicyFunc) uint64 { return out(HandlePolicy(in(ptr, size), fn)) }

// Routes serves routes_compile the way [Policy] serves policy_evaluate.
func Routes(ptr, size uint32, fn RoutesFunc) uint64 { return out(HandleRoutes(in(ptr, size), fn)) }

//go:wasmimport berth log
func hostLog(level int32, ptr unsafe.Pointer, size uint32)

// Log writes msg to the host's log at level (abiwasm.LogInfo, ...). The host
// truncates long lines and drops lines past its per-call budget.
func Log(level int32, msg string) {
	if msg == "" {
		return
	}
	hostLog(level, unsafe.Pointer(unsafe.StringData(msg)), uint32(len(msg)))
}
