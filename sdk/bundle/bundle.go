// Package bundle reads and writes release bundles: gzip-compressed tar archives,
// content-addressed by the SHA-256 of the compressed bytes (docs/api.md "Bundles").
package bundle

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"
)

// ErrInvalid is wrapped by Validate and Extract for an archive that is not a
// gzip tar, or that holds an absolute path, a path escaping its root, a link
// pointing out of it, or an entry type other than file, directory or symlink.
var ErrInvalid = errors.New("berth: invalid bundle")

// ErrTooLarge is wrapped when the archive's expanded size passes the limit.
var ErrTooLarge = errors.New("berth: bundle too large")

const (
	// defaultMaxExpanded is the expanded-size bound when the caller passes zero.
	defaultMaxExpanded int64 = 4 << 30
	// maxEntries bounds the number of entries of one archive, so a stream of
	// empty headers cannot grow the bookkeeping without bound.
	maxEntries = 1 << 20
	// entryCost is what each entry counts against the expanded-size bound, on
	// top of its content: the metadata it creates on disk.
	entryCost = 512
	// maxLinkHops bounds symlink resolution, as the kernel's ELOOP does.
	maxLinkHops = 40
)

// Create writes a tar.gz of the directory dir (or of the single file dir) to w,
// with sorted entries and zeroed timestamps and owners, so the same tree gives
// the same digest. It returns the digest "sha256:<hex>" and the size in bytes.
//
// Regular files keep whether they are executable (mode 0755 or 0644),
// directories are 0755, and symlinks are stored as links; a symlink whose target
// would resolve outside dir, and any other file type (socket, device, fifo), is
// refused with an error wrapping ErrInvalid. A single file is stored under its
// base name. On error w may hold a partial archive: the caller discards it.
// The size is the number of compressed bytes written to w.
func Create(ctx context.Context, dir string, w io.Writer) (digest string, size int64, err error) {
	info, err := os.Stat(dir)
	if err != nil {
		return "", 0, fmt.Errorf("create bundle: %w", err)
	}
	h := sha256.New()
	cw := &countWriter{}
	zw, err := gzip.NewWriterLevel(io.MultiWriter(w, h, cw), gzip.BestCompression)
	if err != nil {
		return "", 0, fmt.Errorf("create bundle: %w", err)
	}
	tw := tar.NewWriter(zw)

	if info.Mode().IsRegular() {
		if err := writeFile(ctx, tw, dir, filepath.Base(dir), info); err != nil {
			return "", 0, fmt.Errorf("create bundle of %s: %w", dir, err)
		}
	} else if info.IsDir() {
		if err := writeTree(ctx, tw, dir); err != nil {
			return "", 0, fmt.Errorf("create bundle of %s: %w", dir, err)
		}
	} else {
		return "", 0, fmt.Errorf("create bundle of %s: not a directory or regular file: %w", dir, ErrInvalid)
	}

	if err := tw.Close(); err != nil {
		return "", 0, fmt.Errorf("create bundle: close tar: %w", err)
	}
	if err := zw.Close(); err != nil {
		return "", 0, fmt.Errorf("create bundle: close gzip: %w", err)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), cw.n, nil
}

// writeTree adds every entry under root to tw, in lexical order.
func writeTree(ctx context.Context, tw *tar.Writer, root string) error {
	t := newTree()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, walkErr error) error {
		if walkErr != nil {
			return walkErr
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		if rel == "." {
			return nil
		}
		name := filepath.ToSlash(rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case info.Mode().IsRegular():
			if err := t.add(name, kindFile, ""); err != nil {
				return err
			}
			return writeFile(ctx, tw, p, name, info)
		case info.IsDir():
			if err := t.add(name, kindDir, ""); err != nil {
				return err
			}
			return tw.WriteHeader(normalHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: 0o755}))
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			target = filepath.ToSlash(target)
			if err := t.add(name, kindSymlink, target); err != nil {
				return err
			}
			return tw.WriteHeader(normalHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777}))
		default:
			return fmt.Errorf("%s: unsupported file type %s: %w", name, info.Mode().Type(), ErrInvalid)
		}
	})
	if err != nil {
		return err
	}
	return t.checkLinks()
}

