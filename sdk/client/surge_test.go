package client

import (
	"encoding/json"
	"testing"
)

func TestIntOrPercentJSON(t *testing.T) {
	for raw, want := range map[string]IntOrPercent{`3`: {Value: 3}, `"25%"`: {Value: 25, Percent: true}, `"4"`: {Value: 4}} {
		var got IntOrPercent
		if err := json.Unmarshal([]byte(raw), &got); err != nil || got != want {
			t.Errorf("unmarshal %s = %+v, %v; want %+v", raw, got, err, want)
		}
		out, _ := json.Marshal(got)
		back := IntOrPercent{}
		if err := json.Unmarshal(out, &back); err != nil || back != want {
			t.Errorf("round trip of %s through %s = %+v, %v", raw, out, back, err)
		}
	}
	for _, raw := range []string{`"x"`, `2.5`, `"%"`, `true`, `"1%%"`} {
		var got IntOrPercent
		if err := json.Unmarshal([]byte(raw), &got); err == nil {
			t.Errorf("unmarshal %s accepted: %+v", raw, got)
		}
	}
}
