package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/berthhq/berth/abi/provider"
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
	var kind, junit, samples, config, subnet, resetCommand string
	var args, teardownArgs, requireCaps []string
	var image, imageArchive string
	cmd := &cobra.Command{
		Use:   "plugin PATH",
		Short: "Run the conformance suite on a built plugin binary",
		Long: `plugin launches the binary at PATH once per case, as berthd or the agent would
(go-plugin handshake, version negotiation, gRPC), and checks it against the
provider or runtime-driver contract: Describe, the health stream, Plan equals
Apply, idempotent replays, refusal of stale fencing tokens, Delete then Read,
deadlines, crashes mid-call, and the cases of each advertised capability
(docs/plugins.md section 6), or, with --kind network, against the node-network
contract (Setup, Attach, Detach, List, fencing, durable allocations; section
7; needs the privileges the plugin needs). It prints one line per case and
exits 1 when a case failed.

--arg gives one argument of the binary, and is repeated for each: write
--arg=--state-dir --arg={state}, or --arg --state-dir --arg {state}. "{state}"
anywhere in an argument becomes a fresh, empty state directory of the case,
so state never leaks from one case to the next. Without --arg a runtime
driver gets "--state-dir {state}" and a provider no argument.

For a gateway provider (one that manages gateway.route_table), "{listen}" in
an argument becomes a free loopback address ("127.0.0.1:PORT") each launch
must serve HTTP on, and the gateway cases run after the provider suite: real
HTTP through that address to upstreams the suite starts (a host routed to its
upstream, an unknown host answered 404, a table swap withdrawing a host, a
replayed idempotency key changing nothing, a stale fencing token refused;
docs/plugins.md section 6.3).

--config names a JSON file holding the plugin's configuration (an object, as
in its plugins.json entry): every case gives it to ValidateConfig and
Configure, and case validate_config expects it to be accepted. Without it the
configuration is {}. Case launch tries it first: a configuration the plugin
refuses fails launch once, with the plugin's reason, and skips every other
case.

--samples names a JSON file holding two states of one resource the provider
manages, [{"type": ..., "id": ..., "attributes": {...}}, {...}] (same type and
id, different attributes). Without it the suite takes the first two examples
the plugin declares for a resource type in Describe (ExampleID and
ExampleAttributes, docs/plugins.md section 6.1) and says so in case launch.

--reset-command CMD (providers) runs CMD with /bin/sh -c before every case,
launch included, with BERTH_CONFORMANCE_CASE set to the case's name: it puts
back what the plugin keeps outside its state directory (a DNS server's zone,
a database server, a vendor's test account), so the cases of a plugin whose
state lives elsewhere do not see each other's writes. A command that exits
non-zero fails the case, with its output, without running it.

A case that needs a capability the plugin does not advertise (durable_state
for providers; outlives_driver, logs and stats for runtime drivers) is
skipped, and the report names the capability. --require-capability NAME,
repeated for each, turns such a skip into a failure, so a plugin that
advertises nothing cannot pass a job that needs it.`,
		Example: `  berth conformance plugin bin/berth-plugin-process --kind runtime
  berth conformance plugin bin/berth-plugin-nftables --kind network --arg=--state-dir --arg={state} --teardown-arg=teardown --teardown-arg=--state-dir --teardown-arg={state} --teardown-arg=--subnet --teardown-arg=10.213.0.0/24
  berth conformance plugin bin/berth-plugin-gateway --arg=--listen --arg={listen} --arg=--state-dir --arg={state}
  berth conformance plugin ./provider-hello --arg=--state-dir --arg={state} --config examples/provider-hello/config.json --junit report.xml
  berth conformance plugin ./provider-hello --arg=--state-dir --arg={state} --samples examples/provider-hello/samples.json
  berth conformance plugin bin/berth-plugin-dns --arg=--state-dir --arg={state} --config dns.json --samples records.json --reset-command ./reset-zone.sh --require-capability durable_state`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, pos []string) error {
			gatewayArgs := func(state, listen string) []string {
				out := make([]string, len(args))
				for i, s := range args {
					out[i] = strings.ReplaceAll(strings.ReplaceAll(s, "{state}", state), "{listen}", listen)
				}
				return out
			}
			argsFor := func(state string) []string {
				listen := "127.0.0.1:0"
				if slices.ContainsFunc(args, func(s string) bool { return strings.Contains(s, "{listen}") }) {
					if l, err := freeLoopback(); err == nil {
						listen = l
					}
				}
				return gatewayArgs(state, listen)
			}
			if resetCommand != "" && kind != "provider" {
				msg := "--reset-command is for providers (--kind provider)"
				if kind == "network" {
					msg += "; network plugins have --teardown-arg"
				}
				return errors.New(msg)
			}
			if len(requireCaps) > 0 && kind == "network" {
				return fmt.Errorf("--require-capability: the network suite has no capability-gated case")
			}
			var report *conformance.Report
			var err error
			switch kind {
			case "runtime":
				if !cmd.Flags().Changed("arg") {
					args = []string{"--state-dir", "{state}"}
				}
				rc := conformance.RuntimeConfig{Binary: pos[0], Args: argsFor, RequireCapabilities: requireCaps}
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
				pc, cerr := loadPluginConfig(config)
				if cerr != nil {
					return cerr
				}
				pcfg := conformance.ProviderConfig{Binary: pos[0], Args: argsFor, Samples: s, PluginConfig: pc, RequireCapabilities: requireCaps}
				if resetCommand != "" {
					pcfg.Reset = func(ctx context.Context, caseName string) error { return runResetCommand(ctx, resetCommand, caseName) }
				}
				report, err = conformance.CheckProvider(cmd.Context(), pcfg)
				if err == nil && slices.ContainsFunc(args, func(s string) bool { return strings.Contains(s, "{listen}") }) {
					var gw *conformance.Report
					gw, err = conformance.CheckGateway(cmd.Context(), conformance.GatewayConfig{Binary: pos[0], Args: gatewayArgs, PluginConfig: pc})
					if err == nil {
						report = mergeReports(report, gw)
					}
				}
			case "network":
				nc := conformance.NetworkConfig{Binary: pos[0], Args: argsFor, Subnet: subnet}
				if len(teardownArgs) > 0 {
					nc.Teardown = func(state string) error {
						ctx, cancel := context.WithTimeout(cmd.Context(), time.Minute)
						defer cancel()
						targs := make([]string, len(teardownArgs))
						for i, s := range teardownArgs {
							targs[i] = strings.ReplaceAll(s, "{state}", state)
						}
						if out, err := exec.CommandContext(ctx, pos[0], targs...).CombinedOutput(); err != nil {
							return fmt.Errorf("%s %s: %w: %s", pos[0], strings.Join(targs, " "), err, out)
						}
						return nil
					}
				}
				report, err = conformance.CheckNetwork(cmd.Context(), nc)
			default:
				return fmt.Errorf("--kind %q: want provider, runtime or network", kind)
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
	f.StringVar(&kind, "kind", "provider", "plugin kind: provider, runtime or network")
	f.StringVar(&subnet, "subnet", "", "network plugins: the pool every case sets up (default "+conformance.DefaultNetworkSubnet+"); must be unused on this node")
	f.StringArrayVar(&teardownArgs, "teardown-arg", nil, `network plugins: argument (repeatable) of the same binary run after each case to remove what the plugin keeps; "{state}" becomes the case's state directory`)
	f.StringVar(&junit, "junit", "", "also write the report as JUnit XML to this file")
	f.StringArrayVar(&args, "arg", nil, `argument for the plugin binary (repeatable); "{state}" becomes a per-case state directory`)
	f.StringVar(&samples, "samples", "", "JSON file with two states of one resource (providers; default: the examples the plugin declares in Describe)")
	f.StringVar(&config, "config", "", "JSON file with the plugin's configuration, an object (providers; default {})")
	f.StringVar(&resetCommand, "reset-command", "", "providers: shell command run before every case to put back the state the plugin keeps outside its state directory ($BERTH_CONFORMANCE_CASE names the case)")
	f.StringArrayVar(&requireCaps, "require-capability", nil, "capability (repeatable) whose capability-gated case must run: skipping it for want of the capability fails instead")
	f.StringVar(&image, "image", "", "runtime drivers of containers: the image (with /bin/sh) every workload of the suite runs in, pinned by digest")
	f.StringVar(&imageArchive, "image-archive", "", "with --image sha256:...: the OCI image layout tar holding it")
	return cmd
}

// runResetCommand runs command with /bin/sh -c before the case caseName
// (BERTH_CONFORMANCE_CASE in its environment) and returns an error holding
// its output when it exits non-zero.
func runResetCommand(ctx context.Context, command, caseName string) error {
	c := exec.CommandContext(ctx, "/bin/sh", "-c", command)
	c.Env = append(os.Environ(), "BERTH_CONFORMANCE_CASE="+caseName)
	c.WaitDelay = 5 * time.Second // a child that keeps the output open past the deadline
	out, err := c.CombinedOutput()
	if err != nil {
		return fmt.Errorf("reset command %q: %w: %s", command, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// freeLoopback returns a loopback address no listener holds right now.
func freeLoopback() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := ln.Addr().String()
	return addr, ln.Close()
}

// mergeReports appends the gateway cases to the provider suite's report,
// naming the gateway's launch case gateway_launch.
func mergeReports(prov, gw *conformance.Report) *conformance.Report {
	out := *prov
	out.Suite = "provider and gateway"
	out.Results = slices.Clone(prov.Results)
	for _, r := range gw.Results {
		if r.Name == "launch" {
			r.Name = "gateway_launch"
		}
		out.Results = append(out.Results, r)
	}
	return &out
}

// loadPluginConfig reads the --config file: one JSON object; nil when path is "".
func loadPluginConfig(path string) (json.RawMessage, error) {
	if path == "" {
		return nil, nil
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--config: %w", err)
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
		return nil, fmt.Errorf("--config %s: want one JSON object, the plugin's configuration", path)
	}
	return json.RawMessage(raw), nil
}

// loadSamples reads the provider samples file; none when path is "" (the
// suite then takes the plugin's declared examples).
func loadSamples(path string) ([2]provider.Resource, error) {
	var out [2]provider.Resource
	if path == "" {
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
