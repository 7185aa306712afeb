package hetzner

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/berthhq/berth/internal/securefile"
)

// DefaultEndpoint is the Hetzner Cloud API.
const DefaultEndpoint = "https://api.hetzner.cloud/v1"

// Config is the plugin's configuration (docs/plugins-hetzner.md section 2),
// given by berthd after the handshake as a JSON object. The API token is in
// Token (berthd fills it from its secrets) or in the owner-only file
// TokenFile, never both; it is never logged or returned.
type Config struct {
	// Token is a Hetzner Cloud project API token with read and write
	// permission.
	Token string `json:"token,omitempty"`
	// TokenFile is a file (mode 0600) holding the token.
	TokenFile string `json:"token_file,omitempty"`
	// Endpoint is the API's base URL; DefaultEndpoint when empty.
	Endpoint string `json:"endpoint,omitempty"`
	// RequestsPerHour is this plugin's steady share of the project's API
	// budget (3,600 requests an hour, shared with every tool using the
	// project); 0 means 1,800, leaving half to the others.
	RequestsPerHour int `json:"requests_per_hour,omitempty"`
	// Burst is how many requests may go at once above the steady pace;
	// 0 means 10.
	Burst int `json:"burst,omitempty"`
	// PollIntervalMS is how often the action poller asks about the actions
	// it waits for, in milliseconds; 0 means 2,000.
	PollIntervalMS int `json:"poll_interval_ms,omitempty"`
	// CreateTimeoutS bounds how long a create waits for its server's
	// actions (create_server, start_server) before it deletes the server
	// and fails, in seconds; 0 means 600.
	CreateTimeoutS int `json:"create_timeout_s,omitempty"`
}

// settings is a checked Config with defaults filled in and the token read.
type settings struct {
	token         string
	endpoint      string
	perHour       int
	burst         int
	pollInterval  time.Duration
	createTimeout time.Duration
}

// parseConfig checks raw and returns the settings, or the problems found
// (none of which quotes the token).
func parseConfig(raw json.RawMessage) (settings, []string) {
	if len(bytes.TrimSpace(raw)) == 0 {
		raw = json.RawMessage("{}")
	}
	var c Config
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		var typ *json.UnmarshalTypeError
		switch {
		case errors.As(err, &typ) && typ.Field == "":
			return settings{}, []string{"config is not a JSON object"}
		case errors.As(err, &typ):
			return settings{}, []string{fmt.Sprintf("config field %q has the wrong type", typ.Field)}
		case strings.HasPrefix(err.Error(), "json: unknown field"):
			return settings{}, []string{"config has an " + strings.TrimPrefix(err.Error(), "json: ")}
		}
		return settings{}, []string{"config is not a JSON object"}
	}
	var problems []string
	s := settings{endpoint: c.Endpoint, perHour: c.RequestsPerHour, burst: c.Burst,
		pollInterval: time.Duration(c.PollIntervalMS) * time.Millisecond, createTimeout: time.Duration(c.CreateTimeoutS) * time.Second}
	switch {
	case c.Token != "" && c.TokenFile != "":
		problems = append(problems, "give token or token_file, not both")
	case c.Token != "":
		s.token = strings.TrimSpace(c.Token)
	case c.TokenFile != "":
		b, err := securefile.ReadFile(c.TokenFile)
		if err != nil {
			problems = append(problems, fmt.Sprintf("token_file: %v", err))
		}
		s.token = strings.TrimSpace(string(b))
	default:
		problems = append(problems, "token or token_file is required (a Hetzner Cloud API token with read and write permission)")
	}
	if s.endpoint == "" {
		s.endpoint = DefaultEndpoint
	}
	if u, err := url.Parse(s.endpoint); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		problems = append(problems, "endpoint must be an http(s) URL")
	}
	if c.RequestsPerHour < 0 || c.RequestsPerHour > 360000 {
		problems = append(problems, "requests_per_hour must be 0..360000")
	}
	if s.perHour == 0 {
		s.perHour = 1800
	}
	if c.Burst < 0 || c.Burst > 1000 {
		problems = append(problems, "burst must be 0..1000")
	}
	if s.burst == 0 {
		s.burst = 10
	}
	if c.PollIntervalMS < 0 || c.PollIntervalMS > 60000 {
		problems = append(problems, "poll_interval_ms must be 0..60000")
	}
	if s.pollInterval == 0 {
		s.pollInterval = 2 * time.Second
	}
	if c.CreateTimeoutS < 0 || c.CreateTimeoutS > 7200 {
		problems = append(problems, "create_timeout_s must be 0..7200")
	}
	if s.createTimeout == 0 {
		s.createTimeout = 10 * time.Minute
	}
	return s, problems
}
