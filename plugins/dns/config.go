package dns

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strings"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/berthhq/berth/internal/securefile"
)

// Config is the plugin's configuration (docs/dns.md section 4), given by
// berthd after the handshake as a JSON object. The TSIG secret is in
// TSIGSecret (berthd fills it from core/secrets) or in the 0600 file
// TSIGSecretFile, never both; it is never logged or returned.
type Config struct {
	// Server is the authoritative server's "host:port" (port 53 when
	// omitted). Updates and reads go to it over TCP.
	Server string `json:"server"`
	// Zones are the zones the plugin may write (e.g. "example.com"); a record
	// outside them is refused dns_zone_not_served. At least one.
	Zones []string `json:"zones"`
	// TSIGKeyName is the key's name as the server knows it.
	TSIGKeyName string `json:"tsig_key_name"`
	// TSIGAlgorithm is one of hmac-sha256 (when empty), hmac-sha384,
	// hmac-sha512, hmac-sha224, hmac-sha1.
	TSIGAlgorithm string `json:"tsig_algorithm,omitempty"`
	// TSIGSecret is the key's secret, base64 as keymgr and tsig-keygen print it.
	TSIGSecret string `json:"tsig_secret,omitempty"`
	// TSIGSecretFile is a file holding the base64 secret (owner-only, 0600).
	TSIGSecretFile string `json:"tsig_secret_file,omitempty"`
	// Owner names this Berth in ownership records; "berth" when empty. Two
	// Berths writing one zone must differ here. A DNS-safe word:
	// [a-z0-9._-], at most 63 bytes.
	Owner string `json:"owner,omitempty"`
	// TimeoutMS bounds one exchange with the server, in milliseconds; 0 means
	// 5,000.
	TimeoutMS int `json:"timeout_ms,omitempty"`
}

// settings is a checked Config with defaults filled in and the secret read.
type settings struct {
	server    string
	zones     []string // lower case, no trailing dot
	keyName   string   // fully qualified
	algorithm string   // miekg form, e.g. "hmac-sha256."
	secret    string   // base64
	owner     string
	timeout   time.Duration
}

var algorithms = map[string]string{
	"hmac-sha1":   mdns.HmacSHA1,
	"hmac-sha224": mdns.HmacSHA224,
	"hmac-sha256": mdns.HmacSHA256,
	"hmac-sha384": mdns.HmacSHA384,
	"hmac-sha512": mdns.HmacSHA512,
}

var ownerWord = regexp.MustCompile(`^[a-z0-9._-]{1,63}$`)

// parseConfig checks raw and returns the settings, or the problems found
// (none of which quotes the secret).
func parseConfig(raw json.RawMessage) (settings, []string) {
	var c Config
	dec := json.NewDecoder(bytes.NewReader(orEmpty(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		// The decoder's message may quote a value; say only what is wrong.
		var syn *json.SyntaxError
		var typ *json.UnmarshalTypeError
		switch {
		case errors.As(err, &typ) && typ.Field == "":
			return settings{}, []string{"config is not a JSON object"}
		case errors.As(err, &typ):
			return settings{}, []string{fmt.Sprintf("config field %q has the wrong type", typ.Field)}
		case errors.As(err, &syn):
			return settings{}, []string{"config is not valid JSON"}
		case strings.HasPrefix(err.Error(), "json: unknown field"):
			return settings{}, []string{"config has an " + strings.TrimPrefix(err.Error(), "json: ")}
		}
		return settings{}, []string{"config does not decode as a JSON object"}
	}
	var problems []string
	s := settings{owner: c.Owner, timeout: time.Duration(c.TimeoutMS) * time.Millisecond}
	if c.Server == "" {
		problems = append(problems, "server is required (host:port of the authoritative server)")
	} else {
		s.server = c.Server
		if _, _, err := net.SplitHostPort(c.Server); err != nil {
			s.server = net.JoinHostPort(c.Server, "53")
		}
	}
	if len(c.Zones) == 0 {
		problems = append(problems, "zones is required (at least one zone the plugin may write)")
	}
	for _, z := range c.Zones {
		n := strings.TrimSuffix(strings.ToLower(z), ".")
		if _, ok := mdns.IsDomainName(n); !ok || n == "" {
			problems = append(problems, fmt.Sprintf("zone %q is not a domain name", z))
			continue
		}
		s.zones = append(s.zones, n)
	}
	if c.TSIGKeyName == "" {
		problems = append(problems, "tsig_key_name is required")
	} else {
		s.keyName = mdns.Fqdn(strings.ToLower(c.TSIGKeyName))
	}
	alg := c.TSIGAlgorithm
	if alg == "" {
		alg = "hmac-sha256"
	}
	if s.algorithm = algorithms[strings.TrimSuffix(strings.ToLower(alg), ".")]; s.algorithm == "" {
		problems = append(problems, fmt.Sprintf("tsig_algorithm %q is not one of hmac-sha256, hmac-sha384, hmac-sha512, hmac-sha224, hmac-sha1", c.TSIGAlgorithm))
	}
	switch {
	case c.TSIGSecret != "" && c.TSIGSecretFile != "":
		problems = append(problems, "give tsig_secret or tsig_secret_file, not both")
	case c.TSIGSecret != "":
		s.secret = strings.TrimSpace(c.TSIGSecret)
	case c.TSIGSecretFile != "":
		raw, err := securefile.ReadFile(c.TSIGSecretFile)
		if err != nil {
			problems = append(problems, fmt.Sprintf("tsig_secret_file: %v", err))
		}
		s.secret = strings.TrimSpace(string(raw))
	default:
		problems = append(problems, "tsig_secret or tsig_secret_file is required")
	}
	if s.secret != "" {
		if b, err := base64.StdEncoding.DecodeString(s.secret); err != nil || len(b) == 0 {
			problems = append(problems, "the TSIG secret is not base64")
		}
	}
	if s.owner == "" {
		s.owner = "berth"
	}
	if !ownerWord.MatchString(s.owner) {
		problems = append(problems, "owner must be 1 to 63 of a-z 0-9 . _ -")
	}
	if c.TimeoutMS < 0 || c.TimeoutMS > 60000 {
		problems = append(problems, "timeout_ms must be 0..60000")
	}
	if s.timeout == 0 {
		s.timeout = 5 * time.Second
	}
	return s, problems
}

// servesZone reports whether zone is one of s's zones.
func (s settings) servesZone(zone string) bool {
	for _, z := range s.zones {
		if z == zone {
			return true
		}
	}
	return false
}
