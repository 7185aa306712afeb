package main

import (
	"bufio"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// quotedCommand is one `berth ...` command written in a document or an
// example's comment, and where.
type quotedCommand struct {
	where string // file:line
	line  string
}

var (
	// codeSpan is an inline code span holding a berth command.
	codeSpan = regexp.MustCompile("`(berth [^`]+)`")
	// bareCommand is a whole line (of a code block, or a comment once its
	// marker is removed) that is a berth command, maybe after "Run:".
	bareCommand = regexp.MustCompile(`^(?:Run:\s*)?(berth\s+[a-z].*)$`)
	// commentMarker starts a comment line in the examples' languages.
	commentMarker = regexp.MustCompile(`^\s*(?://+|#+|\*)\s?`)
)

// quotedCommands collects the berth commands of path: inline code spans
// anywhere, and whole lines inside fenced code blocks (Markdown) or comments
// (source files).
func quotedCommands(t *testing.T, path string) []quotedCommand {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	md := strings.HasSuffix(path, ".md")
	var out []quotedCommand
	inFence := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		where := path + ":" + itoa(n)
		if md && strings.HasPrefix(strings.TrimSpace(line), "```") {
			inFence = !inFence
			continue
		}
		for _, m := range codeSpan.FindAllStringSubmatch(line, -1) {
			out = append(out, quotedCommand{where, m[1]})
		}
		var body string
		switch {
		case md && inFence:
			body = strings.TrimSpace(line)
		case !md && commentMarker.MatchString(line):
			body = strings.TrimSpace(commentMarker.ReplaceAllString(line, ""))
		default:
			continue
		}
		if m := bareCommand.FindStringSubmatch(body); m != nil && !strings.Contains(body, "`") {
			out = append(out, quotedCommand{where, m[1]})
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func itoa(n int) string {
	const digits = "0123456789"
	if n < 10 {
		return digits[n : n+1]
	}
	return itoa(n/10) + digits[n%10:n%10+1]
}

// commandArgs turns a quoted command into the CLI's arguments: shell
// redirections and pipes end it, a synopsis's optional brackets are
// dropped, "a|b" alternatives take the first and "..." is a placeholder.
func commandArgs(line string) []string {
	var out []string
	for _, tok := range strings.Fields(line)[1:] {
		if tok == ">" || tok == "|" || tok == "&&" || tok == ";" || strings.HasPrefix(tok, ">") {
			break
		}
		tok = strings.NewReplacer("[", "", "]", "").Replace(tok)
		tok = strings.Trim(tok, `"'`)
		if tok == "" {
			continue
		}
		if tok == "..." || tok == "…" {
			tok = "X" // a placeholder value
		}
		if i := strings.Index(tok, "|"); i > 0 {
			tok = tok[:i]
		}
		out = append(out, tok)
	}
	return out
}

// TestQuotedCommandsParse finds every berth command quoted in
// docs/plugins.md, docs/wasm-abi.md and the examples' comments and checks
// that it names a real command whose flags parse and whose arguments the
// command accepts; a repository path it names must exist. A command told to
// authors that fails with "unknown flag" fails here first.
func TestQuotedCommandsParse(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	files := []string{filepath.Join(root, "docs", "plugins.md"), filepath.Join(root, "docs", "wasm-abi.md")}
	err := filepath.WalkDir(filepath.Join(root, "examples"), func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == "node_modules" {
			return filepath.SkipDir
		}
		switch filepath.Ext(path) {
		case ".go", ".yaml", ".yml", ".sh", ".ts", ".md":
			if !d.IsDir() {
				files = append(files, path)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var cmds []quotedCommand
	for _, f := range files {
		cmds = append(cmds, quotedCommands(t, f)...)
	}
	if testing.Verbose() {
		for _, c := range cmds {
			t.Logf("%s: %s", c.where, c.line)
		}
	}
	if len(cmds) < 20 {
		t.Fatalf("found only %d quoted commands; the extraction is broken", len(cmds))
	}
	for _, c := range cmds {
		args := commandArgs(c.line)
		a := &app{stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard, getenv: func(string) string { return "" }}
		rootCmd := newRootCmd(a)
		cmd, rest, err := rootCmd.Find(args)
		if err != nil || cmd == rootCmd {
			t.Errorf("%s: %q: no such command (%v)", c.where, c.line, err)
			continue
		}
		if err := cmd.ParseFlags(rest); err != nil {
			t.Errorf("%s: %q: %v", c.where, c.line, err)
			continue
		}
		if cmd.HasSubCommands() || len(rest) == 0 {
			continue // a group or a command named in prose ("berth image push")
		}
		if err := cmd.ValidateArgs(cmd.Flags().Args()); err != nil {
			t.Errorf("%s: %q: %v", c.where, c.line, err)
		}
		for _, arg := range append(cmd.Flags().Args(), rest...) {
			for _, dir := range []string{"examples/", "docs/", "scripts/"} {
				if strings.HasPrefix(arg, dir) {
					if _, err := os.Stat(filepath.Join(root, arg)); err != nil {
						t.Errorf("%s: %q names %s, which does not exist", c.where, c.line, arg)
					}
				}
			}
		}
	}
}
