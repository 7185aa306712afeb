// Package releases serves the Berth binaries berthd offers to nodes for
// upgrades: a directory of files named <program>-<version>-<os>-<arch>, each
// known by its SHA-256 (docs/upgrades.md section 3).
package releases

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/internal/version"
)

// ErrNotFound is returned by [Catalog.Open] and [Catalog.Find] when no
// release file matches.
var ErrNotFound = errors.New("berth: no such release")

// namePattern splits a release file name: the program (berth-agent,
// berth-plugin-process), the version (a digit first), the OS and the
// architecture, e.g. berth-agent-0.4.0-linux-amd64.
var namePattern = regexp.MustCompile(`^(berth(?:-[a-z][a-z0-9]*)+)-([0-9][0-9A-Za-z.+-]*)-([a-z0-9]+)-([a-z0-9]+)$`)

// Catalog indexes one release directory. The zero value serves nothing; a
// Catalog is safe for concurrent use. Files are hashed once per (size,
// modification time) and re-read when either changes.
type Catalog struct {
	dir     string
	shipped string // see [Catalog.WithShipped]

	mu    sync.Mutex
	cache map[string]entry // file name (or shipped path) -> its last hash; mu must be held
}

type entry struct {
	file    node.ReleaseFile
	size    int64
	modTime time.Time
}

// New returns a Catalog of dir; an empty dir serves nothing.
func New(dir string) *Catalog {
	return &Catalog{dir: dir, cache: map[string]entry{}}
}

// List returns every release file of the directory, sorted by name then
// version. Files whose name does not follow <program>-<version>-<os>-<arch>
// with a semantic version, and anything that is not a regular file, are
// left out. It reads the directory on every call.
func (c *Catalog) List() ([]node.ReleaseFile, error) {
	if c == nil || c.dir == "" {
		return nil, nil
	}
	ents, err := os.ReadDir(c.dir)
	if err != nil {
		return nil, fmt.Errorf("read release directory: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []node.ReleaseFile
	for _, e := range ents {
		m := namePattern.FindStringSubmatch(e.Name())
		if m == nil || !e.Type().IsRegular() {
			continue
		}
		if _, err := version.Parse(m[2]); err != nil {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue
		}
		if ce, ok := c.cache[e.Name()]; ok && ce.size == info.Size() && ce.modTime.Equal(info.ModTime()) {
			out = append(out, ce.file)
			continue
		}
		sum, n, err := hashFile(filepath.Join(c.dir, e.Name()))
		if err != nil {
			return nil, err
		}
		f := node.ReleaseFile{Name: m[1], Version: m[2], OS: m[3], Arch: m[4], SHA256: sum, Size: n}
		c.cache[e.Name()] = entry{file: f, size: info.Size(), modTime: info.ModTime()}
		out = append(out, f)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		cmp, _ := version.Compare(out[i].Version, out[j].Version)
		if cmp != 0 {
			return cmp < 0
		}
		return out[i].OS+out[i].Arch < out[j].OS+out[j].Arch
	})
	return out, nil
}

// Find returns the files of program at version v, one per platform; the
// error wraps [ErrNotFound] when there is none.
func (c *Catalog) Find(program, v string) ([]node.ReleaseFile, error) {
	all, err := c.List()
	if err != nil {
		return nil, err
	}
	var out []node.ReleaseFile
	for _, f := range all {
		if cmp, err := version.Compare(f.Version, v); f.Name == program && err == nil && cmp == 0 {
			out = append(out, f)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s %s: %w", program, v, ErrNotFound)
	}
	return out, nil
}

// Latest returns the newest version of program the directory holds; the
// error wraps [ErrNotFound] when it holds none.
func (c *Catalog) Latest(program string) (string, error) {
	all, err := c.List()
	if err != nil {
		return "", err
	}
	best := ""
	for _, f := range all {
		if f.Name != program {
			continue
		}
		if cmp, _ := version.Compare(f.Version, best); best == "" || cmp > 0 {
			best = f.Version
		}
	}
	if best == "" {
		return "", fmt.Errorf("%s: %w", program, ErrNotFound)
	}
	return best, nil
}

// Open opens the release file whose SHA-256 is sum (64 lower-case hex) and
// returns it with its description. The hash is the one taken when the file
// was last listed: a file altered in place without a change of size or
// modification time is served as it is now, so the reader must check the
// hash (the agent always does). The error wraps [ErrNotFound] when no file
// has that hash.
func (c *Catalog) Open(sum string) (*os.File, node.ReleaseFile, error) {
	all, err := c.List()
	if err != nil {
		return nil, node.ReleaseFile{}, err
	}
	for _, f := range all {
		if f.SHA256 == sum {
			file, err := os.Open(filepath.Join(c.dir, FileName(f)))
			if err != nil {
				return nil, node.ReleaseFile{}, fmt.Errorf("open release %s: %w", sum, err)
			}
			return file, f, nil
		}
	}
	return nil, node.ReleaseFile{}, fmt.Errorf("release %s: %w", sum, ErrNotFound)
}

// FileName is the name of f in a release directory:
// <program>-<version>-<os>-<arch>.
func FileName(f node.ReleaseFile) string {
	return strings.Join([]string{f.Name, f.Version, f.OS, f.Arch}, "-")
}

// ValidSum reports whether s is 64 lower-case hex digits.
func ValidSum(s string) bool {
	if len(s) != 64 || strings.ToLower(s) != s {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

func hashFile(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, fmt.Errorf("hash release: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, fmt.Errorf("hash release %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}
