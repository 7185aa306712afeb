package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/berthhq/berth/sdk/client"
)

// TestKeyringRotationSurvivesKill9 rotates the keyring under 100 secrets while writes and a
// rollout continue, kills berthd with SIGKILL part way through the re-wrap, and shows that the
// restarted berthd resumes it from its recorded progress: every version ends wrapped by the new
// KEK, the old one is retired, a secret written during the rotation is wrapped by the new KEK too,
// and the rollout started mid-rotation delivers the new version's value to both replicas.
func TestKeyringRotationSurvivesKill9(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	ctx := context.Background()
	for i := range 100 {
		if _, err := cl.c.PutSecret(ctx, "default", fmt.Sprintf("s%03d", i), []byte(fmt.Sprintf("value-%03d", i))); err != nil {
			t.Fatal(err)
		}
	}
	// A service of two replicas uses s000 unpinned: a new version of it, set mid-rotation, is a
	// rollout that must open under whichever KEK wraps it when it is sealed.
	cl.enrollAgent(t)
	cl.pushBundle(t, env.helloDir, "hello")
	spec := filepath.Join(cl.dir, "hello.yaml")
	if err := os.WriteFile(spec, []byte("name: hello\nbundle: hello\ncommand: [\"./hello\"]\ndomains: [\"hello.localhost\"]\n"+
		"replicas: 2\nhealth_check: {path: /healthz, interval_s: 1}\nsecrets:\n  GREETING: s000\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cl.cli(t, "apply", "-f", spec)
	greets := func(want string) {
		t.Helper()
		cl.waitGreeting(t, "hello.localhost", want, 2)
	}
	greets("value-000")

	// A slow re-wrap, so that the kill lands in its middle.
	cl.extra = []string{"--secrets-rewrap-rate", "20"}
	cl.berthd.Stop()
	startBerthd(t, cl)
	before, err := cl.c.KeyringStatus(ctx)
	if err != nil || len(before.KEKs) != 1 || before.KEKs[0].Wraps != 100 {
		t.Fatalf("keyring before: %+v %v", before, err)
	}
	old := before.ActiveKEK
	st, err := cl.c.RotateKeyring(ctx, true)
	if err != nil || st.Rotation == nil || st.Rotation.State != "running" || st.ActiveKEK == old {
		t.Fatalf("rotate: %+v %v", st, err)
	}
	next := st.ActiveKEK
	if _, err := cl.c.RotateKeyring(ctx, false); err == nil {
		t.Fatalf("a second rotation while one runs was accepted")
	}
	waitFor(t, converge, "the re-wrap under way", func() (bool, string) {
		s, err := cl.c.KeyringStatus(ctx)
		if err != nil || s.Rotation == nil {
			return false, fmt.Sprint(err)
		}
		return s.Rotation.Secrets >= 10, fmt.Sprint(s.Rotation.Secrets)
	})
	if _, err := cl.c.PutSecret(ctx, "default", "during", []byte("written-mid-rotation")); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.c.PutSecret(ctx, "default", "s000", []byte("value-000-b")); err != nil {
		t.Fatal(err)
	}
	cl.berthd.Kill9()
	startBerthd(t, cl)
	mid, err := cl.c.KeyringStatus(ctx)
	if err != nil || !mid.OK || mid.Rotation == nil || mid.Rotation.State != "running" || mid.Rotation.Secrets >= 101 || len(mid.KEKs) != 2 {
		t.Fatalf("after the kill the rotation should still run with both KEKs: %+v %v", mid, err)
	}
	var done *client.KeyringStatus
	waitFor(t, 2*converge, "the resumed rotation done", func() (bool, string) {
		s, err := cl.c.KeyringStatus(ctx)
		if err != nil || s.Rotation == nil {
			return false, fmt.Sprint(err)
		}
		done = s
		return s.Rotation.State == "done", fmt.Sprintf("%+v", *s.Rotation)
	})
	if len(done.KEKs) != 1 || done.KEKs[0].ID != next || done.KEKs[0].Wraps != 102 || len(done.Rotation.Retired) != 1 || done.Rotation.Retired[0] != old {
		t.Fatalf("after the rotation: %+v %+v", done.KEKs, *done.Rotation)
	}
	// 102 versions: s000 has two. A restart after the retirement loads the keyring and every
	// secret: berthd refuses to start when a stored version names a KEK its keyring does not hold.
	cl.berthd.Kill9()
	startBerthd(t, cl)
	list, err := cl.c.ListSecrets(ctx, "default")
	if err != nil || len(list) != 101 {
		t.Fatalf("secrets after the rotation: %d %v", len(list), err)
	}
	greets("value-000-b")
}
