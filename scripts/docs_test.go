package scripts_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// readDoc returns the text of the file rel of the repository at root.
func readDoc(t *testing.T, root, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestReadmeStopsOnlyThisDataDirsGateway runs the README's command that stops
// the gateway a berthd left running, against a data directory whose gateway
// pid file names a process this test started: that process stops, and the
// command names no process by pattern (pkill would stop every berthd's).
func TestReadmeStopsOnlyThisDataDirsGateway(t *testing.T) {
	readme := readDoc(t, moduleRoot(t), "README.md")
	if strings.Contains(readme, "pkill") || strings.Contains(readme, "killall") {
		t.Error("the README stops processes by name")
	}
	m := regexp.MustCompile("`(kill [^`]*/tmp/berth-data/plugins/gateway\\.pid[^`]*)`").FindStringSubmatch(readme)
	if m == nil {
		t.Fatal("the README gives no command stopping the gateway by the pid in DATA/plugins/gateway.pid")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	gateway := exec.CommandContext(ctx, "sleep", "60")
	if err := gateway.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- gateway.Wait() }()
	defer func() { _ = gateway.Process.Kill() }()
	data := t.TempDir()
	if err := os.MkdirAll(filepath.Join(data, "plugins"), 0o700); err != nil {
		t.Fatal(err)
	}
	// The pid file as host/plugin writes it.
	rec, _ := json.Marshal(map[string]any{"pid": gateway.Process.Pid, "start_ticks": 1, "path": "/x/berth-plugin-gateway"})
	if err := os.WriteFile(filepath.Join(data, "plugins", "gateway.pid"), rec, 0o600); err != nil {
		t.Fatal(err)
	}
	script := strings.ReplaceAll(m[1], "/tmp/berth-data", data)
	if out, err := exec.CommandContext(ctx, "sh", "-c", script).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", script, err, out)
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not stop the process of the pid file", script)
	}
}

// docSections returns the numbered sections of a doc ("## 6. Title", "### 7.2 Title" and
// paragraphs opening "6.7 **Title.**"), each with the rest of its first line.
func docSections(t *testing.T, root, rel string) map[string]string {
	t.Helper()
	out := map[string]string{}
	re := regexp.MustCompile(`^(?:#+\s+)?([0-9]+(?:\.[0-9]+)*[a-z]?)\.?\s+(.*)$`)
	for _, line := range strings.Split(readDoc(t, root, rel), "\n") {
		if m := re.FindStringSubmatch(line); m != nil && (strings.HasPrefix(line, "#") || strings.Contains(m[1], ".")) {
			out[m[1]] = m[2]
		}
	}
	return out
}

// TestDocSectionReferences: every "docs/X.md section N" in the docs and the README names a
// section X has, and the API reference's volumes field points at the node protocol's section
// on volumes.
func TestDocSectionReferences(t *testing.T) {
	root := moduleRoot(t)
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	ref := regexp.MustCompile(`(docs/[a-z0-9-]+\.md),? sections? ([0-9]+(?:\.[0-9]+)*[a-z]?)`)
	sections := map[string]map[string]string{}
	for _, f := range append(files, filepath.Join(root, "README.md")) {
		rel, _ := filepath.Rel(root, f)
		text := strings.Join(strings.Fields(readDoc(t, root, rel)), " ")
		for _, m := range ref.FindAllStringSubmatch(text, -1) {
			if sections[m[1]] == nil {
				if _, err := os.Stat(filepath.Join(root, m[1])); err != nil {
					t.Errorf("%s refers to %s, which does not exist", rel, m[1])
					continue
				}
				sections[m[1]] = docSections(t, root, m[1])
			}
			if _, ok := sections[m[1]][m[2]]; !ok {
				t.Errorf("%s refers to %s section %s, which it does not have", rel, m[1], m[2])
			}
		}
	}
	row := regexp.MustCompile("(?m)^ *\\| `volumes` \\|.*docs/node-protocol\\.md section ([0-9.]+)").FindStringSubmatch(readDoc(t, root, "docs/api.md"))
	if row == nil {
		t.Fatal("docs/api.md's volumes row refers to no section of docs/node-protocol.md")
	}
	if title := docSections(t, root, "docs/node-protocol.md")[row[1]]; !strings.Contains(strings.ToLower(title), "volumes") {
		t.Errorf("docs/api.md's volumes field refers to docs/node-protocol.md section %s, %q", row[1], title)
	}
}

// TestOperatingGuideSaysWhatWorks: docs/operating.md names the S3 blob store berthd has, lists
// no relays among the API's clients, and says plainly that several berthd replicas on one
// database are not supported, instead of promising them.
func TestOperatingGuideSaysWhatWorks(t *testing.T) {
	guide := strings.Join(strings.Fields(readDoc(t, moduleRoot(t), "docs/operating.md")), " ")
	for _, bad := range []string{"no S3 blob store", "relays", "replicas may share", "more than one replica"} {
		if strings.Contains(guide, bad) {
			t.Errorf("docs/operating.md says %q", bad)
		}
	}
	for _, want := range []string{"Several berthd replicas serving one database are not supported yet", "or an S3 bucket with `--s3-endpoint`"} {
		if !strings.Contains(guide, want) {
			t.Errorf("docs/operating.md does not say %q", want)
		}
	}
}

