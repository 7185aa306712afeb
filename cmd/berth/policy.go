package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	abiwasm "github.com/berthhq/berth/abi/wasm"
	wasmconf "github.com/berthhq/berth/conformance/wasm"
	hostwasm "github.com/berthhq/berth/host/wasm"
	"github.com/berthhq/berth/sdk/client"
)

func newPolicyCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "policy",
		Short: "Test admission policies and read their decisions",
		RunE:  groupRunE,
	}
	var module, recordHook, entrypoint string
	var record bool
	var recordLimit int
	test := &cobra.Command{
		Use:   "test DIR [--module FILE.wasm|BUNDLE.tar.gz [--entrypoint E]] [--record [--limit N] [--hook H]]",
		Short: "Run a policy's or a route compiler's declarative test cases (DIR/policy_test.yaml)",
		Long: `test runs the cases of DIR/policy_test.yaml against a policy module or a route
compiler (told apart by the module's metadata), locally, with the same runtime
and limits as the server. The module is --module, else the file's module field
(relative to DIR), else DIR/policy.wasm; an OPA bundle (the bundle.tar.gz of
opa build -t wasm) is taken as module push --kind opa takes it, with
--entrypoint. A policy's case gives an input and the decision expected; a route compiler's gives services and workloads and the
whole route table expected, and the table must pass the checks the server
applies before it uses one (docs/wasm-abi.md section 8). Each input is first
checked: a field the server never sends fails its case, naming the field. It
exits 1 when a case fails.

With --record, nothing is run: the newest decisions of the server (--limit,
default 50; --hook to keep one hook) made by this module (same digest) are
added to DIR/policy_test.yaml as exact cases expecting what the module
answered, with the input the server really sent. The server keeps the inputs
of its newest decisions in memory only; decisions it no longer keeps are
counted and left out.`,
		Example: `  berth policy test examples/policies/require-digest-as
  berth policy test examples/policies/require-labels --module build/wasm/require-labels.wasm
  berth policy test my-routes --module build/wasm/my-routes.wasm
  berth policy test examples/policies/require-health-check --module build/wasm/require-health-check.wasm --record --limit 20`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			suite, path, err := wasmconf.LoadSuite(args[0], module)
			if err != nil {
				return err
			}
			if _, err := os.Stat(path); module == "" && errors.Is(err, fs.ErrNotExist) {
				name := filepath.Base(filepath.Clean(args[0]))
				return fmt.Errorf("policy test: no module at %s: a module is built, not checked in; "+
					"for the examples 'make wasm' builds build/wasm/%s.wasm, then pass it: "+
					"berth policy test %s --module build/wasm/%s.wasm: %w", path, name, args[0], name, err)
			}
			m, closeRT, err := loadModule(ctx, path, entrypoint)
			if err != nil {
				return err
			}
			defer closeRT()
			if record && m.Metadata().Kind != abiwasm.KindPolicy {
				return fmt.Errorf("policy test --record: %s is a %s module; the server records the inputs of policy decisions only", path, m.Metadata().Kind)
			}
			if record {
				return a.recordCases(cmd, args[0], m.Digest(), recordHook, recordLimit)
			}
			failed := 0
			for _, r := range suite.Run(ctx, m) {
				if r.Err != nil {
					failed++
					fmt.Fprintf(a.stdout, "FAIL  %s: %v\n", r.Name, r.Err)
				} else {
					fmt.Fprintf(a.stdout, "ok    %s\n", r.Name)
				}
			}
			if failed > 0 {
				return fmt.Errorf("%d of %d cases failed", failed, len(suite.Cases))
			}
			fmt.Fprintf(a.stdout, "%d cases passed (%s %s)\n", len(suite.Cases), m.Metadata().Name, m.Digest())
			return nil
		},
	}
	test.Flags().StringVar(&module, "module", "", "the module to test (default: from policy_test.yaml, else DIR/policy.wasm)")
	test.Flags().StringVar(&entrypoint, "entrypoint", "", "for an OPA bundle: the entrypoint that decides, as module push --kind opa takes it (default: the one named deny, else allow)")
	test.Flags().BoolVar(&record, "record", false, "add the server's recent decisions by this module as cases, instead of running the cases")
	test.Flags().IntVar(&recordLimit, "limit", 50, "with --record: how many of the newest decisions to look at, 1 to 1000")
	test.Flags().StringVar(&recordHook, "hook", "", "with --record: only decisions of this hook")
	var limit int
	decisions := &cobra.Command{
		Use:   "decisions [--limit N]",
		Short: "Show the newest recorded policy decisions",
		Long: `decisions shows the newest policy decisions, each with SEQ, its entry in
the cluster change log (docs/wasm-abi.md section 5.5), and the SHA-256 of the
exact input the module saw.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := a.apiClient(cmd)
			if err != nil {
				return err
			}
			ds, err := c.PolicyDecisions(cmd.Context(), limit)
			if err != nil {
				return err
			}
			if a.output == outputJSON {
				return printJSON(a.stdout, ds)
			}
			w := newTable(a.stdout)
			row(w, "AGE", "SEQ", "HOOK", "PROJECT", "RESULT", "MODULE", "INPUT", "WHY")
			for _, d := range ds {
				why := "-"
				if len(d.Reasons) > 0 {
					// A reason may hold commas; "; " keeps reasons apart.
					why = strings.Join(d.Reasons, "; ")
				}
				if d.Error != "" {
					why = d.Error
				}
				seq := "-"
				if d.Seq > 0 {
					seq = strconv.FormatInt(d.Seq, 10)
				}
				row(w, a.since(d.At), seq, d.Hook, orDash(d.Project), d.Result, shortDigest(d.ModuleDigest), d.InputSHA256[:12], why)
			}
			return w.Flush()
		},
	}
	decisions.Flags().IntVar(&limit, "limit", 20, "how many, 1 to 1000")
	cmd.AddCommand(test, decisions)
	return cmd
}

// recordCases adds the newest decisions of module (a digest) to dir's cases.
func (a *app) recordCases(cmd *cobra.Command, dir, module, hook string, limit int) error {
	ctx := cmd.Context()
	c, _, err := a.apiClient(cmd)
	if err != nil {
		return err
	}
	ds, err := c.PolicyDecisions(ctx, limit)
	if err != nil {
		return fmt.Errorf("policy test --record: %w", err)
	}
	var recs []wasmconf.Recording
	gone, other := 0, 0
	for _, d := range ds {
		if d.ModuleDigest != module || (hook != "" && d.Hook != hook) || (d.Result != "allow" && d.Result != "deny") {
			other++
			continue
		}
		raw, err := c.PolicyInput(ctx, d.InputSHA256)
		if client.IsCode(err, "input_not_recorded") {
			gone++
			continue
		} else if err != nil {
			return fmt.Errorf("policy test --record: input of %s: %w", d.ID, err)
		}
		name := fmt.Sprintf("recorded %s %s (%s, %s)", d.Hook, orDash(d.Project), d.Result, d.ID)
		recs = append(recs, wasmconf.Recording{Name: name, Input: raw, SHA256: d.InputSHA256, Decision: d.Result, Reasons: d.Reasons})
	}
	n, err := wasmconf.AppendRecorded(dir, recs)
	if err != nil {
		return fmt.Errorf("policy test --record: %w", err)
	}
	fmt.Fprintf(a.stdout, "recorded %d new case(s) in %s (%d already there, %d no longer kept by the server, %d of other modules, hooks or errors)\n",
		n, filepath.Join(dir, wasmconf.CasesFile), len(recs)-n, gone, other)
	return nil
}

// loadModule loads a module file, a .wasm or an OPA bundle
// ([readModuleFile]), into a fresh runtime with the server's default
// limits; the returned func closes the runtime.
func loadModule(ctx context.Context, path, entrypoint string) (*hostwasm.Module, func(), error) {
	raw, err := readModuleFile(path, entrypoint)
	if err != nil {
		return nil, nil, err
	}
	rt, err := hostwasm.New(ctx, hostwasm.Config{})
	if err != nil {
		return nil, nil, err
	}
	closeRT := func() { _ = rt.Close(context.WithoutCancel(ctx)) }
	m, err := rt.Load(ctx, raw)
	if err != nil {
		closeRT()
		return nil, nil, err
	}
	return m, closeRT, nil
}

func newConformanceWasmCmd(a *app) *cobra.Command {
	var entrypoint string
	cmd := &cobra.Command{
		Use:   "wasm FILE.wasm | BUNDLE.tar.gz [--entrypoint E]",
		Short: "Check a WebAssembly module against the ABI",
		Long: `wasm checks a module's exports and ABI version, its metadata, that the same
input gives the same bytes, that malformed input is answered with the error
convention, that an allocation past the memory limit fails cleanly, and that
the module recovers after a stopped call (docs/wasm-abi.md section 7). An OPA
bundle (opa build -t wasm) is checked as the module that module push --kind opa
uploads, with --entrypoint. It exits 1 when a check fails.`,
		Example: `  berth conformance wasm build/wasm/require-digest.wasm
  opa build -t wasm -e berth/deny policy.rego && berth conformance wasm bundle.tar.gz`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			raw, err := readModuleFile(args[0], entrypoint)
			if err != nil {
				return fmt.Errorf("conformance wasm: %w", err)
			}
			results, err := wasmconf.Check(cmd.Context(), raw, wasmconf.Options{})
			if err != nil {
				return fmt.Errorf("conformance wasm: %w", err)
			}
			failed := 0
			for _, r := range results {
				if r.Err != nil {
					failed++
					fmt.Fprintf(a.stdout, "FAIL  %s: %v\n", r.Name, r.Err)
				} else {
					fmt.Fprintf(a.stdout, "ok    %s\n", r.Name)
				}
			}
			if failed > 0 {
				return fmt.Errorf("%d of %d checks failed", failed, len(results))
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&entrypoint, "entrypoint", "", "for an OPA bundle: the entrypoint that decides, as module push --kind opa takes it (default: the one named deny, else allow)")
	return cmd
}
