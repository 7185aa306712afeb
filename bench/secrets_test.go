package bench

import (
	"crypto/rand"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/crypto/nacl/box"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/secrets"
)

// BenchmarkSecretSealOpen measures one 256-byte value's way, in µs of one core: sealed at rest
// (fresh data key, XChaCha20-Poly1305, wrapped by the KEK) and opened again by the core, then
// sealed to a node's X25519 key for its desired state and opened by the agent
// (docs/secrets.md section 3, docs/node-protocol.md section 6.6).
func BenchmarkSecretSealOpen(b *testing.B) {
	kr, _, err := secrets.LoadOrCreateKeyring(filepath.Join(b.TempDir(), "keyring"), true)
	if err != nil {
		b.Fatal(err)
	}
	value := make([]byte, 256)
	_, _ = rand.Read(value)
	bind := secrets.Binding{ProjectID: "prj_1", Owner: secrets.OwnerProject, Name: "stripe-key", Version: 1}
	pub, priv, err := box.GenerateKey(rand.Reader)
	if err != nil {
		b.Fatal(err)
	}
	e := node.WorkloadSecret{Key: "STRIPE_KEY", As: node.SecretAsEnv, Secret: "stripe-key", Version: 1}
	var rest, delivery time.Duration
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		s, err := secrets.Seal(kr, bind, value)
		if err != nil {
			b.Fatal(err)
		}
		v, err := secrets.Open(kr, bind, s)
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		sealed, err := box.SealAnonymous(nil, node.SealedSecretPlaintext("wl_1", e, v), pub, rand.Reader)
		if err != nil {
			b.Fatal(err)
		}
		plain, ok := box.OpenAnonymous(nil, sealed, pub, priv)
		if _, bound := node.OpenedSecretValue("wl_1", e, plain); !ok || !bound {
			b.Fatal("delivery does not open")
		}
		t2 := time.Now()
		rest += t1.Sub(t0)
		delivery += t2.Sub(t1)
	}
	n := float64(b.N)
	b.ReportMetric(float64(rest.Nanoseconds())/1e3/n, "rest-µs/value")
	b.ReportMetric(float64(delivery.Nanoseconds())/1e3/n, "delivery-µs/value")
	b.ReportMetric(float64((rest+delivery).Nanoseconds())/1e3/n, "µs/value")
}
