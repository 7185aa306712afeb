package store_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/FerretDB/FerretDB/ferretdb"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/core/store/storetest"
)

// lockChildEnv, when set in the environment, makes the test binary act as a second process
// that tries LockDir on the named directory and reports the outcome through its exit code.
const lockChildEnv = "BERTH_STORE_TEST_LOCK_CHILD"

const (
	childLocked   = 3 // LockDir returned ErrLocked
	childAcquired = 0 // LockDir succeeded
	childFailed   = 1 // any other error
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(lockChildEnv); dir != "" {
		unlock, err := store.LockDir(dir)
		switch {
		case errors.Is(err, store.ErrLocked):
			os.Exit(childLocked)
		case err != nil:
			fmt.Fprintln(os.Stderr, err)
			os.Exit(childFailed)
		}
		_ = unlock()
		os.Exit(childAcquired)
	}
	os.Exit(m.Run())
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// tWriter sends log lines to t.Log so they show only for failing or -v tests.
type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// perTest returns a function giving each test its own value, the same on every call by that test.
func perTest[T any](mk func(t *testing.T) T) func(t *testing.T) T {
	var mu sync.Mutex
	vals := map[string]T{}
	return func(t *testing.T) T {
		mu.Lock()
		defer mu.Unlock()
		v, ok := vals[t.Name()]
		if !ok {
			v = mk(t)
			vals[t.Name()] = v
		}
		return v
	}
}

func openStore(t *testing.T, cfg store.Config) *store.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	s, err := store.Open(ctx, cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

func TestConformanceEmbedded(t *testing.T) {
	t.Parallel()
	dataDir := perTest(func(t *testing.T) string { return t.TempDir() })
	storetest.Run(t, func(t *testing.T) *store.Store {
		s := openStore(t, store.Config{DataDir: dataDir(t), Logger: testLogger(t)})
		if !s.Embedded() || !s.FerretDB() {
			t.Fatalf("embedded store: Embedded()=%v FerretDB()=%v, want both true", s.Embedded(), s.FerretDB())
		}
		return s
	})
}

// TestConformanceFerretDBBehindURI runs the suite against a FerretDB reached by URI, as an
// operator pointing --mongo-uri at FerretDB would: Open must detect it and limit the pool.
func TestConformanceFerretDBBehindURI(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	f, err := ferretdb.New(&ferretdb.Config{
		Listener:  ferretdb.ListenerConfig{TCP: "127.0.0.1:0"},
		Handler:   "sqlite",
		SQLiteURL: "file:" + dir + "/",
		Logger:    slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatalf("start FerretDB: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = f.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	uri := f.MongoDBURI()
	database := perTest(func(t *testing.T) string { return fmt.Sprintf("t%d", time.Now().UnixNano()) })
	storetest.Run(t, func(t *testing.T) *store.Store {
		s := openStore(t, store.Config{URI: uri, Database: database(t), Logger: testLogger(t)})
		if s.Embedded() || !s.FerretDB() {
			t.Fatalf("FerretDB behind a URI: Embedded()=%v FerretDB()=%v, want false, true", s.Embedded(), s.FerretDB())
		}
		return s
	})
}

// TestConformanceMongo runs the suite against the MongoDB in BERTH_TEST_MONGO_URI, each test in
// its own database, dropped afterwards.
func TestConformanceMongo(t *testing.T) {
	t.Parallel()
	uri := os.Getenv("BERTH_TEST_MONGO_URI")
	if uri == "" {
		t.Skip("BERTH_TEST_MONGO_URI is not set; the embedded store is covered by TestConformanceEmbedded")
	}
	database := perTest(func(t *testing.T) string { return fmt.Sprintf("berth_test_%d", time.Now().UnixNano()) })
	storetest.Run(t, func(t *testing.T) *store.Store {
		s := openStore(t, store.Config{URI: uri, Database: database(t), Logger: testLogger(t)})
		t.Cleanup(func() { _ = s.DB().Drop(context.Background()) })
		return s
	})
}

func TestOpenEmbeddedRequiresDataDir(t *testing.T) {
	t.Parallel()
	_, err := store.Open(t.Context(), store.Config{})
	if err == nil {
		t.Fatal("Open with neither URI nor DataDir succeeded")
	}
}

func TestEmbeddedLayoutAndClose(t *testing.T) {
	t.Parallel()
	dataDir := t.TempDir()
	s := openStore(t, store.Config{DataDir: dataDir})
	if _, err := s.Collection("things").InsertOne(t.Context(), bson.M{"_id": 1}); err != nil {
		t.Fatalf("insert: %v", err)
	}
	if err := s.Close(t.Context()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(t.Context()); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	fi, err := os.Stat(filepath.Join(dataDir, "store"))
	if err != nil {
		t.Fatalf("store directory: %v", err)
	}
	if perm := fi.Mode().Perm(); perm != 0o700 {
		t.Errorf("store directory mode = %v, want 0700", perm)
	}
	matches, _ := filepath.Glob(filepath.Join(dataDir, "store", store.DefaultDatabase+"*"))
	if len(matches) == 0 {
		t.Errorf("no SQLite file for database %q under %s/store", store.DefaultDatabase, dataDir)
	}
	if err := s.Ping(t.Context()); err == nil {
		t.Errorf("Ping after Close succeeded")
	}
}

func TestLockDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	unlock, err := store.LockDir(dir)
	if err != nil {
		t.Fatalf("LockDir: %v", err)
	}

	// A second lock in this process fails too (flock is per open file).
	if _, err := store.LockDir(dir); !errors.Is(err, store.ErrLocked) {
		t.Fatalf("second LockDir in-process: got %v, want ErrLocked", err)
	}
	if code := runLockChild(t, dir); code != childLocked {
		t.Fatalf("LockDir in another process while held: exit %d, want %d (ErrLocked)", code, childLocked)
	}

	if err := unlock(); err != nil {
		t.Fatalf("unlock: %v", err)
	}
	if err := unlock(); err != nil {
		t.Fatalf("second unlock: %v", err)
	}
	if code := runLockChild(t, dir); code != childAcquired {
		t.Fatalf("LockDir in another process after unlock: exit %d, want %d (acquired)", code, childAcquired)
	}
	fi, err := os.Stat(filepath.Join(dir, store.LockFileName))
	if err != nil {
		t.Fatalf("lock file: %v", err)
	}
	if perm := fi.Mode().Perm(); perm != 0o600 {
		t.Errorf("lock file mode = %v, want 0600", perm)
	}
}

// runLockChild re-runs this test binary as a second process that tries LockDir(dir).
func runLockChild(t *testing.T, dir string) int {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), lockChildEnv+"="+dir)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		if ee.ExitCode() == childFailed {
			t.Logf("lock child output: %s", out)
		}
		return ee.ExitCode()
	default:
		t.Fatalf("run lock child: %v", err)
		return -1
	}
}

// BenchmarkOpenEmpty measures Open and Close of a new, empty embedded store.
func BenchmarkOpenEmpty(b *testing.B) {
	ctx := context.Background()
	for b.Loop() {
		s, err := store.Open(ctx, store.Config{DataDir: b.TempDir()})
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Close(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReopenWithData measures Open (to first answered query) and Close of an embedded store
// holding 10 collections of 1,000 documents each.
func BenchmarkReopenWithData(b *testing.B) {
	ctx := context.Background()
	dir := b.TempDir()
	s, err := store.Open(ctx, store.Config{DataDir: dir})
	if err != nil {
		b.Fatal(err)
	}
	for c := range 10 {
		docs := make([]any, 1000)
		for i := range docs {
			docs[i] = bson.M{"_id": i, "name": fmt.Sprintf("doc-%d", i), store.RevisionField: int64(1), "payload": strings.Repeat("x", 200)}
		}
		if _, err := s.Collection(fmt.Sprintf("c%d", c)).InsertMany(ctx, docs); err != nil {
			b.Fatal(err)
		}
	}
	if err := s.Close(ctx); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		s, err := store.Open(ctx, store.Config{DataDir: dir})
		if err != nil {
			b.Fatal(err)
		}
		var doc bson.M
		if err := store.FindByID(ctx, s.Collection("c9"), 999, &doc); err != nil {
			b.Fatal(err)
		}
		if err := s.Close(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
