package runner_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/berthhq/berth/sdk/runner"
)

var cred = runner.Credential{NodeID: "west-1", Token: "brn_" + strings.Repeat("a", 43)}

func saved(t *testing.T) (*runner.FileCredentials, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "state", "credentials.json")
	fc := runner.NewFileCredentials(path)
	if err := fc.Save(context.Background(), cred); err != nil {
		t.Fatal(err)
	}
	return fc, path
}

func TestFileCredentialsRoundTrip(t *testing.T) {
	ctx := context.Background()
	fc, path := saved(t)
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode = %v, %v; want 0600", fi.Mode().Perm(), err)
	}
	if got, err := fc.Load(ctx); err != nil || got != cred {
		t.Fatalf("load = %+v, %v", got, err)
	}
	// A second save replaces the file atomically (a new inode) and the store follows it.
	next := runner.Credential{NodeID: "west-1", Token: "brn_" + strings.Repeat("b", 43)}
	if err := fc.Save(ctx, next); err != nil {
		t.Fatal(err)
	}
	if got, err := runner.NewFileCredentials(path).Load(ctx); err != nil || got != next {
		t.Fatalf("fresh store load = %+v, %v", got, err)
	}
	if err := fc.Clear(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := fc.Load(ctx); !errors.Is(err, runner.ErrNoCredential) {
		t.Fatalf("after clear: %v", err)
	}
}

// TestFileCredentialsRefusals: every refusal case on real files.
func TestFileCredentialsRefusals(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name string
		// prepare breaks the saved file at path; fresh reports whether a new store (which knows no
		// inode) must refuse too.
		prepare func(t *testing.T, path string)
		fresh   bool
	}{
		{"symlink", func(t *testing.T, path string) {
			other := path + ".real"
			must(t, os.Rename(path, other))
			must(t, os.Symlink(other, path))
		}, true},
		{"directory", func(t *testing.T, path string) {
			must(t, os.Remove(path))
			must(t, os.Mkdir(path, 0o700))
		}, true},
		{"fifo", func(t *testing.T, path string) {
			must(t, os.Remove(path))
			must(t, syscall.Mkfifo(path, 0o600))
		}, true},
		{"group-readable", func(t *testing.T, path string) { must(t, os.Chmod(path, 0o640)) }, true},
		{"world-readable", func(t *testing.T, path string) { must(t, os.Chmod(path, 0o604)) }, true},
		{"oversized", func(t *testing.T, path string) {
			must(t, os.WriteFile(path, make([]byte, runner.MaxCredentialFileBytes+1), 0o600))
		}, true},
		{"wrong-owner", func(t *testing.T, path string) {
			if os.Geteuid() != 0 {
				t.Skip("chown to another user needs root") // skipped only off CI: make test runs as root here
			}
			must(t, os.Chown(path, 4242, 4242))
		}, true},
		{"inode-swap", func(t *testing.T, path string) {
			// Same path, same content, another file, written by someone else.
			data, err := os.ReadFile(path)
			must(t, err)
			other := path + ".new"
			must(t, os.WriteFile(other, data, 0o600))
			must(t, os.Rename(other, path))
		}, false},
		{"path-swap", func(t *testing.T, path string) {
			// The directory moved away and another one, with another file, put in its place.
			dir := filepath.Dir(path)
			data, err := os.ReadFile(path)
			must(t, err)
			must(t, os.Rename(dir, dir+".old"))
			must(t, os.Mkdir(dir, 0o700))
			must(t, os.WriteFile(path, data, 0o600))
		}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fc, path := saved(t)
			if _, err := fc.Load(ctx); err != nil {
				t.Fatal(err)
			}
			tc.prepare(t, path)
			if _, err := fc.Load(ctx); !errors.Is(err, runner.ErrInsecureCredentials) {
				t.Fatalf("load: %v, want ErrInsecureCredentials", err)
			}
			if err := fc.Save(ctx, cred); !errors.Is(err, runner.ErrInsecureCredentials) {
				t.Fatalf("save over it: %v, want ErrInsecureCredentials", err)
			}
			if tc.fresh {
				if _, err := runner.NewFileCredentials(path).Load(ctx); !errors.Is(err, runner.ErrInsecureCredentials) {
					t.Fatalf("fresh store load: %v, want ErrInsecureCredentials", err)
				}
			}
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
