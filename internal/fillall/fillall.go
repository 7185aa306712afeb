// Package fillall fills every field of a value for tests of hand-written
// JSON codecs: a field the codec forgets then shows up as a difference
// from encoding/json.
package fillall

import (
	"fmt"
	"reflect"
	"testing"
)

// Fill sets every field of the value at v (strings, ints, bools, slices of
// two elements, pointers and structs, recursively) to a distinct non-zero
// value, strings with characters encoding/json escapes; seed numbers them
// and moves on. Another kind fails t, naming it.
func Fill(t testing.TB, v reflect.Value, seed *int) {
	t.Helper()
	*seed++
	switch v.Kind() {
	case reflect.String:
		v.SetString(fmt.Sprintf("s%d <\"é\">&\u2028\x01", *seed))
	case reflect.Int, reflect.Int64:
		v.SetInt(int64(*seed))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 2, 2)
		for i := range 2 {
			Fill(t, s.Index(i), seed)
		}
		v.Set(s)
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		Fill(t, p.Elem(), seed)
		v.Set(p)
	case reflect.Struct:
		for i := range v.NumField() {
			Fill(t, v.Field(i), seed)
		}
	default:
		t.Fatalf("fillall: add %s (%s) to the codec and to Fill", v.Type(), v.Kind())
	}
}
