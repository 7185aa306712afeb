package proctest

import (
	"os"
	"path/filepath"
	"testing"
)

// TailBytes is how much of each log LogTailsOnFailure shows: the last 30,000
// bytes.
const TailBytes = 30000

// LogTailsOnFailure registers a cleanup that, when t has failed, logs the
// last TailBytes of each of files (paths relative to dir; a missing file
// logs as empty). Register it after the processes whose logs it shows, so
// it runs before their cleanups stop them.
func LogTailsOnFailure(t testing.TB, dir string, files ...string) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, f := range files {
			b, _ := os.ReadFile(filepath.Join(dir, f))
			if len(b) > TailBytes {
				b = b[len(b)-TailBytes:]
			}
			t.Logf("---- %s (tail) ----\n%s", f, b)
		}
	})
}
