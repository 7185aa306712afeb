package main

import (
	"bufio"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/berthhq/berth/sdk/client"
)

func newLoginCmd(a *app) *cobra.Command {
	var tokenStdin, passwordStdin bool
	var user string
	var sessionTTL time.Duration
	cmd := &cobra.Command{
		Use:   "login --server URL (--token TOKEN | --token-stdin | --user NAME [--password-stdin])",
		Short: "Log in as a user, or check a server URL and token, then save them for later commands",
		Long: `login checks the server URL and API token with a real call (listing projects)
and, when the server accepts them, saves them to the config file
($XDG_CONFIG_HOME/berth/config.json or ~/.config/berth/config.json, mode 0600).
A --project given here is saved as the default project too.

The server's TLS certificate is pinned by its SHA-256 fingerprint: berthd
writes it to DATA/server-fingerprint and prints it at start, and join commands
carry it. Without --fingerprint (or BERTH_FINGERPRINT), login accepts a
certificate only when a CA this machine trusts signed it; otherwise it shows
the fingerprint it saw and stops, so you can compare it with the server's file
and run again with --fingerprint. The pinned fingerprint is saved with the
token, and every later command refuses any other certificate.

Prefer --token-stdin: a token on the command line lands in shell history.

With --user NAME, login asks for NAME's password (without echo; or reads
the first line of stdin with --password-stdin), opens a session (a brs_
token, valid --session-ttl, 12 h by default) and saves it instead of a
token. Sensitive actions (password changes, node removal, fence-ack) need a
login within the last 5 minutes: run login again before them.`,
		Example: `  berth login --server https://127.0.0.1:7070 --fingerprint "$(cat /var/lib/berth/server-fingerprint)" --user alice
  berth login --server https://127.0.0.1:7070 --fingerprint "$(cat /var/lib/berth/server-fingerprint)" --token-stdin < token.txt
  berth login --server https://berth.example.com --token-stdin < token.txt
  pass show berth | berth login --server https://berth.example.com --token-stdin`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := a.resolve(cmd)
			if err != nil {
				return err
			}
			if user != "" && (tokenStdin || cmd.Flags().Changed("token")) {
				return fmt.Errorf("give --user or a token, not both")
			}
			if passwordStdin && user == "" {
				return fmt.Errorf("--password-stdin needs --user")
			}
			if tokenStdin {
				if cmd.Flags().Changed("token") {
					return fmt.Errorf("give --token or --token-stdin, not both")
				}
				line, err := bufio.NewReader(a.stdin).ReadString('\n')
				if err != nil && line == "" {
					return fmt.Errorf("read token from stdin: %w", err)
				}
				s.Token = strings.TrimSpace(line)
			}
			if s.Server == "" {
				return fmt.Errorf("no server: pass --server URL")
			}
			if s.Token == "" && user == "" {
				return fmt.Errorf("no token: pass --token, --token-stdin or --user")
			}
			// The pin saved for another login is not evidence for this one.
			if s.FingerprintFromFile {
				s.Fingerprint = ""
			}
			if s.Fingerprint != "" {
				fp, err := client.ParseFingerprint(s.Fingerprint)
				if err != nil {
					return err
				}
				s.Fingerprint = fp
			} else if strings.HasPrefix(s.Server, "https://") {
				seen, trusted, err := client.ServerFingerprint(s.Server, 10*time.Second)
				if err != nil {
					return fmt.Errorf("login to %s: %w", s.Server, err)
				}
				if !trusted {
					return fmt.Errorf("login to %s: its certificate is not signed by a CA this machine trusts; "+
						"it presented fingerprint %s. Compare it with DATA/server-fingerprint on the server, then run again with --fingerprint %s",
						s.Server, seen, seen)
				}
				fmt.Fprintf(a.stdout, "server certificate %s is trusted through the system CAs\n", seen)
			}
			if user != "" {
				pw, err := a.readPassword(passwordStdin, fmt.Sprintf("Password for %s: ", user))
				if err != nil {
					return err
				}
				anon, err := a.newClient(s.Server, "", s.Fingerprint)
				if err != nil {
					return err
				}
				sess, err := anon.Login(cmd.Context(), user, pw, sessionTTL)
				if err != nil {
					if client.IsCode(err, "unauthenticated") {
						return fmt.Errorf("login to %s as %s: the server refused the name or password: %w", anon.Server(), user, passwordRefused{err})
					}
					return fmt.Errorf("login to %s as %s: %w", anon.Server(), user, err)
				}
				s.Token = sess.Token
				fmt.Fprintf(a.stdout, "session for %s opened; it expires at %s\n", sess.User, sess.ExpiresAt.UTC().Format(time.RFC3339))
			}
			c, err := a.newClient(s.Server, s.Token, s.Fingerprint)
			if err != nil {
				return err
			}
			// A token bounded to one project or service may not list projects: a 403 still
			// proves the server accepted it.
			if _, err := c.ListProjects(cmd.Context()); err != nil && !client.IsCode(err, "forbidden") {
				if client.IsCode(err, "unauthenticated") {
					return fmt.Errorf("login to %s: the server refused the token: %w", c.Server(), err)
				}
				return fmt.Errorf("login to %s: %w", c.Server(), err)
			}
			fc, err := loadConfig(s.ConfigPath)
			if err != nil {
				return err
			}
			fc.Server, fc.Token, fc.Fingerprint = c.Server(), s.Token, s.Fingerprint
			if cmd.Flags().Changed("project") {
				fc.Project = a.project
			}
			if err := saveConfig(s.ConfigPath, fc); err != nil {
				return err
			}
			if s.Fingerprint != "" {
				fmt.Fprintf(a.stdout, "server certificate %s pinned\n", s.Fingerprint)
			}
			fmt.Fprintf(a.stdout, "logged in to %s; credentials saved to %s\n", c.Server(), s.ConfigPath)
			return nil
		},
	}
	cmd.Flags().BoolVar(&tokenStdin, "token-stdin", false, "read the token from the first line of stdin")
	cmd.Flags().StringVar(&user, "user", "", "log in as this user with a password")
	cmd.Flags().BoolVar(&passwordStdin, "password-stdin", false, "read the password from the first line of stdin (with --user)")
	cmd.Flags().DurationVar(&sessionTTL, "session-ttl", 0, "session lifetime (default 12h, at most 168h)")
	return cmd
}

// readPassword reads a password from the first line of stdin, or prompts for it on the
// terminal without echo.
func (a *app) readPassword(fromStdin bool, prompt string) (string, error) {
	if !fromStdin {
		if f, ok := a.stdin.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
			fmt.Fprint(a.stderr, prompt)
			b, err := term.ReadPassword(int(f.Fd()))
			fmt.Fprintln(a.stderr)
			if err != nil {
				return "", fmt.Errorf("read password: %w", err)
			}
			return string(b), nil
		}
		return "", fmt.Errorf("stdin is not a terminal: pass --password-stdin to read the password from it")
	}
	line, err := bufio.NewReader(a.stdin).ReadString('\n')
	if err != nil && line == "" {
		return "", fmt.Errorf("read password from stdin: %w", err)
	}
	return strings.TrimRight(line, "\r\n"), nil
}

// passwordRefused marks a login whose name or password the server refused, so the token hint
// of an unauthenticated answer is not printed for it.
type passwordRefused struct{ err error }

func (e passwordRefused) Error() string { return e.err.Error() }
func (e passwordRefused) Unwrap() error { return e.err }
