package dnsrecords_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthhq/berth/core/dnsrecords"
	"github.com/berthhq/berth/core/secrets"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/store/storetest"
)

// TestResolveTSIGFromSecrets: a tsig_secret_ref in the DNS configuration is replaced by the
// secret's current value as tsig_secret, every other field kept; a missing secret, a bad
// reference and a reference beside an inline secret are refused.
func TestResolveTSIGFromSecrets(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t)
	cat := services.NewCatalog(st, nil)
	p, _, err := cat.EnsureProject(ctx, "infra")
	if err != nil {
		t.Fatal(err)
	}
	kr, _, err := secrets.LoadOrCreateKeyring(filepath.Join(t.TempDir(), "keys", "secrets.keyring"), true)
	if err != nil {
		t.Fatal(err)
	}
	sec := secrets.NewStore(st, kr, nil)
	if _, _, err := sec.Put(ctx, p.ID, p.Name, "dns-tsig", []byte("c2VjcmV0LXZhbHVl\n"), "test"); err != nil {
		t.Fatal(err)
	}
	resolve := func(conf string) (map[string]any, error) {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal([]byte(conf), &obj); err != nil {
			t.Fatal(err)
		}
		raw, err := dnsrecords.ResolveTSIG(ctx, obj, obj["tsig_secret_ref"], sec, func(ctx context.Context, name string) (string, error) {
			p, err := cat.GetProject(ctx, name)
			if err != nil {
				return "", err
			}
			return p.ID, nil
		})
		if err != nil {
			return nil, err
		}
		var out map[string]any
		if err := json.Unmarshal(raw, &out); err != nil {
			t.Fatal(err)
		}
		return out, nil
	}
	got, err := resolve(`{"server":"127.0.0.1:53","zones":["example.test"],"tsig_key_name":"berth","tsig_secret_ref":{"project":"infra","secret":"dns-tsig"}}`)
	if err != nil {
		t.Fatal(err)
	}
	if got["tsig_secret"] != "c2VjcmV0LXZhbHVl" || got["tsig_secret_ref"] != nil || got["server"] != "127.0.0.1:53" || got["tsig_key_name"] != "berth" {
		t.Errorf("resolved configuration %v", got)
	}
	for _, bad := range []string{
		`{"tsig_secret_ref":{"project":"infra","secret":"nope"}}`,
		`{"tsig_secret_ref":{"project":"nope","secret":"dns-tsig"}}`,
		`{"tsig_secret_ref":"dns-tsig"}`,
		`{"tsig_secret":"x","tsig_secret_ref":{"project":"infra","secret":"dns-tsig"}}`,
	} {
		if _, err := resolve(bad); err == nil {
			t.Errorf("%s: resolved, want an error", bad)
		} else if strings.Contains(err.Error(), "c2VjcmV0") {
			t.Errorf("%s: the error quotes the secret: %v", bad, err)
		}
	}
}
