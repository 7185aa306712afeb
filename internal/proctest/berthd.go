package proctest

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthhq/berth/sdk/client"
)

// Berthd is what a ready berthd gives its test.
type Berthd struct {
	// Fingerprint is the certificate pin berthd wrote to DATA/server-fingerprint
	// (docs/node-protocol.md section 2.2).
	Fingerprint string
	// Token is the admin token from DATA/admin-token.
	Token string
	// HTTP is an HTTP client pinned to Fingerprint.
	HTTP *http.Client
}

// WaitBerthdReady polls every 100 ms until berthd, running as p with data directory dataDir and
// its API at url ("https://host:port"), answers 200 on GET /readyz (docs/api.md) over a client
// pinned to its fingerprint, then reads its admin token. It fails t with p's log if p exits
// first, and with the last state once timeout has passed.
func WaitBerthdReady(t testing.TB, p *Proc, dataDir, url string, timeout time.Duration) Berthd {
	t.Helper()
	var d Berthd
	WaitFor(t, timeout, "berthd ready", func() (bool, string) {
		if p.Exited() {
			log, _ := os.ReadFile(p.LogPath())
			t.Fatalf("berthd exited:\n%s", log)
		}
		if d.HTTP == nil {
			// The pin exists once berthd loaded its certificate.
			raw, err := os.ReadFile(filepath.Join(dataDir, "server-fingerprint"))
			if err != nil {
				return false, err.Error()
			}
			d.Fingerprint = strings.TrimSpace(string(raw))
			if d.HTTP, err = client.PinnedHTTPClient(d.Fingerprint); err != nil {
				t.Fatal(err)
			}
		}
		resp, err := d.HTTP.Get(url + "/readyz")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
	tok, err := os.ReadFile(filepath.Join(dataDir, "admin-token"))
	if err != nil {
		t.Fatal(err)
	}
	d.Token = strings.TrimSpace(string(tok))
	return d
}
