package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"gopkg.in/yaml.v3"

	"github.com/berthhq/berth/sdk/client"
)

func newSpecCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "spec get|set SERVICE",
		RunE:  groupRunE,
		Short: "Read or write a service's runtime spec",
		Long: `spec reads or writes a service's runtime spec (docs/reconciliation.md
section 1): its placement, replica counts, hold, resources, readiness probe
and network.`,
		Example: `  berth spec get hello > hello-spec.json
  berth spec set hello -f hello-spec.json`,
	}
	cmd.AddCommand(newSpecGetCmd(a), newSpecSetCmd(a))
	return cmd
}

func newSpecGetCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "get SERVICE",
		Short: "Print a service's runtime spec as JSON",
		Long: `get prints the service's runtime spec document as JSON, whatever -o says:
{"service", "source", "spec"}. source is "service" while the spec is derived
from the service's own replicas and health check, "operator" once it was
written with 'berth spec set' (the spec then owns placement and replicas).
The printed document can be edited and given back to 'berth spec set -f'.`,
		Example: `  berth spec get hello`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, s, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			doc, err := c.GetRuntimeSpec(cmd.Context(), s.Project, args[0])
			if err != nil {
				return fmt.Errorf("get spec of %s/%s: %w", s.Project, args[0], err)
			}
			return printJSON(a.stdout, doc)
		},
	}
}

func newSpecSetCmd(a *app) *cobra.Command {
	var (
		file     string
		expected int64
		create   bool
	)
	cmd := &cobra.Command{
		Use:   "set SERVICE -f FILE [--expected-revision N | --create]",
		Short: "Replace a service's runtime spec from a YAML or JSON file",
		Long: `set replaces the service's runtime spec with the one in FILE ("-" reads
stdin), with one compare-and-set on the spec's revision (docs/reconciliation.md
section 1). Every field is replaced; a field left out takes its default.

FILE is JSON or YAML holding one runtime spec:

  placement   {mode: scheduled|every-node|pinned, nodes: [node ids, pinned only]}
  replicas    {total: N} for scheduled, {per_node: N} otherwise
  hold        true desires nothing: every slot is stopped
  resources   {memory_bytes, cpu_millis}; 0 is no limit
  readiness   {kind: process|tcp|http, port, path, initial_delay_ms,
               startup_grace_ms, interval_ms, timeout_ms, successes, failures}
  network     host (default) or isolated
  revision    ignored

or the whole document 'berth spec get' prints, whose spec is taken. An unknown
field is an error.

Which revision the write expects:
  --expected-revision N  the operator spec must be at revision N;
  --create               no operator spec may exist yet (expected_revision null);
  neither                read-modify-write: the current document is read first,
                         and its revision is expected when its source is
                         "operator", none when it is "service". Between that
                         read and the write another operator may write too:
                         one of two racing writers is refused with "conflict".
Every accepted write, even one that only changes replicas, is a new desire:
the replicas are replaced one at a time ('berth rollout status' follows it).`,
		Example: `  berth spec set hello -f hello-spec.yaml
  berth spec set hello -f hello-spec.json --expected-revision 3

  # hello-spec.yaml
  placement: {mode: scheduled}
  replicas: {total: 3}
  readiness: {kind: http, port: 8080, path: /healthz}`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			hasExpected := cmd.Flags().Changed("expected-revision")
			if create && hasExpected {
				return fmt.Errorf("spec set: --create and --expected-revision exclude each other")
			}
			r, done, err := a.openInput("spec set", file)
			if err != nil {
				return err
			}
			defer done()
			spec, err := parseSpecFile(r, file)
			if err != nil {
				return err
			}
			c, s, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			w := client.SpecWrite{Spec: spec}
			switch {
			case create:
			case hasExpected:
				w.ExpectedRevision = &expected
			default:
				cur, err := c.GetRuntimeSpec(cmd.Context(), s.Project, name)
				if err != nil {
					return fmt.Errorf("read spec of %s/%s: %w", s.Project, name, err)
				}
				switch cur.Source {
				case "operator":
					rev := cur.Spec.Revision
					w.ExpectedRevision = &rev
				case "service":
				default:
					return fmt.Errorf("read spec of %s/%s: unknown source %q; pass --expected-revision or --create", s.Project, name, cur.Source)
				}
			}
			doc, err := c.PutRuntimeSpec(cmd.Context(), s.Project, name, w)
			if err != nil {
				return fmt.Errorf("set spec of %s/%s: %w", s.Project, name, err)
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, doc)
			}
			fmt.Fprintf(a.stdout, "spec of %s at revision %d\n", name, doc.Spec.Revision)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVarP(&file, "filename", "f", "", `file holding the spec, YAML or JSON ("-" for stdin)`)
	f.Int64Var(&expected, "expected-revision", 0, "write only if the operator spec is at this revision")
	f.BoolVar(&create, "create", false, "write only if no operator spec exists yet")
	return cmd
}

// parseSpecFile reads one runtime spec from a YAML or JSON file, either bare or as the
// {"service", "source", "spec"} document 'berth spec get' prints. name is the file name, used to
// choose the format (".json", ".yaml", ".yml", else the first byte) and in errors. Unknown fields
// are refused.
func parseSpecFile(r io.Reader, name string) (client.RuntimeSpec, error) {
	br := bufio.NewReader(r)
	isJSON := strings.HasSuffix(name, ".json")
	if !isJSON && !strings.HasSuffix(name, ".yaml") && !strings.HasSuffix(name, ".yml") {
		isJSON = startsJSON(br)
	}
	raw, err := specFileJSON(br, isJSON)
	if err != nil {
		return client.RuntimeSpec{}, fmt.Errorf("parse %s: %w", name, err)
	}
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(raw, &probe); err != nil {
		return client.RuntimeSpec{}, fmt.Errorf("parse %s: want one object: %w", name, err)
	}
	var spec client.RuntimeSpec
	if _, whole := probe["spec"]; whole {
		var doc client.RuntimeSpecDoc
		if err := strictJSON(raw, &doc); err != nil {
			return client.RuntimeSpec{}, fmt.Errorf("parse %s: %w", name, err)
		}
		return doc.Spec, nil
	}
	if err := strictJSON(raw, &spec); err != nil {
		return client.RuntimeSpec{}, fmt.Errorf("parse %s: %w", name, err)
	}
	return spec, nil
}

// specFileJSON returns the single document of a spec file as JSON. YAML goes through yaml.v3 into
// generic values and back to JSON, so that the JSON field names of client.RuntimeSpec apply to both.
func specFileJSON(br *bufio.Reader, isJSON bool) ([]byte, error) {
	if isJSON {
		dec := json.NewDecoder(br)
		var raw json.RawMessage
		if err := dec.Decode(&raw); errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("no spec in the file")
		} else if err != nil {
			return nil, err
		}
		if err := dec.Decode(new(json.RawMessage)); !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("want one spec in the file")
		}
		return bytes.TrimSpace(raw), nil
	}
	dec := yaml.NewDecoder(br)
	var docs []any
	for n := 1; ; n++ {
		var v any
		err := dec.Decode(&v)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", n, err)
		}
		if v != nil {
			docs = append(docs, v)
		}
	}
	switch len(docs) {
	case 0:
		return nil, fmt.Errorf("no spec in the file")
	case 1:
	default:
		return nil, fmt.Errorf("want one spec in the file, found %d documents", len(docs))
	}
	b, err := json.Marshal(docs[0])
	if err != nil {
		return nil, fmt.Errorf("convert YAML: %w", err)
	}
	return b, nil
}
