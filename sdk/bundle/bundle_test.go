package bundle

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// entry is one crafted tar entry; Size overrides len(Body) when non-zero.
type entry struct {
	Type     byte
	Name     string
	Linkname string
	Body     string
	Mode     int64
	Size     int64
}

// craft returns a tar.gz of entries exactly as given, malicious or not.
func craft(t testing.TB, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, e := range entries {
		h := &tar.Header{Typeflag: e.Type, Name: e.Name, Linkname: e.Linkname, Mode: e.Mode, Size: int64(len(e.Body))}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if e.Type != tar.TypeReg {
			h.Size = 0
		}
		if e.Size != 0 {
			h.Size = e.Size
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatalf("write header %q: %v", e.Name, err)
		}
		if e.Body != "" && h.Size > 0 {
			if _, err := tw.Write([]byte(e.Body)); err != nil {
				t.Fatalf("write body %q: %v", e.Name, err)
			}
		}
	}
	// Close writes padding; an entry shorter than its Size fails here and
	// the archive is left truncated, which some cases want.
	_ = tw.Close()
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func file(name, body string) entry { return entry{Type: tar.TypeReg, Name: name, Body: body} }
func dir(name string) entry        { return entry{Type: tar.TypeDir, Name: name, Mode: 0o755} }
func link(name, target string) entry {
	return entry{Type: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777}
}

type archiveCase struct {
	name    string
	archive []byte
	want    error // nil, ErrInvalid or ErrTooLarge
	max     int64
}

func archiveCases(t testing.TB) []archiveCase {
	bomb := func() []byte {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		tw := tar.NewWriter(zw)
		_ = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "big", Mode: 0o644, Size: 1 << 20})
		_, _ = tw.Write(make([]byte, 1<<20))
		_ = tw.Close()
		_ = zw.Close()
		return buf.Bytes()
	}
	trailing := func() []byte {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		tw := tar.NewWriter(zw)
		_ = tw.Close()
		_, _ = zw.Write(make([]byte, 1<<20)) // zeros after the end of the tar
		_ = zw.Close()
		return buf.Bytes()
	}
	valid := craft(t, dir("app/"), file("app/run", "#!/bin/sh\n"), link("current", "app"), link("app/self", "../app/run"))
	return []archiveCase{
		{name: "valid tree", archive: valid},
		{name: "root dir entry", archive: craft(t, dir("./"), file("./a", "x"))},
		{name: "implicit parents", archive: craft(t, file("a/b/c", "x"), dir("a/"))},
		{name: "dangling link inside", archive: craft(t, link("l", "missing/thing"))},
		{name: "link chain inside", archive: craft(t, dir("x/"), dir("x/y/"), link("a", "x/y"), link("b", "a/..")) /* x */},
		{name: "absolute path", archive: craft(t, file("/etc/passwd", "x")), want: ErrInvalid},
		{name: "dotdot path", archive: craft(t, file("../escape", "x")), want: ErrInvalid},
		{name: "dotdot inside path", archive: craft(t, file("a/../../escape", "x")), want: ErrInvalid},
		{name: "backslash path", archive: craft(t, file(`..\escape`, "x")), want: ErrInvalid},
		{name: "absolute symlink", archive: craft(t, link("etc", "/etc")), want: ErrInvalid},
		{name: "dotdot symlink", archive: craft(t, link("up", "../outside")), want: ErrInvalid},
		{name: "deep dotdot symlink", archive: craft(t, dir("a/"), link("a/up", "../../outside")), want: ErrInvalid},
		{name: "escape via earlier symlinked dir", archive: craft(t, link("a", "."), link("b", "a/..")), want: ErrInvalid},
		{name: "escape via earlier deep link", archive: craft(t, dir("d/"), link("d/here", "."), link("d/out", "here/../..")), want: ErrInvalid},
		{name: "later link redirects earlier one", archive: craft(t, link("b", "x/.."), link("x", ".")), want: ErrInvalid},
		{name: "write through symlinked dir", archive: craft(t, dir("sub/"), link("d", "sub"), file("d/f", "x")), want: ErrInvalid},
		{name: "write through escaping link", archive: craft(t, link("d", "/tmp"), file("d/f", "x")), want: ErrInvalid},
		{name: "symlink loop", archive: craft(t, link("a", "b"), link("b", "a"), link("c", "a/x")), want: ErrInvalid},
		{name: "hard link", archive: craft(t, file("a", "x"), entry{Type: tar.TypeLink, Name: "b", Linkname: "a"}), want: ErrInvalid},
		{name: "hard link outside", archive: craft(t, entry{Type: tar.TypeLink, Name: "b", Linkname: "/etc/passwd"}), want: ErrInvalid},
		{name: "char device", archive: craft(t, entry{Type: tar.TypeChar, Name: "null"}), want: ErrInvalid},
		{name: "block device", archive: craft(t, entry{Type: tar.TypeBlock, Name: "sda"}), want: ErrInvalid},
		{name: "fifo", archive: craft(t, entry{Type: tar.TypeFifo, Name: "pipe"}), want: ErrInvalid},
		{name: "duplicate file", archive: craft(t, file("a", "x"), file("a", "y")), want: ErrInvalid},
		{name: "file then dir under it", archive: craft(t, file("a", "x"), file("a/b", "y")), want: ErrInvalid},
		{name: "dir then symlink same name", archive: craft(t, file("a/b", "x"), link("a", ".")), want: ErrInvalid},
		{name: "root as file", archive: craft(t, file(".", "x")), want: ErrInvalid},
		{name: "not gzip", archive: []byte("just some text, not an archive"), want: ErrInvalid},
		{name: "truncated", archive: valid[:len(valid)/2], want: ErrInvalid},
		{name: "truncated content", archive: truncatedContent(t), want: ErrInvalid},
		{name: "gzip of garbage", archive: gz(t, []byte(strings.Repeat("garbage!", 200))), want: ErrInvalid},
		{name: "too large file", archive: bomb(), max: 1 << 19, want: ErrTooLarge},
		{name: "too large trailing data", archive: trailing(), max: 1 << 19, want: ErrTooLarge},
		{name: "large dir payload", archive: dirWithPayload(t, 1<<20), max: 1 << 19, want: ErrTooLarge},
	}
}

