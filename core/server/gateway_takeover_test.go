package server

import "testing"

func TestGatewayAddrsOverlap(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		a, b string
		want bool
	}{
		{"127.0.0.1:8080", "127.0.0.1:8080", true},
		{"0.0.0.0:8080", "127.0.0.1:8080", true},
		{":8080", "127.0.0.1:8080", true},
		{"[::]:8080", "127.0.0.1:8080", true},
		{"[::ffff:127.0.0.1]:8080", "127.0.0.1:8080", true},
		{"127.0.0.1:http", "127.0.0.1:80", true},
		{"127.0.0.1:8080", "127.0.0.2:8080", false},
		{"127.0.0.1:8080", "127.0.0.1:8081", false},
		{"127.0.0.1:0", "127.0.0.1:0", false},
		{"off", "127.0.0.1:8080", false},
	} {
		if got := addrsOverlap(c.a, c.b); got != c.want {
			t.Errorf("addrsOverlap(%q, %q) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}

func TestGatewayFlagValue(t *testing.T) {
	t.Parallel()
	args := []string{"/bin/berth-plugin-gateway", "--listen", "127.0.0.1:80", "-state-dir=/d/plugins/gateway", "--tls-listen"}
	for name, want := range map[string]string{"listen": "127.0.0.1:80", "state-dir": "/d/plugins/gateway", "tls-listen": "", "log-file": ""} {
		if got := flagValue(args, name); got != want {
			t.Errorf("flagValue(%q) = %q, want %q", name, got, want)
		}
	}
}
