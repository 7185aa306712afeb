package knottest

import (
	"testing"
	"time"

	"github.com/miekg/dns"
)

// TestServerTakesSignedUpdatesOnly starts knotd, writes a TXT record with an
// update signed by the server's key, reads it back, and checks that the same
// update signed with another secret is refused and changes nothing.
func TestServerTakesSignedUpdatesOnly(t *testing.T) {
	s := Start(t, "example.test")
	send := func(k Key, value string) *dns.Msg {
		t.Helper()
		m := new(dns.Msg)
		m.SetUpdate("example.test.")
		rr, err := dns.NewRR("probe.example.test. 60 IN TXT \"" + value + "\"")
		if err != nil {
			t.Fatal(err)
		}
		m.Insert([]dns.RR{rr})
		m.SetTsig(k.Name, dns.HmacSHA256, 300, time.Now().Unix())
		c := &dns.Client{Net: "tcp", Timeout: 5 * time.Second, TsigSecret: map[string]string{k.Name: k.Secret}}
		in, _, err := c.Exchange(m, s.Addr)
		if err != nil && in == nil {
			t.Fatalf("update: %v", err)
		}
		return in
	}
	if in := send(s.Key, "one"); in.Rcode != dns.RcodeSuccess {
		t.Fatalf("signed update: %s\n%s", dns.RcodeToString[in.Rcode], s.Log())
	}
	other, err := NewKey(KeyName)
	if err != nil {
		t.Fatal(err)
	}
	if in := send(other, "two"); in.Rcode != dns.RcodeNotAuth {
		t.Errorf("update with another secret: got %s, want NOTAUTH", dns.RcodeToString[in.Rcode])
	}
	rrs, err := s.Lookup("probe.example.test", dns.TypeTXT)
	if err != nil {
		t.Fatal(err)
	}
	if len(rrs) != 1 || rrs[0].(*dns.TXT).Txt[0] != "one" {
		t.Errorf("TXT probe.example.test = %v, want only \"one\"", rrs)
	}
}
