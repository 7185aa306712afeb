package wasm

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"gopkg.in/yaml.v3"
)

// Recording is one decision of a running berthd to add as a case: the exact
// input it evaluated (JSON), its SHA-256 and what the module answered.
type Recording struct {
	Name     string
	Input    json.RawMessage
	SHA256   string
	Decision string // "allow" or "deny"
	Reasons  []string
}

// AppendRecorded adds recs to dir/policy_test.yaml as exact cases that
// expect the recorded decision and every recorded reason, keeping the
// file's other content and comments; it creates the file when absent. A
// recording whose SHA-256 is already a case's is left out. It returns how
// many cases it added. The file is replaced atomically.
func AppendRecorded(dir string, recs []Recording) (int, error) {
	path := filepath.Join(dir, CasesFile)
	raw, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return 0, fmt.Errorf("read test cases: %w", err)
	}
	var doc yaml.Node
	if len(bytes.TrimSpace(raw)) > 0 {
		if err := yaml.Unmarshal(raw, &doc); err != nil {
			return 0, fmt.Errorf("parse %s: %w", path, err)
		}
	}
	if doc.Kind == 0 {
		doc = yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{{Kind: yaml.MappingNode, Tag: "!!map"}}}
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return 0, fmt.Errorf("%s: want a mapping with a list of cases", path)
	}
	top := doc.Content[0]
	var cases *yaml.Node
	for i := 0; i+1 < len(top.Content); i += 2 {
		if top.Content[i].Value == "cases" {
			cases = top.Content[i+1]
		}
	}
	if cases == nil {
		cases = &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		top.Content = append(top.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: "cases"}, cases)
	}
	if cases.Kind != yaml.SequenceNode {
		return 0, fmt.Errorf("%s: cases is not a list", path)
	}
	have := map[string]bool{}
	for _, c := range cases.Content {
		var x struct {
			Recorded string `yaml:"recorded"`
		}
		if err := c.Decode(&x); err == nil && x.Recorded != "" {
			have[x.Recorded] = true
		}
	}
	added := 0
	for _, r := range recs {
		if have[r.SHA256] {
			continue
		}
		have[r.SHA256] = true
		var input map[string]any
		if err := json.Unmarshal(r.Input, &input); err != nil {
			return added, fmt.Errorf("recorded input %s: %w", r.SHA256, err)
		}
		expect := map[string]any{"decision": r.Decision}
		if len(r.Reasons) > 0 {
			expect["reasons"] = r.Reasons
		}
		var n yaml.Node
		if err := n.Encode(map[string]any{"name": r.Name, "recorded": r.SHA256, "exact": true, "input": input, "expect": expect}); err != nil {
			return added, fmt.Errorf("encode case %s: %w", r.Name, err)
		}
		cases.Content = append(cases.Content, &n)
		added++
	}
	if added == 0 {
		return 0, nil
	}
	var out bytes.Buffer
	enc := yaml.NewEncoder(&out)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return 0, fmt.Errorf("encode %s: %w", path, err)
	}
	if err := enc.Close(); err != nil {
		return 0, fmt.Errorf("encode %s: %w", path, err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, out.Bytes(), 0o644); err != nil {
		return 0, fmt.Errorf("write test cases: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return 0, fmt.Errorf("write test cases: %w", err)
	}
	return added, nil
}
