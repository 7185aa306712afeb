package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"

	"github.com/berthhq/berth/internal/securefile"
)

// Credentials is a node's credential storage (docs/runner-protocol.md section 7). Load returns
// [ErrNoCredential] when nothing is stored.
type Credentials interface {
	Load(ctx context.Context) (Credential, error)
	Save(ctx context.Context, c Credential) error
	Clear(ctx context.Context) error
}

// Credential is what a node keeps: its id and its current credential (brn_).
type Credential struct {
	NodeID string `json:"node_id"`
	Token  string `json:"credential"`
}

// Errors of the credential stores.
var (
	// ErrNoCredential is returned by Load when nothing is stored.
	ErrNoCredential = errors.New("berth: no node credential stored")
	// ErrInsecureCredentials is returned by [FileCredentials] for a symlink, a non-regular file,
	// a file swapped since this store last wrote or read it (inode or path), a file owned by
	// another user, an oversized document, or a group- or world-accessible mode.
	ErrInsecureCredentials = errors.New("berth: credential file refused")
)

// MaxCredentialFileBytes bounds the credential document.
const MaxCredentialFileBytes = 16 << 10

// MemoryCredentials keeps the credential in memory: for tests and ephemeral nodes.
type MemoryCredentials struct {
	mu sync.Mutex
	c  *Credential
}

var _ Credentials = (*MemoryCredentials)(nil)

// Load implements [Credentials].
func (m *MemoryCredentials) Load(context.Context) (Credential, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.c == nil {
		return Credential{}, ErrNoCredential
	}
	return *m.c, nil
}

// Save implements [Credentials].
func (m *MemoryCredentials) Save(_ context.Context, c Credential) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.c = &c
	return nil
}

// Clear implements [Credentials].
func (m *MemoryCredentials) Clear(context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.c = nil
	return nil
}

// FileCredentials keeps the credential in one owner-only 0600 JSON file, replaced atomically. It
// serialises updates within one process; use one file per agent process (it is not a
// cross-process lock). Refusals wrap [ErrInsecureCredentials].
type FileCredentials struct {
	path string
	mu   sync.Mutex
	// known is the (device, inode) of the file as this store last wrote or read it; zero until then.
	dev, ino uint64
}

var _ Credentials = (*FileCredentials)(nil)

// NewFileCredentials returns a store of the credential file at path. It does no I/O.
func NewFileCredentials(path string) *FileCredentials { return &FileCredentials{path: path} }

// check refuses what the store must not trust at path: a symlink, a non-regular file, another
// owner, a group- or world-accessible mode, an oversized file, or an inode other than the one
// this store knows. It returns the file's identity; exists is false for a missing file.
func (f *FileCredentials) check() (dev, ino uint64, exists bool, err error) {
	fi, err := os.Lstat(f.path)
	if errors.Is(err, os.ErrNotExist) {
		if f.ino != 0 {
			return 0, 0, false, fmt.Errorf("runner: credentials %s: the file this store wrote is gone: %w", f.path, ErrInsecureCredentials)
		}
		return 0, 0, false, nil
	}
	if err != nil {
		return 0, 0, false, fmt.Errorf("runner: credentials %s: %w", f.path, err)
	}
	refuse := func(why string) (uint64, uint64, bool, error) {
		return 0, 0, true, fmt.Errorf("runner: credentials %s: %s: %w", f.path, why, ErrInsecureCredentials)
	}
	if fi.Mode()&os.ModeSymlink != 0 {
		return refuse("is a symbolic link")
	}
	if !fi.Mode().IsRegular() {
		return refuse("not a regular file")
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return refuse("cannot read its owner")
	}
	if int(st.Uid) != os.Geteuid() {
		return refuse(fmt.Sprintf("owned by uid %d, not %d", st.Uid, os.Geteuid()))
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return refuse(fmt.Sprintf("mode %v is open to group or others, want 0600", fi.Mode().Perm()))
	}
	if fi.Size() > MaxCredentialFileBytes {
		return refuse(fmt.Sprintf("%d bytes, more than %d", fi.Size(), MaxCredentialFileBytes))
	}
	if f.ino != 0 && (uint64(st.Dev) != f.dev || st.Ino != f.ino) {
		return refuse("replaced by another file since this store last used it")
	}
	return uint64(st.Dev), st.Ino, true, nil
}

// Load implements [Credentials]: it checks the path, reads the file through
// [securefile.ReadFile] (no symlink followed) and checks that the file it read is the one at the
// path (no swap between the two).
func (f *FileCredentials) Load(context.Context) (Credential, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	dev, ino, exists, err := f.check()
	if err != nil {
		return Credential{}, err
	}
	if !exists {
		return Credential{}, ErrNoCredential
	}
	data, err := securefile.ReadFile(f.path)
	if err != nil {
		if errors.Is(err, securefile.ErrInsecure) {
			return Credential{}, fmt.Errorf("runner: credentials: %w: %w", ErrInsecureCredentials, err)
		}
		return Credential{}, fmt.Errorf("runner: credentials: %w", err)
	}
	if len(data) > MaxCredentialFileBytes {
		return Credential{}, fmt.Errorf("runner: credentials %s: oversized: %w", f.path, ErrInsecureCredentials)
	}
	if d2, i2, _, err := f.check(); err != nil || d2 != dev || i2 != ino {
		return Credential{}, fmt.Errorf("runner: credentials %s: swapped while read: %w", f.path, ErrInsecureCredentials)
	}
	var c Credential
	if err := json.Unmarshal(data, &c); err != nil || c.NodeID == "" || c.Token == "" {
		return Credential{}, fmt.Errorf("runner: credentials %s: not a credential document", f.path)
	}
	f.dev, f.ino = dev, ino
	return c, nil
}

// Save implements [Credentials]: it refuses to replace a file it would refuse to read, then
// writes the document owner-only and atomically ([securefile.WriteFile]) and remembers its inode.
func (f *FileCredentials) Save(_ context.Context, c Credential) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, _, _, err := f.check(); err != nil {
		return err
	}
	data, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("runner: credentials: %w", err)
	}
	if err := securefile.WriteFile(f.path, data); err != nil {
		return fmt.Errorf("runner: credentials: %w", err)
	}
	f.dev, f.ino = 0, 0
	dev, ino, _, err := f.check()
	if err != nil {
		return err
	}
	f.dev, f.ino = dev, ino
	return nil
}

// Clear implements [Credentials]: it removes the file (a missing file is success).
func (f *FileCredentials) Clear(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, _, _, err := f.check(); err != nil {
		return err
	}
	if err := os.Remove(f.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("runner: credentials: %w", err)
	}
	f.dev, f.ino = 0, 0
	return nil
}
