package pebbletest

import (
	"context"
	"testing"
	"time"
)

// TestStartServesDirectoryAndRoot: pebble and its DNS server start, the
// directory answers over the module's CA, and a root comes from the
// management port.
func TestStartServesDirectoryAndRoot(t *testing.T) {
	dns := StartChallSrv(t)
	s := Start(t, Config{DNSServer: dns.DNSAddr})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := s.Roots(ctx); err != nil {
		t.Fatal(err)
	}
	if err := dns.SetTXT(ctx, "_acme-challenge.a.test", "v"); err != nil {
		t.Fatal(err)
	}
	if err := dns.ClearTXT(ctx, "_acme-challenge.a.test"); err != nil {
		t.Fatal(err)
	}
}