// dirWithPayload returns a tar.gz whose one directory header claims n bytes of
// payload (tar.Writer refuses to write one, so the header is patched).
func dirWithPayload(t testing.TB, n int) []byte {
	t.Helper()
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "d", Mode: 0o755, Size: int64(n), Format: tar.FormatUSTAR}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write(make([]byte, n)); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	b := raw.Bytes()
	b[156] = tar.TypeDir
	copy(b[148:156], "        ")
	var sum int64
	for _, c := range b[:512] {
		sum += int64(c)
	}
	copy(b[148:156], fmt.Sprintf("%06o\x00 ", sum))
	return gz(t, b)
}

// truncatedContent returns a tar.gz whose one file ends before its Size.
func truncatedContent(t testing.TB) []byte {
	t.Helper()
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "f", Mode: 0o644, Size: 4096}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write(make([]byte, 100)); err != nil {
		t.Fatal(err)
	}
	return gz(t, raw.Bytes())
}

func gz(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	_, _ = zw.Write(b)
	_ = zw.Close()
	return buf.Bytes()
}

func TestValidateAndExtract(t *testing.T) {
	t.Parallel()
	for _, tc := range archiveCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			err := Validate(ctx, bytes.NewReader(tc.archive), tc.max)
			checkErr(t, "Validate", err, tc.want)

			parent := t.TempDir()
			if err := os.WriteFile(filepath.Join(parent, "sentinel"), []byte("keep"), 0o644); err != nil {
				t.Fatal(err)
			}
			root := filepath.Join(parent, "root")
			if err := os.Mkdir(root, 0o755); err != nil {
				t.Fatal(err)
			}
			err = Extract(ctx, bytes.NewReader(tc.archive), root, tc.max)
			checkErr(t, "Extract", err, tc.want)
			assertContained(t, parent, root)
		})
	}
}

func checkErr(t *testing.T, op string, got, want error) {
	t.Helper()
	switch {
	case want == nil && got != nil:
		t.Errorf("%s: unexpected error: %v", op, got)
	case want != nil && !errors.Is(got, want):
		t.Errorf("%s: error = %v, want one wrapping %v", op, got, want)
	}
}

// assertContained checks that parent holds only the sentinel and root, and
// that every symlink under root resolves inside it.
func assertContained(t testing.TB, parent, root string) {
	t.Helper()
	ents, err := os.ReadDir(parent)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 2 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Fatalf("parent holds %v, want only root and sentinel", names)
	}
	if b, err := os.ReadFile(filepath.Join(parent, "sentinel")); err != nil || string(b) != "keep" {
		t.Fatalf("sentinel changed: %q, %v", b, err)
	}
	realRoot, err := filepath.EvalSymlinks(root)
	if err != nil {
		t.Fatal(err)
	}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type()&fs.ModeSymlink == 0 {
			return nil
		}
		resolved, err := filepath.EvalSymlinks(p)
		if err != nil {
			return nil // dangling, or a loop: nothing outside is reached
		}
		if resolved != realRoot && !strings.HasPrefix(resolved, realRoot+string(filepath.Separator)) {
			t.Errorf("symlink %s resolves to %s, outside %s", p, resolved, realRoot)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestExtractRefusesNonEmptyDir(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "x"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Extract(context.Background(), bytes.NewReader(craft(t, file("a", "b"))), root, 0); err == nil {
		t.Fatal("Extract into a non-empty dir succeeded")
	}
}

func writeTreeForTest(t *testing.T, root string) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "bin"), 0o755))
	must(os.MkdirAll(filepath.Join(root, "static", "empty"), 0o700))
	must(os.WriteFile(filepath.Join(root, "bin", "server"), []byte("#!/bin/sh\necho hi\n"), 0o700))
	must(os.WriteFile(filepath.Join(root, "static", "index.html"), []byte("<h1>hi</h1>"), 0o600))
	must(os.WriteFile(filepath.Join(root, "README"), []byte("readme"), 0o664))
	must(os.Symlink("bin/server", filepath.Join(root, "start")))
}

func TestCreateDeterministicAndRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	src := t.TempDir()
	writeTreeForTest(t, src)

	var a bytes.Buffer
	digest, size, err := Create(ctx, src, &a)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(a.Bytes())
	if want := "sha256:" + hex.EncodeToString(sum[:]); digest != want {
		t.Errorf("digest = %s, want %s", digest, want)
	}
	if size != int64(a.Len()) {
		t.Errorf("size = %d, want %d", size, a.Len())
	}

	// New timestamps and a copy elsewhere give the same digest.
	old := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	if err := os.Chtimes(filepath.Join(src, "README"), old, old); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	digest2, _, err := Create(ctx, src, &b)
	if err != nil {
		t.Fatal(err)
	}
	if digest2 != digest {
		t.Errorf("digest changed with mtimes: %s then %s", digest, digest2)
	}
	other := t.TempDir()
	writeTreeForTest(t, other)
	digest3, _, err := Create(ctx, other, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if digest3 != digest {
		t.Errorf("same tree in another dir gives %s, want %s", digest3, digest)
	}

	if err := Validate(ctx, bytes.NewReader(a.Bytes()), 0); err != nil {
		t.Fatalf("Validate of a created bundle: %v", err)
	}
	dst := t.TempDir()
	if err := Extract(ctx, bytes.NewReader(a.Bytes()), dst, 0); err != nil {
		t.Fatal(err)
	}
	wantModes := map[string]fs.FileMode{
		"bin":               fs.ModeDir | 0o755,
		"bin/server":        0o755,
		"static":            fs.ModeDir | 0o755,
		"static/empty":      fs.ModeDir | 0o755,
		"static/index.html": 0o644,
		"README":            0o644,
		"start":             fs.ModeSymlink,
	}
	for name, want := range wantModes {
		info, err := os.Lstat(filepath.Join(dst, name))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		got := info.Mode()
		if want == fs.ModeSymlink {
			got = got.Type()
		}
		if got != want {
			t.Errorf("%s: mode %v, want %v", name, got, want)
		}
	}
	if b, err := os.ReadFile(filepath.Join(dst, "start")); err != nil || string(b) != "#!/bin/sh\necho hi\n" {
		t.Errorf("start -> bin/server reads %q, %v", b, err)
	}
}

func TestCreateSingleFile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	src := filepath.Join(t.TempDir(), "app")
	if err := os.WriteFile(src, []byte("binary"), 0o755); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, _, err := Create(ctx, src, &buf); err != nil {
		t.Fatal(err)
	}
	dst := t.TempDir()
	if err := Extract(ctx, &buf, dst, 0); err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(filepath.Join(dst, "app"))
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode() != 0o755 {
		t.Errorf("mode %v, want 0755", info.Mode())
	}
}

func TestCreateRefusesEscapingSymlink(t *testing.T) {
	t.Parallel()
	src := t.TempDir()
	if err := os.Symlink("../../etc/passwd", filepath.Join(src, "passwd")); err != nil {
		t.Fatal(err)
	}
	_, _, err := Create(context.Background(), src, &bytes.Buffer{})
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("Create = %v, want ErrInvalid", err)
	}
}

func TestCanceled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	archive := craft(t, file("a", "b"))
	if err := Validate(ctx, bytes.NewReader(archive), 0); !errors.Is(err, context.Canceled) {
		t.Errorf("Validate = %v, want context.Canceled", err)
	}
	if err := Extract(ctx, bytes.NewReader(archive), t.TempDir(), 0); !errors.Is(err, context.Canceled) {
		t.Errorf("Extract = %v, want context.Canceled", err)
	}
	if _, _, err := Create(ctx, t.TempDir(), &bytes.Buffer{}); err != nil {
		// An empty dir has no entries to cancel between; only check no panic.
		t.Logf("Create on canceled ctx: %v", err)
	}
}

// FuzzExtract checks that no archive, however crafted, makes Extract write
// outside its directory or leave a symlink that resolves outside it, and that
// Validate accepts whatever Extract accepts.
func FuzzExtract(f *testing.F) {
	for _, tc := range archiveCases(f) {
		f.Add(tc.archive)
	}
	f.Fuzz(func(t *testing.T, archive []byte) {
		ctx := context.Background()
		parent := t.TempDir()
		if err := os.WriteFile(filepath.Join(parent, "sentinel"), []byte("keep"), 0o644); err != nil {
			t.Fatal(err)
		}
		root := filepath.Join(parent, "root")
		if err := os.Mkdir(root, 0o755); err != nil {
			t.Fatal(err)
		}
		const limit = 1 << 20
		extractErr := Extract(ctx, bytes.NewReader(archive), root, limit)
		assertContained(t, parent, root)
		if extractErr == nil {
			if err := Validate(ctx, bytes.NewReader(archive), limit); err != nil {
				t.Fatalf("Extract accepted what Validate refuses: %v", err)
			}
		}
	})
}
