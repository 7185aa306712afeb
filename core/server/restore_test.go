package server

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthhq/berth/core/backup"
)

func TestRunRefusesDataDirOfUnfinishedRestore(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, backup.IncompleteMarker), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := Run(ctx, Config{DataDir: dir, Listen: "127.0.0.1:0", GatewayListen: "off", PluginDir: dir})
	if err == nil || !strings.Contains(err.Error(), backup.IncompleteMarker) {
		t.Fatalf("Run = %v, want a refusal naming %s", err, backup.IncompleteMarker)
	}
	if _, err := os.Stat(filepath.Join(dir, "keys")); !os.IsNotExist(err) {
		t.Fatal("Run created keys in the data directory of an unfinished restore")
	}
}
