package wasm

import (
	"cmp"
	"encoding/hex"
	"slices"

	"github.com/berthhq/berth/abi/routes"
	abiwasm "github.com/berthhq/berth/abi/wasm"
)

// The route compiler's fast path: [HandleRoutes] reads its input with
// [abiwasm.DecodeRoutesInput] and writes the table with
// [abiwasm.AppendRoutes], both without reflection, encodes the table once
// and hashes that encoding with the host's berth.sha256
// (docs/wasm-abi.md sections 3.1 and 6.5).

// encodeRoutesOutput is json.Marshal of the [abiwasm.RoutesOutput] of the
// normalized routes rs with their SHA-256 ([routes.Table.Digest]): the
// routes are encoded once, hashed and written out. rs must already be
// normalized (sorted by hostname, upstreams by workload id).
func encodeRoutesOutput(rs []Route) []byte {
	out := make([]byte, 0, 64+160*len(rs))
	out = append(out, `{"routes":`...)
	body := len(out)
	out = abiwasm.AppendRoutes(out, rs)
	var sum [32]byte
	if len(rs) == 0 {
		sum = routesSHA256([]byte("null")) // Digest hashes a nil slice
	} else {
		sum = routesSHA256(out[body:])
	}
	out = append(out, `,"sha256":"`...)
	out = hex.AppendEncode(out, sum[:])
	return append(out, `"}`...)
}

// normalizeRoutes is [routes.Table.Normalize] for a table of routes alone,
// without reflection: each route's header matches by
// [routes.CompareHeaders], routes by [routes.CompareRoutes] (hostname, then
// precedence), each route's upstreams by workload id, with the same
// algorithms as there (so the same order even for equal keys), which leaves
// an already sorted table as it is.
func normalizeRoutes(rs []Route) {
	for i := range rs {
		if len(rs[i].Headers) > 1 {
			slices.SortFunc(rs[i].Headers, routes.CompareHeaders)
		}
	}
	slices.SortFunc(rs, func(a, b Route) int { return routes.CompareRoutes(&a, &b) })
	for i := range rs {
		slices.SortFunc(rs[i].Upstreams, func(a, b Upstream) int { return cmp.Compare(a.WorkloadID, b.WorkloadID) })
	}
}