// TestPluginGuideRoutes: docs/plugins.md shows how to run an agent on a third-party driver,
// and its first-plugin steps give the replace route (no release tag exists) before go get and
// say to run go mod tidy again after adding the conformance test.
func TestPluginGuideRoutes(t *testing.T) {
	guide := strings.Join(strings.Fields(readDoc(t, moduleRoot(t), "docs/plugins.md")), " ")
	if !regexp.MustCompile("berth-agent run [^`]*--driver NAME --plugin-dir ").MatchString(guide) {
		t.Error("docs/plugins.md gives no berth-agent run command for a third-party driver")
	}
	replace, get := strings.Index(guide, "go mod edit -replace github.com/berthhq/berth=../berth"), strings.Index(guide, "go get github.com/berthhq/berth@")
	if replace < 0 || get < 0 || replace > get {
		t.Errorf("docs/plugins.md: the replace route (at %d) must come before go get (at %d)", replace, get)
	}
	if !strings.Contains(guide, "run `go mod tidy` again") {
		t.Error("docs/plugins.md does not say to run go mod tidy again after adding the conformance test")
	}
}

// TestCorestoreConfigModeDocumented: docs/bindings.md and the README say the corestore
// configuration must be mode 0600 even when it holds only secret: references.
func TestCorestoreConfigModeDocumented(t *testing.T) {
	root := moduleRoot(t)
	for _, rel := range []string{"docs/bindings.md", "README.md"} {
		doc := strings.Join(strings.Fields(readDoc(t, root, rel)), " ")
		if !regexp.MustCompile("0600,?[^.]{0,40} even when [^.]*`secret:` reference").MatchString(doc) {
			t.Errorf("%s does not say the corestore configuration must be 0600 even with only secret: references", rel)
		}
	}
}

// TestCommandExpansionDocumented: the API reference says a service's command is not expanded
// and gives the sh -c form.
func TestCommandExpansionDocumented(t *testing.T) {
	row := regexp.MustCompile("(?m)^ *\\| `command` \\|.*$").FindString(readDoc(t, moduleRoot(t), "docs/api.md"))
	if !strings.Contains(row, "not expanded") || !strings.Contains(row, `["sh", "-c", `) {
		t.Errorf("docs/api.md's command row does not say variables are not expanded, with the sh -c form: %q", row)
	}
}

// TestAppDirDocumented: the node protocol says the app directory changes with every rollout
// and names the stable path, BERTH_APP_DIR, with the directory the agent keeps it in.
func TestAppDirDocumented(t *testing.T) {
	doc := strings.Join(strings.Fields(readDoc(t, moduleRoot(t), "docs/node-protocol.md")), " ")
	if !strings.Contains(doc, "absolute path changes with every rollout") || !strings.Contains(doc, "The stable path is `BERTH_APP_DIR`: `DATA/apps/<project>/<service>`") {
		t.Error("docs/node-protocol.md does not say the app directory changes with every rollout and what is stable")
	}
}

// TestWasmGuestSnippetsCarryBuildTag: every Go snippet in the docs (and in
// sdk/wasm's package comment) that exports a WebAssembly function starts with
// //go:build wasip1, as a guest file must: without it, go vet and go test on
// the host build the file and its wasip1-only exports.
func TestWasmGuestSnippetsCarryBuildTag(t *testing.T) {
	root := moduleRoot(t)
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	var snippets []struct{ where, text string }
	fence := regexp.MustCompile("(?s)```go\n(.*?)```")
	for _, f := range append(files, filepath.Join(root, "README.md")) {
		rel, _ := filepath.Rel(root, f)
		for _, m := range fence.FindAllStringSubmatch(readDoc(t, root, rel), -1) {
			snippets = append(snippets, struct{ where, text string }{rel, m[1]})
		}
	}
	// The package comment's indented code block.
	var block []string
	for _, l := range strings.Split(readDoc(t, root, "sdk/wasm/guest.go"), "\n") {
		if !strings.HasPrefix(l, "//") {
			break
		}
		if strings.HasPrefix(l, "//\t") || (l == "//" && len(block) > 0) {
			block = append(block, strings.TrimPrefix(strings.TrimPrefix(l, "//"), "\t"))
		}
	}
	snippets = append(snippets, struct{ where, text string }{"sdk/wasm/guest.go", strings.TrimSpace(strings.Join(block, "\n"))})
	guests := 0
	for _, s := range snippets {
		if !strings.Contains(s.text, "//go:wasmexport") {
			continue
		}
		guests++
		if first, _, _ := strings.Cut(strings.TrimSpace(s.text), "\n"); first != "//go:build wasip1" {
			t.Errorf("%s: a Go guest snippet starts with %q, not //go:build wasip1", s.where, first)
		}
	}
	if guests < 2 {
		t.Errorf("found %d Go guest snippets, want those of docs/wasm-abi.md and sdk/wasm", guests)
	}
}

// TestReadmeLayoutNamesEveryPackage: README's layout table names every package under core/,
// plugins/ and nodeplugins/ (as `core/name` in a row, or as `name` in the row of `core/`), so
// the map a newcomer reads first does not fall behind the code.
func TestReadmeLayoutNamesEveryPackage(t *testing.T) {
	root := moduleRoot(t)
	readme := readDoc(t, root, "README.md")
	var table []string
	for _, line := range strings.Split(readme, "\n") {
		if strings.HasPrefix(line, "| `") {
			table = append(table, line)
		}
	}
	rows := strings.Join(table, "\n")
	for _, dir := range []string{"core", "plugins", "nodeplugins"} {
		entries, err := os.ReadDir(filepath.Join(root, dir))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if !e.IsDir() {
				continue
			}
			if name := dir + "/" + e.Name(); !strings.Contains(rows, "`"+name+"`") && !strings.Contains(rows, "`"+name+"/") {
				t.Errorf("README's layout table does not name %s", name)
			}
		}
	}
}
