package nodes

import (
	"bytes"
	"fmt"
	"regexp"
	"text/template"
)

// SetupScript is what GET /join/<code>/setup.sh renders (docs/joining.md
// section 3): a POSIX sh script that, run as root on a fresh linux host,
//
//  1. picks the host's architecture (amd64 or arm64) from uname -m;
//  2. downloads berth-agent-linux-<arch>, berth-plugin-process-linux-<arch>
//     and SHA256SUMS from berthd's /downloads over a connection pinned to
//     berthd's public key, and checks each binary against SHA256SUMS and
//     against the sum written into the script itself;
//  3. installs them into BERTH_INSTALL_DIR (default /usr/local/bin);
//  4. enrolls with the join code, which reaches berth-agent on stdin only
//     (printf is a shell builtin: the code never appears in a process list);
//  5. writes the systemd unit with berth-agent install and, unless
//     BERTH_NO_START is set or systemctl is missing, starts it.
//
// BERTH_DATA_DIR (default /var/lib/berth-agent) and BERTH_UNIT_DIR (default
// /etc/systemd/system) move the agent's state and unit. Any failure stops the
// script with a non-zero status and a line on stderr.
type SetupScript struct {
	Server       string            // berthd's public URL, e.g. https://berth.example.com:7070
	PublicKeyPin string            // curl --pinnedpubkey value, "sha256//<base64>"; empty: system CAs
	Fingerprint  string            // the agent's pin, "sha256:<hex>"; empty: system CAs
	Code         string            // the join code
	Sums         map[string]string // download name -> SHA-256 hex, as served in SHA256SUMS
}

// InvalidJoinScript is the body of the 404 answered for a join code that is
// unknown, expired or used: a script that says so and exits 1, so that
// curl ... | sh fails with the message.
const InvalidJoinScript = "#!/bin/sh\necho 'berth: join code is invalid, expired, or already used; ask for a new one (berth join-code create)' >&2\nexit 1\n"

var shellSafe = regexp.MustCompile(`^[A-Za-z0-9:/._+=@-]*$`)

// Render returns the script, or an error when a value could not be quoted
// safely (they never can hold a quote: URLs, pins, hex and base32).
func (s SetupScript) Render() ([]byte, error) {
	for name, v := range map[string]string{"server": s.Server, "pin": s.PublicKeyPin, "fingerprint": s.Fingerprint, "code": s.Code} {
		if !shellSafe.MatchString(v) {
			return nil, fmt.Errorf("setup script: %s %q holds characters a script cannot carry", name, v)
		}
	}
	for name, sum := range s.Sums {
		if !shellSafe.MatchString(name) || !shellSafe.MatchString(sum) {
			return nil, fmt.Errorf("setup script: download %q cannot be carried", name)
		}
	}
	var b bytes.Buffer
	if err := setupTemplate.Execute(&b, s); err != nil {
		return nil, fmt.Errorf("setup script: %w", err)
	}
	return b.Bytes(), nil
}

var setupTemplate = template.Must(template.New("setup").Funcs(template.FuncMap{"sum": func(sums map[string]string, name string) string { return sums[name] }}).Parse(`#!/bin/sh
# Berth node setup (docs/joining.md section 3): installs berth-agent from
# {{.Server}} and enrolls this host with a one-time join code.
set -eu
server='{{.Server}}'
pin='{{.PublicKeyPin}}'
fingerprint='{{.Fingerprint}}'
install_dir="${BERTH_INSTALL_DIR:-/usr/local/bin}"
data_dir="${BERTH_DATA_DIR:-/var/lib/berth-agent}"
unit_dir="${BERTH_UNIT_DIR:-/etc/systemd/system}"
address="${BERTH_ADDRESS:-auto}"

fail() { echo "berth setup: $*" >&2; exit 1; }
command -v curl >/dev/null 2>&1 || fail "curl is required"
command -v sha256sum >/dev/null 2>&1 || fail "sha256sum is required"
case "$(uname -m)" in
  x86_64|amd64) arch=amd64 ;;
  aarch64|arm64) arch=arm64 ;;
  *) fail "architecture $(uname -m) is not supported (amd64, arm64)" ;;
esac
case "$arch" in
  amd64) agent_sum='{{sum .Sums "berth-agent-linux-amd64"}}'; process_sum='{{sum .Sums "berth-plugin-process-linux-amd64"}}' ;;
  arm64) agent_sum='{{sum .Sums "berth-agent-linux-arm64"}}'; process_sum='{{sum .Sums "berth-plugin-process-linux-arm64"}}' ;;
esac
[ -n "$agent_sum" ] && [ -n "$process_sum" ] || fail "berthd offers no berth-agent and berth-plugin-process for linux/$arch"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fetch() {
  if [ -n "$pin" ]; then
    curl -fsS --retry 3 --insecure --pinnedpubkey "$pin" -o "$tmp/$1" "$server/downloads/$1" || fail "download $1 from $server failed"
  else
    curl -fsS --retry 3 -o "$tmp/$1" "$server/downloads/$1" || fail "download $1 from $server failed"
  fi
}
fetch SHA256SUMS
for pair in "berth-agent:$agent_sum" "berth-plugin-process:$process_sum"; do
  prog="${pair%%:*}"; want="${pair#*:}"; file="$prog-linux-$arch"
  fetch "$file"
  grep -q "^$want  $file\$" "$tmp/SHA256SUMS" || fail "$file: SHA256SUMS does not list the sum this script expects"
  got="$(sha256sum "$tmp/$file" | cut -d' ' -f1)"
  [ "$got" = "$want" ] || fail "$file: checksum mismatch (got $got, want $want)"
done
mkdir -p "$install_dir"
install -m 0755 "$tmp/berth-agent-linux-$arch" "$install_dir/berth-agent"
install -m 0755 "$tmp/berth-plugin-process-linux-$arch" "$install_dir/berth-plugin-process"

set -- --server "$server" --data-dir "$data_dir" --address "$address" --join-token-stdin
[ -n "$fingerprint" ] && set -- "$@" --fingerprint "$fingerprint"
printf '%s\n' '{{.Code}}' | "$install_dir/berth-agent" enroll "$@" || fail "enrollment refused (see above)"
mkdir -p "$unit_dir"
"$install_dir/berth-agent" install --data-dir "$data_dir" --unit-dir "$unit_dir" >/dev/null || fail "writing the systemd unit failed"
if [ -z "${BERTH_NO_START:-}" ] && command -v systemctl >/dev/null 2>&1; then
  systemctl daemon-reload
  systemctl enable --now berth-agent
  echo "berth setup: berth-agent is enrolled and running"
else
  echo "berth setup: berth-agent is enrolled; start it with: $install_dir/berth-agent run --data-dir $data_dir"
fi
`))
