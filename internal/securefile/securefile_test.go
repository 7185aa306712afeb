package securefile_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/berthhq/berth/internal/securefile"
)

func TestWriteReadRoundTrip(t *testing.T) {
	root := t.TempDir()
	path := filepath.Join(root, "a", "b", "secret")
	if err := securefile.WriteFile(path, []byte("one")); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	if err := securefile.WriteFile(path, []byte("two")); err != nil {
		t.Fatalf("WriteFile over existing: %v", err)
	}
	got, err := securefile.ReadFile(path)
	if err != nil || !bytes.Equal(got, []byte("two")) {
		t.Fatalf("ReadFile = %q, %v; want \"two\"", got, err)
	}
	for _, p := range []string{filepath.Join(root, "a"), filepath.Join(root, "a", "b")} {
		fi, err := os.Stat(p)
		if err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("directory %s: mode %v, err %v; want 0700", p, fi.Mode().Perm(), err)
		}
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("file mode %v, err %v; want 0600", fi.Mode().Perm(), err)
	}
	entries, err := os.ReadDir(filepath.Dir(path))
	if err != nil || len(entries) != 1 {
		t.Errorf("directory holds %d entries (%v), want only the file: no temporary left behind", len(entries), err)
	}
}

func TestWriteIgnoresUmask(t *testing.T) {
	old := syscall.Umask(0)
	t.Cleanup(func() { syscall.Umask(old) })
	path := filepath.Join(t.TempDir(), "d", "secret")
	if err := securefile.WriteFile(path, []byte("x")); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	if _, err := securefile.ReadFile(path); err != nil {
		t.Fatalf("ReadFile: %v", err)
	}
}

func TestWriteReplacesSymlink(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	if err := os.WriteFile(target, []byte("untouched"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if err := securefile.WriteFile(link, []byte("new")); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	if got, _ := os.ReadFile(target); string(got) != "untouched" {
		t.Errorf("symlink target changed to %q", got)
	}
	if got, err := securefile.ReadFile(link); err != nil || string(got) != "new" {
		t.Errorf("ReadFile = %q, %v; want \"new\"", got, err)
	}
}

func TestReadRefusals(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	if err := securefile.WriteFile(good, []byte("s")); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(good, link); err != nil {
		t.Fatal(err)
	}
	groupReadable := filepath.Join(dir, "group")
	worldReadable := filepath.Join(dir, "world")
	for p, mode := range map[string]os.FileMode{groupReadable: 0o640, worldReadable: 0o604} {
		if err := os.WriteFile(p, []byte("s"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	subdir := filepath.Join(dir, "sub")
	if err := os.Mkdir(subdir, 0o700); err != nil {
		t.Fatal(err)
	}

	for name, p := range map[string]string{
		"symlink":        link,
		"group-readable": groupReadable,
		"world-readable": worldReadable,
		"fifo":           fifo,
		"directory":      subdir,
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := securefile.ReadFile(p); !errors.Is(err, securefile.ErrInsecure) {
				t.Fatalf("ReadFile(%s) = %v, want ErrInsecure", name, err)
			}
		})
	}

	if _, err := securefile.ReadFile(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("ReadFile(missing) = %v, want os.ErrNotExist", err)
	}
}
