package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestParseServiceFileBindingsBackupAndDeployOnPush: the README's fields for
// databases, their backups and deploy on push reach the spec, in YAML and
// JSON alike.
func TestParseServiceFileBindingsBackupAndDeployOnPush(t *testing.T) {
	for name, in := range map[string]string{
		"svc.yaml": `
name: shop
image: default/shop:main
deploy_on_push: true
bindings: [{name: db, kind: postgres}, {name: files, kind: s3}]
backup: {cron: "0 3 * * *", keep: 7, drill: weekly}
`,
		"svc.json": `{"name": "shop", "image": "default/shop:main", "deploy_on_push": true,
  "bindings": [{"name": "db", "kind": "postgres"}, {"name": "files", "kind": "s3"}],
  "backup": {"cron": "0 3 * * *", "keep": 7, "drill": "weekly"}}`,
	} {
		docs, err := parseServiceFiles(strings.NewReader(in), name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got, _ := json.Marshal(docs[0].spec())
		for _, want := range []string{
			`"bindings":[{"name":"db","kind":"postgres"},{"name":"files","kind":"s3"}]`,
			`"backup":{"cron":"0 3 * * *","keep":7,"drill":"weekly"}`,
			`"deploy_on_push":true`,
		} {
			if !strings.Contains(string(got), want) {
				t.Errorf("%s: spec %s\nwant it to hold %s", name, got, want)
			}
		}
	}
	if _, err := parseServiceFiles(strings.NewReader("name: a\nbindings: [{name: db, kind: postgres, size: 3}]\n"), "x.yaml"); err == nil || !strings.Contains(err.Error(), "size") {
		t.Errorf("an unknown binding field: %v", err)
	}
}

// TestParseServiceFileRollout: the rollout block reads counts and percentages from YAML and
// JSON alike and reaches the spec as the API writes it.
func TestParseServiceFileRollout(t *testing.T) {
	for name, in := range map[string]string{
		"svc.yaml": "name: web\nrollout: {max_surge: 25%, max_unavailable: 1}\n",
		"svc.json": `{"name": "web", "rollout": {"max_surge": "25%", "max_unavailable": 1}}`,
	} {
		docs, err := parseServiceFiles(strings.NewReader(in), name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got, _ := json.Marshal(docs[0].spec())
		if want := `"rollout":{"max_surge":"25%","max_unavailable":1}`; !strings.Contains(string(got), want) {
			t.Errorf("%s: spec %s\nwant it to hold %s", name, got, want)
		}
	}
	if _, err := parseServiceFiles(strings.NewReader("name: a\nrollout: {max_surge: lots}\n"), "x.yaml"); err == nil || !strings.Contains(err.Error(), "percentage") {
		t.Errorf("a bad bound: %v", err)
	}
}

// TestParseServiceFilePlacement: the placement fields of docs/placement.md reach the spec, in
// YAML and JSON alike.
func TestParseServiceFilePlacement(t *testing.T) {
	for name, in := range map[string]string{
		"svc.yaml": `
name: web
resources: {cpu_m: 250, memory_mib: 512, extended: {gpu: 1}}
node_selector: {disk: ssd}
region: eu
spread_by: label:zone
max_per_node: 1
anti_affinity: [db]
preferences: {tier: fast}
`,
		"svc.json": `{"name": "web", "resources": {"cpu_m": 250, "memory_mib": 512, "extended": {"gpu": 1}},
  "node_selector": {"disk": "ssd"}, "region": "eu", "spread_by": "label:zone", "max_per_node": 1,
  "anti_affinity": ["db"], "preferences": {"tier": "fast"}}`,
	} {
		docs, err := parseServiceFiles(strings.NewReader(in), name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got, _ := json.Marshal(docs[0].spec())
		for _, want := range []string{
			`"resources":{"cpu_m":250,"memory_mib":512,"extended":{"gpu":1}}`,
			`"node_selector":{"disk":"ssd"}`, `"region":"eu"`, `"spread_by":"label:zone"`, `"max_per_node":1`,
			`"anti_affinity":["db"]`, `"preferences":{"tier":"fast"}`,
		} {
			if !strings.Contains(string(got), want) {
				t.Errorf("%s: spec %s\nwant it to hold %s", name, got, want)
			}
		}
	}
}
