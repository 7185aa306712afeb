package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/berthhq/berth/internal/version"
	"github.com/berthhq/berth/sdk/client"
)

// Output formats of -o.
const (
	outputTable = "table"
	outputJSON  = "json"
)

// userAgent is what the CLI sends as User-Agent.
const userAgent = "berth-cli"

// app is one run of the CLI: its streams, its environment and its global flags.
type app struct {
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	getenv func(string) string
	// now is the clock used for ages; nil means time.Now.
	now func() time.Time
	// httpClient replaces the API client's *http.Client; nil keeps the default.
	httpClient *http.Client

	// Global flags.
	server      string
	token       string
	project     string
	output      string
	fingerprint string
}

// run executes the CLI with args and returns the process exit code: 0, or 1
// after printing "error: <message>" on stderr.
func run(ctx context.Context, a *app, args []string) int {
	root := newRootCmd(a)
	root.SetArgs(args)
	root.SetIn(a.stdin)
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)
	if err := root.ExecuteContext(ctx); err != nil {
		var st exitStatus
		if errors.As(err, &st) { // the command said what happened; its code is the answer
			if st.msg != "" {
				fmt.Fprintln(a.stderr, st.msg)
			}
			return st.code
		}
		if a.output == outputJSON {
			printErrorJSON(a.stdout, err)
		}
		fmt.Fprintf(a.stderr, "error: %s\n", err)
		var refused passwordRefused
		switch {
		case errors.As(err, &refused):
			fmt.Fprintln(a.stderr, "hint: check the user name and password; after 10 failed logins in a minute further attempts for that user are slowed.")
		case client.IsCode(err, "unauthenticated"):
			fmt.Fprintln(a.stderr, "hint: the server refused the token. It is taken from --token, else $BERTH_TOKEN, else the"+
				" config file written by 'berth login'; berthd keeps its admin token in <data-dir>/admin-token."+
				" A revoked or rotated token, or a session ended by a password change, fails at once: run 'berth login' again.")
		}
		if client.IsCode(err, "reauthentication_required") {
			fmt.Fprintln(a.stderr, "hint: this action needs a login within the last 5 minutes: run 'berth login --user NAME' and try again.")
		}
		return 1
	}
	return 0
}

func newRootCmd(a *app) *cobra.Command {
	root := &cobra.Command{
		Use:   "berth",
		Short: "Operate a Berth deployment control plane",
		Long: `berth talks to a Berth server's API: it applies services, pushes release
bundles, follows and undoes rollouts, writes runtime specs, creates node join
tokens, retires nodes and shows nodes, services, slots and workloads.

The server, token, project and certificate fingerprint come from, in this
order: the flags --server, --token, --project and --fingerprint; the
environment variables BERTH_SERVER, BERTH_TOKEN, BERTH_PROJECT and
BERTH_FINGERPRINT; the file written by "berth login"
($XDG_CONFIG_HOME/berth/config.json, by default ~/.config/berth/config.json).`,
		Example: `  berth login --server https://berth.example.com --token brt_... --fingerprint sha256:...
  berth bundle push ./build --name hello
  berth apply -f hello.yaml
  berth rollout status hello
  berth get services`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			switch a.output {
			case outputTable, outputJSON:
				return nil
			default:
				return fmt.Errorf("--output %q: want table or json", a.output)
			}
		},
	}
	root.CompletionOptions.DisableDefaultCmd = true
	root.Version = version.Version
	root.SetVersionTemplate(version.Line("berth") + "\n")
	pf := root.PersistentFlags()
	pf.StringVar(&a.server, "server", "", "Berth server URL (env BERTH_SERVER)")
	pf.StringVar(&a.token, "token", "", "API token (env BERTH_TOKEN)")
	pf.StringVar(&a.project, "project", "default", "project to work in (env BERTH_PROJECT)")
	pf.StringVar(&a.fingerprint, "fingerprint", "", "SHA-256 fingerprint of the server's TLS certificate to pin (env BERTH_FINGERPRINT; empty trusts the system CAs)")
	pf.StringVarP(&a.output, "output", "o", outputTable, "output format: table or json")

	root.AddCommand(
		newLoginCmd(a),
		newApplyCmd(a),
		newGetCmd(a),
		newDescribeCmd(a),
		newRolloutCmd(a),
		newJobCmd(a),
		newRunCmd(a),
		newSpecCmd(a),
		newDeleteCmd(a),
		newBindingCmd(a),
		newResourceCmd(a),
		newJoinTokenCmd(a), newJoinCodeCmd(a), newMachineCmd(a),
		newNodeCmd(a),
		newClusterCmd(a),
		newBundleCmd(a),
		newImageCmd(a),
		newReleaseCmd(a),
		newRegistryCmd(a),
		newBackupCmd(a),
		newModuleCmd(a),
		newRoutesCmd(a),
		newDNSCmd(a),
		newPolicyCmd(a),
		newConformanceCmd(a),
		newPluginsCmd(a),
		newRunnerCmd(a),
		newPlacementCmd(a),
		newRebalanceCmd(a),
		newOperationCmd(a),
		newLogsCmd(a),
		newTokenCmd(a),
		newUserCmd(a),
		newAuditCmd(a),
		newSecretCmd(a),
		newSecretsCmd(a),
	)
	return root
}

