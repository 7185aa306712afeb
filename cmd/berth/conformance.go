package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/berthhq/berth/abi/provider"
	"github.com/berthhq/berth/abi/routes"
	"github.com/berthhq/berth/abi/runtime"
	"github.com/berthhq/berth/conformance"
)

func newConformanceCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "conformance",
		Short: "Check plugins and WebAssembly modules against Berth's contracts",
		Long: `conformance runs the suites an extension author runs in CI: "plugin" for a
provider plugin or runtime-driver binary (docs/plugins.md section 6), "wasm"
for a WebAssembly module (docs/wasm-abi.md), "node" for a node agent or a
berthd against the node session protocol (docs/node-protocol.md).`,
		Args: cobra.ArbitraryArgs,
		RunE: groupRunE,
	}
	cmd.AddCommand(newConformancePluginCmd(a), newConformanceWasmCmd(a), newConformanceNodeCmd(a))
	return cmd
}

func newConformancePluginCmd(a *app) *cobra.Command {
	var kind, junit, samples string
	var args []string
	var image, imageArchive string
	cmd := &cobra.Command{
		Use:   "plugin PATH",
		Short: "Run the conformance suite on a built plugin binary",
		Long: `plugin launches the binary at PATH once per case, as berthd or the agent would
(go-plugin handshake, version negotiation, gRPC), and checks it against the
provider or runtime-driver contract: Describe, the health stream, Plan equals
Apply, idempotent replays, refusal of stale fencing tokens, Delete then Read,
deadlines, crashes mid-call, and the cases of each advertised capability
(docs/plugins.md section 6). It prints one line per case and exits 1 when a
case failed.

--arg gives the binary's arguments, one per flag; "{state}" in an argument is
replaced by a fresh state directory per case. Without --arg a runtime driver
gets "--state-dir {state}" and a provider nothing.

--samples names a JSON file holding two states of one resource the provider
manages, [{"type": ..., "id": ..., "attributes": {...}}, {...}]; without it
the suite uses two route tables (gateway.route_table), which suits gateways.`,
		Example: `  berth conformance plugin bin/berth-plugin-process --kind runtime
  berth conformance plugin bin/berth-plugin-gateway --arg=--listen --arg=127.0.0.1:0
  berth conformance plugin ./provider-hello --arg=--state-dir --arg={state} --samples hello.json --junit report.xml`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, pos []string) error {
			argsFor := func(state string) []string {
				out := make([]string, len(args))
				for i, s := range args {
					out[i] = strings.ReplaceAll(s, "{state}", state)
				}
				return out
			}
			var report *conformance.Report
			var err error
			switch kind {
			case "runtime":
				if !cmd.Flags().Changed("arg") {
					args = []string{"--state-dir", "{state}"}
				}
				rc := conformance.RuntimeConfig{Binary: pos[0], Args: argsFor}
				if image != "" { // a container driver runs the suite's shell in this image
					rc.Prepare = func(req *runtime.StartRequest) { req.Image, req.ImageArchive = image, imageArchive }
					rc.Env = map[string]string{"PATH": "/bin:/usr/bin"}
				}
				report, err = conformance.CheckRuntimeDriver(cmd.Context(), rc)
			case "provider":
				s, serr := loadSamples(samples)
				if serr != nil {
					return serr
				}
				report, err = conformance.CheckProvider(cmd.Context(), conformance.ProviderConfig{Binary: pos[0], Args: argsFor, Samples: s})
			default:
				return fmt.Errorf("--kind %q: want provider or runtime", kind)
			}
			if err != nil {
				return err
			}
			if junit != "" {
				f, err := os.Create(junit)
				if err != nil {
					return fmt.Errorf("--junit: %w", err)
				}
				werr := report.WriteJUnit(f)
				if cerr := f.Close(); werr == nil {
					werr = cerr
				}
				if werr != nil {
					return fmt.Errorf("--junit: %w", werr)
				}
			}
			if err := report.WriteText(a.stdout); err != nil {
				return err
			}
			if !report.OK() {
				return fmt.Errorf("%d conformance case(s) failed: %s", len(report.Failed()), strings.Join(report.Failed(), ", "))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&kind, "kind", "provider", "plugin kind: provider or runtime")
	f.StringVar(&junit, "junit", "", "also write the report as JUnit XML to this file")
	f.StringArrayVar(&args, "arg", nil, `argument for the plugin binary (repeatable); "{state}" becomes a per-case state directory`)
	f.StringVar(&samples, "samples", "", "JSON file with two states of one resource (providers)")
	f.StringVar(&image, "image", "", "runtime drivers of containers: the image (with /bin/sh) every workload of the suite runs in, pinned by digest")
	f.StringVar(&imageArchive, "image-archive", "", "with --image sha256:...: the OCI image layout tar holding it")
	return cmd
}

// loadSamples reads the provider samples file, or returns two route tables.
func loadSamples(path string) ([2]provider.Resource, error) {
	var out [2]provider.Resource
	if path == "" {
		for i, addr := range []string{"127.0.0.1:9", "127.0.0.1:10"} {
			raw, _ := json.Marshal(routes.Table{Revision: int64(i + 1), Routes: []routes.Route{{ // plain structs: cannot fail
				Hostname: "conformance.test", Project: "prj_conformance", Service: "web",
				Upstreams: []routes.Upstream{{WorkloadID: "wl_conformance", Address: addr, Healthy: true}},
			}}})
			out[i] = provider.Resource{Type: routes.ResourceType, ID: routes.ResourceID, Attributes: raw}
		}
		return out, nil
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return out, fmt.Errorf("--samples: %w", err)
	}
	var items []struct {
		Type       string          `json:"type"`
		ID         string          `json:"id"`
		Attributes json.RawMessage `json:"attributes"`
	}
	if err := json.Unmarshal(raw, &items); err != nil {
		return out, fmt.Errorf("--samples %s: %w", path, err)
	}
	if len(items) != 2 {
		return out, errors.New("--samples: want a JSON array of exactly two resources")
	}
	for i, it := range items {
		out[i] = provider.Resource{Type: it.Type, ID: it.ID, Attributes: it.Attributes}
	}
	return out, nil
}
