package events

import (
	"encoding/json"
	"fmt"
)

func marshal(v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("events: encode: %w", err)
	}
	return string(b), nil
}

func unmarshal(s string, v any) error { return json.Unmarshal([]byte(s), v) }
