package identity

import (
	"strings"

	"github.com/oklog/ulid/v2"
)

// ID prefixes of Berth's objects (DESIGN.md section 7).
const (
	IDPrefixNode      = "nod_"
	IDPrefixProject   = "prj_"
	IDPrefixService   = "svc_"
	IDPrefixWorkload  = "wl_"
	IDPrefixLease     = "lse_"
	IDPrefixOperation = "op_"
	IDPrefixEvent     = "evt_"
	IDPrefixMessage   = "msg_"
	IDPrefixCluster   = "cls_"
	IDPrefixToken     = "tok_"
)

// NewID returns prefix followed by a new ULID in upper-case Crockford base32 (26 characters),
// for example nod_01JC9Y2M4Q7V8B1N6T3R5K9XZP. IDs made by one process sort by creation time and
// are strictly increasing within a millisecond. Safe for concurrent use.
func NewID(prefix string) string {
	return prefix + ulid.Make().String()
}

// ValidID reports whether id is prefix followed by a well-formed upper-case ULID.
func ValidID(id, prefix string) bool {
	body, ok := strings.CutPrefix(id, prefix)
	if !ok || len(body) != ulid.EncodedSize || strings.ToUpper(body) != body {
		return false
	}
	_, err := ulid.ParseStrict(body)
	return err == nil
}
