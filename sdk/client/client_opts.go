package client

import "net/http"

// Option configures a Client in New.
type Option func(*Client)

// WithToken sets the bearer sent in the Authorization header of every call
// that needs one: an API token ("brt_..."), or a node credential ("brn_...")
// for a node's calls such as [Client.DownloadBundle]. Empty sends none.
func WithToken(token string) Option {
	return func(c *Client) { c.token = token }
}

// WithHTTPClient replaces the *http.Client the client sends with (its
// transport, TLS settings, timeouts). nil keeps the default.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) {
		if hc != nil {
			c.hc = hc
		}
	}
}

// WithUserAgent replaces the User-Agent header ("berth-go-client" by
// default). Empty keeps the default.
func WithUserAgent(ua string) Option {
	return func(c *Client) {
		if ua != "" {
			c.userAgent = ua
		}
	}
}
