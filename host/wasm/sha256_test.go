package wasm_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/berthhq/berth/host/wasm"
	"github.com/berthhq/berth/internal/wasmtest"
)

// TestHostSHA256: berth.sha256 hashes the module's bytes as crypto/sha256
// does, charges the call's fuel for every byte (an endless loop of hashes
// ends for fuel, not only at the caller's deadline), and traps on a range
// outside the module's memory.
func TestHostSHA256(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	raw := wasmtest.BuildGo(t, "host/wasm/testdata/sha256guest")
	rt, err := wasm.New(ctx, wasm.Config{CacheDir: wasmtest.CacheDir(t), Fuel: 1 << 24, MaxInstances: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	m, err := rt.Load(ctx, raw)
	if err != nil {
		t.Fatal(err)
	}
	in := append([]byte("h"), bytes.Repeat([]byte("berth"), 20000)...)
	got, err := m.Call(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	if sum := sha256.Sum256(in); string(got) != hex.EncodeToString(sum[:]) {
		t.Fatalf("berth.sha256 gave %s, crypto/sha256 %x", got, sum)
	}
	// 2^24 units of fuel are 256 hashes of 64 KiB: the loop ends at once
	// for fuel; the deadline is only the test's bound.
	lctx, lcancel := context.WithTimeout(ctx, 30*time.Second)
	defer lcancel()
	_, err = m.Call(lctx, append([]byte("l"), make([]byte, 1<<16)...))
	if !errors.Is(err, wasm.ErrDeadline) || !strings.Contains(err.Error(), "fuel") {
		t.Fatalf("endless hashing: %v, want ErrDeadline for fuel", err)
	}
	if _, err := m.Call(ctx, []byte("o")); !errors.Is(err, wasm.ErrTrap) {
		t.Fatalf("a range outside memory: %v, want ErrTrap", err)
	}
	if got, err := m.Call(ctx, in); err != nil || len(got) != 64 { // a fresh instance after the trap
		t.Fatalf("after the trap: %q, %v", got, err)
	}
}