// writeFile adds the regular file at p to tw as name.
func writeFile(ctx context.Context, tw *tar.Writer, p, name string, info fs.FileInfo) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	hdr := normalHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: fileMode(int64(info.Mode().Perm())), Size: info.Size()})
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	n, err := io.Copy(tw, ctxReader{ctx: ctx, r: f})
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if n != info.Size() {
		return fmt.Errorf("%s: file changed size while being read", name)
	}
	return nil
}

// normalHeader zeroes everything that would make two archives of one tree differ.
func normalHeader(h *tar.Header) *tar.Header {
	h.ModTime = time.Unix(0, 0)
	h.Format = tar.FormatPAX
	return h
}

// fileMode is 0755 for a file with any execute bit and 0644 otherwise.
func fileMode(m int64) int64 {
	if m&0o111 != 0 {
		return 0o755
	}
	return 0o644
}

// Validate reads a whole tar.gz from r and checks every entry as Extract would,
// without writing anything. maxExpanded bounds the total expanded bytes (zero
// means 4 GiB).
func Validate(ctx context.Context, r io.Reader, maxExpanded int64) error {
	err := walk(ctx, r, maxExpanded, func(name string, hdr *tar.Header, _ io.Reader) error { return nil })
	if err != nil {
		return fmt.Errorf("validate bundle: %w", err)
	}
	return nil
}

// Extract unpacks the tar.gz from r into dir, which must exist and be empty.
// It refuses (ErrInvalid) absolute paths, "..", symlinks whose target resolves
// outside dir, hard links, devices and fifos; nothing outside dir is ever
// written. On error dir may hold a partial tree: the caller removes it.
func Extract(ctx context.Context, r io.Reader, dir string, maxExpanded int64) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("extract bundle: %w", err)
	}
	if len(entries) != 0 {
		return fmt.Errorf("extract bundle: %s is not empty", dir)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("extract bundle: %w", err)
	}
	defer root.Close()

	var links [][2]string // target, name
	err = walk(ctx, r, maxExpanded, func(name string, hdr *tar.Header, body io.Reader) error {
		native := filepath.FromSlash(name)
		if parent := path.Dir(name); parent != "." {
			if err := root.MkdirAll(filepath.FromSlash(parent), 0o755); err != nil {
				return err
			}
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(native, 0o755); err != nil {
				return err
			}
			return root.Chmod(native, 0o755)
		case tar.TypeSymlink:
			// Links are made last, once the whole tree is checked: a later
			// link can change where an earlier one resolves.
			links = append(links, [2]string{hdr.Linkname, native})
			return nil
		default:
			mode := fs.FileMode(fileMode(hdr.Mode))
			f, err := root.OpenFile(native, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
			if err != nil {
				return err
			}
			if _, err := io.Copy(f, body); err != nil {
				f.Close()
				return err
			}
			if err := f.Close(); err != nil {
				return err
			}
			// The umask may have cleared bits of mode; the bundle decides.
			return root.Chmod(native, mode)
		}
	})
	if err != nil {
		return fmt.Errorf("extract bundle into %s: %w", dir, err)
	}
	for _, l := range links {
		if err := root.Symlink(l[0], l[1]); err != nil {
			return fmt.Errorf("extract bundle into %s: %w", dir, err)
		}
	}
	return nil
}

