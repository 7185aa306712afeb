package dirlock

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestHold: Hold of a directory another Lock holds is refused with the holder's pid; a free
// directory is held, keeping Lock out until release; a never locked directory is left untouched.
func TestHold(t *testing.T) {
	dir := t.TempDir()
	fresh := filepath.Join(dir, "fresh")
	if err := os.Mkdir(fresh, 0o700); err != nil {
		t.Fatal(err)
	}
	release, holder, err := Hold(fresh)
	if err != nil || holder != 0 {
		t.Fatalf("Hold of a never locked directory: holder %d err %v", holder, err)
	}
	_ = release()
	if _, err := os.Stat(filepath.Join(fresh, FileName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Hold wrote in the directory: %v", err)
	}

	unlock, err := Lock(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, holder, err := Hold(dir); !errors.Is(err, ErrLocked) || holder != os.Getpid() {
		t.Fatalf("Hold of a locked directory: holder %d err %v, want ErrLocked by %d", holder, err, os.Getpid())
	}
	if err := unlock(); err != nil {
		t.Fatal(err)
	}
	release, _, err = Hold(dir)
	if err != nil {
		t.Fatalf("Hold of a released directory: %v", err)
	}
	if _, err := Lock(dir); !errors.Is(err, ErrLocked) {
		t.Fatalf("Lock while held: %v, want ErrLocked", err)
	}
	if err := release(); err != nil {
		t.Fatal(err)
	}
	unlock, err = Lock(dir)
	if err != nil {
		t.Fatalf("Lock after release: %v", err)
	}
	_ = unlock()
}
