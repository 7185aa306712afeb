package releases

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/internal/version"
)

// DownloadPrograms are the programs a new node's setup script may fetch from
// /downloads (docs/joining.md section 3): the agent and its node plugins.
var DownloadPrograms = []string{"berth-agent", "berth-plugin-process", "berth-plugin-containerd", "berth-plugin-nftables"}

// downloadArchs are the architectures a download may name.
var downloadArchs = []string{"amd64", "arm64"}

// WithShipped makes c also offer the binaries berthd was shipped with: the
// files of dir named after a program of [DownloadPrograms], as that program
// at this build's version for this process's OS and architecture. It returns
// c. An empty dir adds nothing.
func (c *Catalog) WithShipped(dir string) *Catalog {
	c.shipped = dir
	return c
}

// DownloadName is the name a setup script fetches program for linux/arch by:
// <program>-linux-<arch>.
func DownloadName(program, arch string) string { return program + "-linux-" + arch }

// Download returns the file served as /downloads/<name> (name as
// [DownloadName] makes it) and its description: the release directory's
// file of that program and platform at this build's version, else the
// shipped binary of this platform, else the release directory's newest
// version. The error wraps [ErrNotFound] when none exists or name is not a
// download name.
func (c *Catalog) Download(name string) (*os.File, node.ReleaseFile, error) {
	f, path, err := c.resolve(name)
	if err != nil {
		return nil, node.ReleaseFile{}, err
	}
	file, err := os.Open(path)
	if err != nil {
		return nil, node.ReleaseFile{}, fmt.Errorf("open download %s: %w", name, err)
	}
	return file, f, nil
}

// Sums returns the SHA256SUMS file of every download that exists, in
// sha256sum's format ("<hex>  <name>" a line), sorted by name.
func (c *Catalog) Sums() ([]byte, error) {
	var lines []string
	for _, p := range DownloadPrograms {
		for _, a := range downloadArchs {
			name := DownloadName(p, a)
			f, _, err := c.resolve(name)
			if err != nil {
				continue
			}
			lines = append(lines, f.SHA256+"  "+name+"\n")
		}
	}
	slices.Sort(lines)
	return []byte(strings.Join(lines, "")), nil
}

// resolve finds the file behind download name.
func (c *Catalog) resolve(name string) (node.ReleaseFile, string, error) {
	program, arch, ok := strings.Cut(name, "-linux-")
	if c == nil || !ok || !slices.Contains(DownloadPrograms, program) || !slices.Contains(downloadArchs, arch) {
		return node.ReleaseFile{}, "", fmt.Errorf("download %q: %w", name, ErrNotFound)
	}
	all, err := c.List()
	if err != nil {
		return node.ReleaseFile{}, "", err
	}
	var newest *node.ReleaseFile
	for i, f := range all {
		if f.Name != program || f.OS != "linux" || f.Arch != arch {
			continue
		}
		if cmp, err := version.Compare(f.Version, version.Version); err == nil && cmp == 0 {
			return f, filepath.Join(c.dir, FileName(f)), nil
		}
		newest = &all[i] // List sorts by version, oldest first
	}
	if c.shipped != "" && runtime.GOOS == "linux" && arch == runtime.GOARCH {
		path := filepath.Join(c.shipped, program)
		if f, ok, err := c.hashShipped(path); err != nil {
			return node.ReleaseFile{}, "", err
		} else if ok {
			f.Name, f.Version, f.OS, f.Arch = program, version.Version, "linux", arch
			return f, path, nil
		}
	}
	if newest != nil {
		return *newest, filepath.Join(c.dir, FileName(*newest)), nil
	}
	return node.ReleaseFile{}, "", fmt.Errorf("download %q: %w", name, ErrNotFound)
}

// hashShipped hashes the regular file at path once per (size, modification
// time); ok is false when there is none.
func (c *Catalog) hashShipped(path string) (node.ReleaseFile, bool, error) {
	info, err := os.Stat(path)
	if err != nil || !info.Mode().IsRegular() {
		return node.ReleaseFile{}, false, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if ce, ok := c.cache[path]; ok && ce.size == info.Size() && ce.modTime.Equal(info.ModTime()) {
		return ce.file, true, nil
	}
	sum, n, err := hashFile(path)
	if err != nil {
		return node.ReleaseFile{}, false, err
	}
	f := node.ReleaseFile{SHA256: sum, Size: n}
	c.cache[path] = entry{file: f, size: info.Size(), modTime: info.ModTime()}
	return f, true, nil
}