// walk reads the tar.gz from r, checks every entry against the rules of
// Extract and calls fn for each accepted file, directory and symlink with its
// cleaned slash-separated name. body reads a regular file's content. After the
// last entry it checks the whole tree's symlinks again, since a later link can
// change where an earlier one resolves.
func walk(ctx context.Context, r io.Reader, maxExpanded int64, fn func(name string, hdr *tar.Header, body io.Reader) error) error {
	if maxExpanded <= 0 {
		maxExpanded = defaultMaxExpanded
	}
	zr, err := gzip.NewReader(ctxReader{ctx: ctx, r: r})
	if err != nil {
		return fmt.Errorf("not gzip: %w: %w", ErrInvalid, err)
	}
	defer zr.Close()
	tr := tar.NewReader(zr)
	t := newTree()
	var expanded int64
	for n := 0; ; n++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if ctxErr := ctx.Err(); ctxErr != nil {
				return ctxErr
			}
			return fmt.Errorf("read tar: %w: %w", ErrInvalid, err)
		}
		if n >= maxEntries {
			return fmt.Errorf("more than %d entries: %w", maxEntries, ErrTooLarge)
		}
		if hdr.Typeflag == tar.TypeXGlobalHeader {
			continue // archive-wide metadata (git archive writes one), not an entry
		}
		name, err := cleanName(hdr.Name)
		if err != nil {
			return err
		}
		if hdr.Size < 0 {
			return fmt.Errorf("%q: negative size: %w", hdr.Name, ErrInvalid)
		}
		// Every entry's payload counts, even where it is skipped (a directory
		// with a size): the bytes are still decompressed.
		expanded += entryCost + hdr.Size
		var k kind
		switch hdr.Typeflag {
		case tar.TypeReg: // the reader reports the old TypeRegA as TypeReg
			k = kindFile
		case tar.TypeDir:
			k = kindDir
		case tar.TypeSymlink:
			k = kindSymlink
		case tar.TypeLink:
			return fmt.Errorf("%q: hard links are not allowed: %w", hdr.Name, ErrInvalid)
		case tar.TypeChar, tar.TypeBlock:
			return fmt.Errorf("%q: device files are not allowed: %w", hdr.Name, ErrInvalid)
		case tar.TypeFifo:
			return fmt.Errorf("%q: fifos are not allowed: %w", hdr.Name, ErrInvalid)
		default:
			return fmt.Errorf("%q: entry type %q is not allowed: %w", hdr.Name, hdr.Typeflag, ErrInvalid)
		}
		if expanded > maxExpanded {
			return fmt.Errorf("expanded size passes %d bytes: %w", maxExpanded, ErrTooLarge)
		}
		if name == "." {
			if k != kindDir {
				return fmt.Errorf("%q: the root must be a directory: %w", hdr.Name, ErrInvalid)
			}
			continue
		}
		if err := t.add(name, k, hdr.Linkname); err != nil {
			return err
		}
		if err := fn(name, hdr, invalidOnError{tr}); err != nil {
			if ctxErr := ctx.Err(); ctxErr != nil {
				return ctxErr
			}
			return fmt.Errorf("%q: %w", name, err)
		}
	}
	if err := t.checkLinks(); err != nil {
		return err
	}
	// Read to the end of the gzip stream so its checksum is verified, but no
	// further than the remaining budget: trailing data is not free.
	rest, err := io.Copy(io.Discard, io.LimitReader(zr, maxExpanded-expanded+1))
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return ctxErr
		}
		return fmt.Errorf("read gzip: %w: %w", ErrInvalid, err)
	}
	if expanded+rest > maxExpanded {
		return fmt.Errorf("expanded size passes %d bytes: %w", maxExpanded, ErrTooLarge)
	}
	return nil
}

// cleanName returns the slash-separated, cleaned form of a tar entry name, or
// an error wrapping ErrInvalid when it is absolute or climbs out of the root.
func cleanName(raw string) (string, error) {
	if raw == "" {
		return "", fmt.Errorf("empty entry name: %w", ErrInvalid)
	}
	if strings.ContainsAny(raw, "\x00\\") {
		return "", fmt.Errorf("%q: name holds a NUL or backslash: %w", raw, ErrInvalid)
	}
	if strings.HasPrefix(raw, "/") || filepath.IsAbs(raw) || filepath.VolumeName(raw) != "" {
		return "", fmt.Errorf("%q: absolute path: %w", raw, ErrInvalid)
	}
	for _, part := range strings.Split(raw, "/") {
		if part == ".." {
			return "", fmt.Errorf("%q: path climbs out with \"..\": %w", raw, ErrInvalid)
		}
	}
	return path.Clean(raw), nil
}

// kind is what a name in the archive is.
type kind int

const (
	kindImplicitDir kind = iota + 1 // a parent of an entry, not listed itself (yet)
	kindDir
	kindFile
	kindSymlink
)

