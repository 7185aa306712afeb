package corestore

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"strconv"
)

// Config is the plugin's configuration (its catalog entry's JSON object):
// the servers it manages. A kind without a server is refused at Apply. The
// admin credentials inside come from berthd's secrets; the plugin never logs
// them and never hands them to a workload (docs/bindings.md section 5).
type Config struct {
	Postgres *ServerConfig `json:"postgres,omitempty"`
	MongoDB  *ServerConfig `json:"mongodb,omitempty"`
	S3       *S3Config     `json:"s3,omitempty"`
	// CredentialKey, optional, is 32 bytes in hex: the key binding
	// passwords are derived from. Empty: a key generated into the state
	// directory (or held in memory without one).
	CredentialKey string `json:"credential_key,omitempty"`
	// Executor, written by berthd, runs the backup executor in this process
	// ([ExecutorConfig]); nil runs none.
	Executor *ExecutorConfig `json:"executor,omitempty"`
}

// ServerConfig is a database server: the admin URL the plugin connects with
// (postgres://... or mongodb://...) and, optionally, the host and port a
// workload dials (default: the URL's).
type ServerConfig struct {
	AdminURL string `json:"admin_url"`
	Host     string `json:"host,omitempty"`
	Port     int    `json:"port,omitempty"` // 1..65535; zero means the URL's
}

// S3Config is an S3 endpoint and its admin keys.
type S3Config struct {
	Endpoint  string `json:"endpoint"`         // host:port the plugin and workloads dial
	Secure    bool   `json:"secure,omitempty"` // reports whether the endpoint speaks HTTPS
	Region    string `json:"region,omitempty"` // default "us-east-1"
	AccessKey string `json:"access_key"`
	SecretKey string `json:"secret_key"`
	// AdminAPI reports whether the endpoint serves versitygw's admin API
	// (create-user, change-bucket-owner), so that each bucket gets its own
	// access key. False: buckets only, Users "unsupported".
	AdminAPI bool `json:"admin_api,omitempty"`
}

// problems lists what is wrong with c.
func (c Config) problems() []string {
	var out []string
	check := func(name, scheme string, s *ServerConfig) {
		if s == nil {
			return
		}
		u, err := url.Parse(s.AdminURL)
		if err != nil || u.Scheme != scheme || u.Host == "" {
			out = append(out, fmt.Sprintf("%s.admin_url must be a %s:// URL", name, scheme))
		}
		if s.Port < 0 || s.Port > 65535 {
			out = append(out, fmt.Sprintf("%s.port must be 1..65535", name))
		}
	}
	check("postgres", "postgres", c.Postgres)
	check("mongodb", "mongodb", c.MongoDB)
	if c.S3 != nil {
		if _, _, err := net.SplitHostPort(c.S3.Endpoint); err != nil {
			out = append(out, "s3.endpoint must be host:port")
		}
		if c.S3.AccessKey == "" || c.S3.SecretKey == "" {
			out = append(out, "s3.access_key and s3.secret_key are required")
		}
	}
	if c.CredentialKey != "" {
		if k, err := hex.DecodeString(c.CredentialKey); err != nil || len(k) != 32 {
			out = append(out, "credential_key must be 32 bytes in hex")
		}
	}
	return out
}

// decodeConfig decodes raw (nil means {}), refusing unknown fields.
func decodeConfig(raw json.RawMessage) (Config, error) {
	var c Config
	if len(raw) == 0 {
		return c, nil
	}
	if err := strictDecode(raw, &c); err != nil {
		return c, err
	}
	return c, nil
}

// workloadAddr is the host and port a workload dials for s.
func (s *ServerConfig) workloadAddr() (string, int) {
	u, _ := url.Parse(s.AdminURL) // checked by problems
	host, port := u.Hostname(), 0
	if p, err := strconv.Atoi(u.Port()); err == nil {
		port = p
	}
	if s.Host != "" {
		host = s.Host
	}
	if s.Port != 0 {
		port = s.Port
	}
	return host, port
}
