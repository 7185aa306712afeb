package bindings_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthhq/berth/core/bindings"
	"github.com/berthhq/berth/core/secrets"
	"github.com/berthhq/berth/core/services"
	"github.com/berthhq/berth/core/store/storetest"
)

// TestCorestoreConfigTakesSecrets: "secret:PROJECT/NAME" values of the corestore configuration
// are replaced by the secret's current value; an unknown secret or project is an error naming it.
func TestCorestoreConfigTakesSecrets(t *testing.T) {
	st := storetest.Open(t)
	ctx := t.Context()
	kr, _, err := secrets.LoadOrCreateKeyring(filepath.Join(t.TempDir(), "keys", "secrets.keyring"), true)
	if err != nil {
		t.Fatal(err)
	}
	sec := secrets.NewStore(st, kr, nil)
	cat := services.NewCatalog(st, nil)
	p, _, err := cat.EnsureProject(ctx, "platform")
	if err != nil {
		t.Fatal(err)
	}
	projectID := func(ctx context.Context, name string) (string, error) {
		p, err := cat.GetProject(ctx, name)
		if err != nil {
			return "", err
		}
		return p.ID, nil
	}
	const url = "postgres://postgres:s3cret@db:5432/postgres"
	if _, _, err := sec.Put(ctx, p.ID, p.Name, "pg-admin", []byte(url), "test"); err != nil {
		t.Fatal(err)
	}
	raw := []byte(`{"postgres": {"admin_url": "secret:platform/pg-admin", "host": "db"}, "s3": {"endpoint": "s3:7070", "secret_key": "plain"}}`)
	out, err := bindings.ResolveConfigSecrets(ctx, raw, sec, projectID)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Postgres struct {
			AdminURL string `json:"admin_url"`
			Host     string `json:"host"`
		} `json:"postgres"`
		S3 map[string]string `json:"s3"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	if got.Postgres.AdminURL != url || got.Postgres.Host != "db" || got.S3["secret_key"] != "plain" {
		t.Fatalf("resolved %s", out)
	}
	for _, bad := range []string{`{"a": "secret:platform/missing"}`, `{"a": "secret:nowhere/pg-admin"}`, `{"a": "secret:no-slash"}`} {
		if _, err := bindings.ResolveConfigSecrets(ctx, []byte(bad), sec, projectID); err == nil || !strings.Contains(err.Error(), "secret:") {
			t.Errorf("%s: %v, want an error naming the reference", bad, err)
		}
	}
}
