package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"testing"

	"github.com/berthhq/berth/sdk/client"
)

// TestApplyUnchangedAgainstRealAPI: `berth apply` of the file the server already holds prints
// "unchanged" at the same revision; a changed file is applied at the next revision.
func TestApplyUnchangedAgainstRealAPI(t *testing.T) {
	url, admin := realAPI(t)
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	if err := tw.WriteHeader(&tar.Header{Name: "run", Typeflag: tar.TypeReg, Mode: 0o755, Size: 1}); err != nil {
		t.Fatal(err)
	}
	_, _ = tw.Write([]byte("x"))
	_ = tw.Close()
	_ = gz.Close()
	ac, err := client.New(url, client.WithToken(admin))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ac.PushBundle(context.Background(), "default", "hello", &buf); err != nil {
		t.Fatal(err)
	}
	c := newCLI(t)
	c.env["BERTH_SERVER"] = url
	c.env["BERTH_TOKEN"] = admin
	file := "name: hello\nbundle: hello\ncommand: [./run]\nenv: {A: \"1\"}\nreplicas: 2\n"
	if out := c.ok(file, "apply", "-f", "-"); out != "service default/hello applied (revision 1)\n" {
		t.Fatalf("first apply: %q", out)
	}
	if out := c.ok(file, "apply", "-f", "-"); out != "service default/hello unchanged (revision 1)\n" {
		t.Fatalf("identical apply: %q", out)
	}
	if out := c.ok(file+"port: 9090\n", "apply", "-f", "-"); out != "service default/hello applied (revision 2)\n" {
		t.Fatalf("changed apply: %q", out)
	}
}