// tree is the archive's namespace as seen so far: enough to resolve symlinks
// the way the file system will once the archive is unpacked.
type tree struct {
	kinds   map[string]kind
	targets map[string]string
}

func newTree() *tree {
	return &tree{kinds: map[string]kind{}, targets: map[string]string{}}
}

// add records the entry name (cleaned, relative). It refuses a duplicate name,
// a name under a file or a symlink (writing through a link is never needed to
// build a tree), and a symlink whose target does not resolve inside the root.
func (t *tree) add(name string, k kind, target string) error {
	parts := strings.Split(name, "/")
	for i := 1; i < len(parts); i++ {
		prefix := strings.Join(parts[:i], "/")
		switch t.kinds[prefix] {
		case 0:
			t.kinds[prefix] = kindImplicitDir
		case kindFile:
			return fmt.Errorf("%q: parent %q is a file: %w", name, prefix, ErrInvalid)
		case kindSymlink:
			return fmt.Errorf("%q: parent %q is a symlink: %w", name, prefix, ErrInvalid)
		}
	}
	switch prev := t.kinds[name]; {
	case prev == kindImplicitDir && k == kindDir:
	case prev != 0:
		return fmt.Errorf("%q: duplicate or conflicting entry: %w", name, ErrInvalid)
	}
	t.kinds[name] = k
	if k == kindSymlink {
		t.targets[name] = target
		if err := t.checkLink(name); err != nil {
			return err
		}
	}
	return nil
}

// checkLinks checks every symlink against the final tree.
func (t *tree) checkLinks() error {
	for name := range t.targets {
		if err := t.checkLink(name); err != nil {
			return err
		}
	}
	return nil
}

// checkLink resolves the symlink name through the tree, following every link
// on the way, and refuses it when it leaves the root at any step.
func (t *tree) checkLink(name string) error {
	target := t.targets[name]
	if target == "" {
		return fmt.Errorf("%q: empty symlink target: %w", name, ErrInvalid)
	}
	if strings.ContainsAny(target, "\x00\\") {
		return fmt.Errorf("%q: symlink target holds a NUL or backslash: %w", name, ErrInvalid)
	}
	if strings.HasPrefix(target, "/") || filepath.IsAbs(target) || filepath.VolumeName(target) != "" {
		return fmt.Errorf("%q: absolute symlink target %q: %w", name, target, ErrInvalid)
	}
	var cur []string
	if dir := path.Dir(name); dir != "." {
		cur = strings.Split(dir, "/")
	}
	queue := strings.Split(target, "/")
	hops := 0
	for len(queue) > 0 {
		part := queue[0]
		queue = queue[1:]
		switch part {
		case "", ".":
			continue
		case "..":
			if len(cur) == 0 {
				return fmt.Errorf("%q: symlink target %q resolves outside the root: %w", name, target, ErrInvalid)
			}
			cur = cur[:len(cur)-1]
			continue
		}
		next := strings.Join(append(append([]string(nil), cur...), part), "/")
		if t.kinds[next] != kindSymlink {
			cur = append(cur, part)
			continue
		}
		hops++
		if hops > maxLinkHops {
			return fmt.Errorf("%q: too many levels of symlinks: %w", name, ErrInvalid)
		}
		lt := t.targets[next]
		if strings.HasPrefix(lt, "/") || filepath.IsAbs(lt) {
			return fmt.Errorf("%q: symlink target %q resolves outside the root through %q: %w", name, target, next, ErrInvalid)
		}
		queue = append(strings.Split(lt, "/"), queue...)
	}
	return nil
}

// ctxReader fails reads once ctx is done, so a long copy stops on cancel.
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

// countWriter counts the bytes written through it.
type countWriter struct{ n int64 }

func (c *countWriter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return len(p), nil
}

// invalidOnError marks a failure to read an entry's content (a truncated or
// corrupt archive) as ErrInvalid, as the same failure in Validate is.
type invalidOnError struct{ r io.Reader }

func (b invalidOnError) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("read content: %w: %w", ErrInvalid, err)
	}
	return n, err
}
