package blobs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// tmpDir is the directory under the root where Puts are received; it is
// never listed and never a key (keys cannot start with a dot segment of
// this name: see [ValidKey] and the check in [FS.path]).
const tmpDir = ".incoming"

// FS is a [Store] on a local directory: key "a/b" is the file Root/a/b.
// A Put writes a temporary file under Root/.incoming, fsyncs it and renames it
// into place (then fsyncs the directory), so no partial object is ever
// visible and a crash leaves at most an orphaned temporary file, which
// [NewFS] removes.
type FS struct {
	root string
}

var _ Store = (*FS)(nil)

// NewFS returns a Store rooted at dir, creating it (0700) when missing and
// removing temporary files a stopped process left behind.
func NewFS(dir string) (*FS, error) {
	if err := os.MkdirAll(filepath.Join(dir, tmpDir), 0o700); err != nil {
		return nil, fmt.Errorf("blob store %s: %w", dir, err)
	}
	ents, err := os.ReadDir(filepath.Join(dir, tmpDir))
	if err != nil {
		return nil, fmt.Errorf("blob store %s: %w", dir, err)
	}
	for _, e := range ents {
		_ = os.Remove(filepath.Join(dir, tmpDir, e.Name()))
	}
	return &FS{root: dir}, nil
}

// Root is the directory the store writes under.
func (s *FS) Root() string { return s.root }

func (s *FS) path(key string) (string, error) {
	if !ValidKey(key) || key == tmpDir || strings.HasPrefix(key, tmpDir+"/") {
		return "", fmt.Errorf("%w: %q", ErrBadKey, key)
	}
	return filepath.Join(s.root, filepath.FromSlash(key)), nil
}

// Put implements [Store.Put].
func (s *FS) Put(ctx context.Context, key string, r io.Reader, opt PutOptions) (Info, error) {
	dst, err := s.path(key)
	if err != nil {
		return Info{}, err
	}
	cr, err := newCheckingReader(r, opt)
	if err != nil {
		return Info{}, err
	}
	tmp, err := os.CreateTemp(filepath.Join(s.root, tmpDir), "put-*")
	if err != nil {
		return Info{}, fmt.Errorf("put %s: %w", key, err)
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	if _, err := io.Copy(tmp, ctxReader{ctx, cr}); err != nil {
		return Info{}, fmt.Errorf("put %s: %w", key, err)
	}
	digest, n, err := cr.done()
	if err != nil {
		return Info{}, fmt.Errorf("put %s: %w", key, err)
	}
	if err := tmp.Sync(); err != nil {
		return Info{}, fmt.Errorf("put %s: %w", key, err)
	}
	if err := tmp.Close(); err != nil {
		return Info{}, fmt.Errorf("put %s: %w", key, err)
	}
	if err := ctx.Err(); err != nil {
		return Info{}, fmt.Errorf("put %s: %w", key, err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return Info{}, fmt.Errorf("put %s: %w", key, err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return Info{}, fmt.Errorf("put %s: %w", key, err)
	}
	if d, err := os.Open(filepath.Dir(dst)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	st, err := os.Stat(dst)
	if err != nil {
		return Info{}, fmt.Errorf("put %s: %w", key, err)
	}
	return Info{Key: key, Size: n, SHA256: digest, ModTime: st.ModTime().UTC()}, nil
}

// Get implements [Store.Get].
func (s *FS) Get(ctx context.Context, key string, off, length int64) (io.ReadCloser, Info, error) {
	p, err := s.path(key)
	if err != nil {
		return nil, Info{}, err
	}
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, Info{}, fmt.Errorf("get %s: %w", key, ErrNotFound)
	}
	if err != nil {
		return nil, Info{}, fmt.Errorf("get %s: %w", key, err)
	}
	st, err := f.Stat()
	if err == nil && !st.Mode().IsRegular() {
		err = ErrNotFound
	}
	if err != nil {
		f.Close()
		return nil, Info{}, fmt.Errorf("get %s: %w", key, err)
	}
	info := Info{Key: key, Size: st.Size(), ModTime: st.ModTime().UTC()}
	if off < 0 {
		off = 0
	}
	if off > 0 {
		if _, err := f.Seek(off, io.SeekStart); err != nil {
			f.Close()
			return nil, Info{}, fmt.Errorf("get %s: %w", key, err)
		}
	}
	if length < 0 {
		return f, info, nil
	}
	return struct {
		io.Reader
		io.Closer
	}{io.LimitReader(f, length), f}, info, nil
}

// Stat implements [Store.Stat].
func (s *FS) Stat(ctx context.Context, key string) (Info, error) {
	p, err := s.path(key)
	if err != nil {
		return Info{}, err
	}
	st, err := os.Stat(p)
	if errors.Is(err, fs.ErrNotExist) || (err == nil && !st.Mode().IsRegular()) {
		return Info{}, fmt.Errorf("stat %s: %w", key, ErrNotFound)
	}
	if err != nil {
		return Info{}, fmt.Errorf("stat %s: %w", key, err)
	}
	return Info{Key: key, Size: st.Size(), ModTime: st.ModTime().UTC()}, nil
}

// Delete implements [Store.Delete].
func (s *FS) Delete(ctx context.Context, key string) error {
	p, err := s.path(key)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	return nil
}

// List implements [Store.List].
func (s *FS) List(ctx context.Context, prefix string, fn func(Info) error) error {
	var out []Info
	err := filepath.WalkDir(s.root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		rel, _ := filepath.Rel(s.root, p)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel == tmpDir {
				return filepath.SkipDir
			}
			// Skip directories that cannot hold a key with the prefix.
			if rel != "." && !strings.HasPrefix(rel+"/", prefix) && !strings.HasPrefix(prefix, rel+"/") {
				return filepath.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() || !strings.HasPrefix(rel, prefix) {
			return nil
		}
		st, err := d.Info()
		if err != nil {
			return nil // removed meanwhile
		}
		out = append(out, Info{Key: rel, Size: st.Size(), ModTime: st.ModTime().UTC()})
		return ctx.Err()
	})
	if err != nil {
		return fmt.Errorf("list %q: %w", prefix, err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	for _, in := range out {
		if err := fn(in); err != nil {
			return err
		}
	}
	return nil
}

// ctxReader stops a copy when ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