// clock returns the current time of the app's clock.
func (a *app) clock() time.Time {
	if a.now != nil {
		return a.now()
	}
	return time.Now()
}

// apiClient resolves the settings and returns a client that sends the token.
func (a *app) apiClient(cmd *cobra.Command) (*client.Client, settings, error) {
	s, err := a.resolve(cmd)
	if err != nil {
		return nil, s, err
	}
	if s.Server == "" {
		return nil, s, fmt.Errorf("no server: pass --server, set BERTH_SERVER, or run berth login")
	}
	if s.Token == "" {
		return nil, s, fmt.Errorf("no token: pass --token, set BERTH_TOKEN, or run berth login")
	}
	c, err := a.newClient(s.Server, s.Token, s.Fingerprint)
	return c, s, err
}

// newClient returns an API client; a non-empty fingerprint pins the server's
// certificate (docs/node-protocol.md section 2.2).
func (a *app) newClient(server, token, fingerprint string) (*client.Client, error) {
	return client.New(server, client.WithToken(token), client.WithUserAgent(userAgent),
		client.WithFingerprint(fingerprint), client.WithHTTPClient(a.httpClient))
}

// groupRunE makes a command that only groups subcommands print its help when
// called bare and fail on an unknown subcommand, instead of exiting 0.
func groupRunE(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return cmd.Help()
	}
	var names []string
	for _, sub := range cmd.Commands() {
		if sub.IsAvailableCommand() {
			names = append(names, sub.Name())
		}
	}
	return fmt.Errorf("unknown command %q for %q; want one of: %s", args[0], cmd.CommandPath(), strings.Join(names, ", "))
}

// errorJSON is what a command under -o json prints on stdout when it fails, so
// that a script reading its output gets JSON either way: the message (the
// same as on stderr) and, for a refusal of the server, the problem's code and
// HTTP status (abi/errors).
type errorJSON struct {
	Error errorBody `json:"error"`
}

type errorBody struct {
	Message string `json:"message"`
	Code    string `json:"code,omitempty"`
	Status  int    `json:"status,omitempty"`
}

// printErrorJSON writes err as an errorJSON object to w.
func printErrorJSON(w io.Writer, err error) {
	body := errorBody{Message: err.Error()}
	var ae *client.APIError
	if errors.As(err, &ae) {
		body.Code, body.Status = ae.Problem.Code, ae.Status
	}
	_ = printJSON(w, errorJSON{Error: body})
}
