package registry_test

import (
	"context"
	"encoding/xml"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthhq/berth/core/blobs"
	"github.com/berthhq/berth/core/identity"
)

// conformanceBinary finds the OCI distribution-spec conformance program
// (make test installs it; see the Makefile's CONFORMANCE rule).
func conformanceBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("BERTH_OCI_CONFORMANCE"); p != "" {
		return p
	}
	out, err := exec.Command("go", "env", "GOPATH").Output()
	if err == nil {
		p := filepath.Join(strings.TrimSpace(string(out)), "bin", "conformance")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Fatal("the OCI conformance program is not installed: go install github.com/opencontainers/distribution-spec/conformance@v0.0.0-20260831232431-97274622c111 (make test does)")
	return ""
}

// junit is the part of the program's junit.xml the test reads.
type junit struct {
	Suites []struct {
		Name  string `xml:"name,attr"`
		Cases []struct {
			Name      string    `xml:"name,attr"`
			Classname string    `xml:"classname,attr"`
			Status    string    `xml:"status,attr"`
			Failure   *struct{} `xml:"failure"`
			Error     *struct{} `xml:"error"`
			Skipped   *struct{} `xml:"skipped"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

// TestOCIConformance runs the distribution-spec conformance program against
// /v2 through Berth's token flow, on the filesystem and on S3, and fails on
// any failed or errored case.
func TestOCIConformance(t *testing.T) {
	bin := conformanceBinary(t)
	// The run with referrers covers every case of the run without them and
	// more; the one without is kept on the filesystem for the count a bare
	// distribution registry is compared by.
	b := backends(t)
	t.Run("filesystem", func(t *testing.T) { runConformance(t, bin, b["filesystem"], false) })
	t.Run("filesystem-referrers", func(t *testing.T) { runConformance(t, bin, b["filesystem"], true) })
	t.Run("s3-referrers", func(t *testing.T) { runConformance(t, bin, b["s3"], true) })
}

func runConformance(t *testing.T, bin string, s3 blobs.S3Config, referrers bool) {
	e := newEnv(t, s3)
	tok := e.token(t, "conformance", "", identity.ScopeServicesWrite)
	results := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin)
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(),
		"OCI_REGISTRY="+e.host,
		"OCI_TLS=disabled",
		"OCI_REPO1=conformance/repo1",
		"OCI_REPO2=conformance/repo2",
		"OCI_USERNAME=berth",
		"OCI_PASSWORD="+tok,
		"OCI_RESULTS_DIR="+results,
		"OCI_LOG=error",
		"OCI_DATA_SHA512=false",
	)
	if !referrers {
		// The set a bare distribution registry passes: without Berth's
		// referrers API and subjects.
		cmd.Env = append(cmd.Env, "OCI_API_REFERRER=false", "OCI_DATA_SUBJECT=false", "OCI_DATA_SUBJECT_MISSING=false", "OCI_DATA_SUBJECT_LIST=false")
	}
	out, err := cmd.CombinedOutput()
	if os.Getenv("BERTH_CONFORMANCE_OUT") != "" {
		_ = os.WriteFile(os.Getenv("BERTH_CONFORMANCE_OUT"), out, 0o600)
	}
	if ctx.Err() != nil {
		t.Fatalf("the conformance program did not finish: %v\n%s", ctx.Err(), tail(out))
	}
	if err != nil {
		t.Logf("conformance exit: %v", err)
	}
	raw, rerr := os.ReadFile(filepath.Join(results, "junit.xml"))
	if rerr != nil {
		t.Fatalf("no junit.xml (%v):\n%s", rerr, tail(out))
	}
	var j junit
	if err := xml.Unmarshal(raw, &j); err != nil {
		t.Fatalf("junit.xml: %v", err)
	}
	var passed, failed, skipped int
	for _, s := range j.Suites {
		for _, c := range s.Cases {
			switch {
			case c.Failure != nil || c.Error != nil || c.Status == "failure" || c.Status == "error":
				failed++
				t.Errorf("conformance case failed: %s / %s", c.Classname, c.Name)
			case c.Skipped != nil || c.Status == "skipped":
				skipped++
			default:
				passed++
			}
		}
	}
	t.Logf("OCI conformance (%s): %d passed, %d failed, %d skipped", t.Name(), passed, failed, skipped)
	if passed == 0 {
		t.Fatalf("the conformance program ran no case:\n%s", tail(out))
	}
	if failed > 0 {
		t.Logf("program output:\n%s", tail(out))
	}
}

func tail(b []byte) string {
	if len(b) > 8000 {
		b = b[len(b)-8000:]
	}
	return string(b)
}
