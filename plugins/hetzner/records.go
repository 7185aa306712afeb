package hetzner

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
)

// records keeps, per machine, the attributes the API does not return
// (SSH keys, firewall, placement group, user data) as last applied, so that
// Read reports the state Apply produced. With a directory they are files
// (0600, written atomically) that survive a restart; otherwise memory.
// Safe for concurrent use.
type records struct {
	dir string // "" keeps them in memory

	mu  sync.Mutex
	mem map[string]createOnly // mu must be held
}

func openRecords(stateDir string) (*records, error) {
	r := &records{mem: map[string]createOnly{}}
	if stateDir == "" {
		return r, nil
	}
	r.dir = filepath.Join(stateDir, "machines")
	if err := os.MkdirAll(r.dir, 0o700); err != nil {
		return nil, fmt.Errorf("hetzner state directory: %w", err)
	}
	return r, nil
}

func (r *records) path(id string) string { return filepath.Join(r.dir, id+".json") }

// get returns machine id's record and whether there is one.
func (r *records) get(id string) (createOnly, bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c, ok := r.mem[id]; ok || r.dir == "" {
		return c, ok, nil
	}
	raw, err := os.ReadFile(r.path(id))
	if errors.Is(err, os.ErrNotExist) {
		return createOnly{}, false, nil
	}
	if err != nil {
		return createOnly{}, false, fmt.Errorf("hetzner: read the record of machine %s: %w", id, err)
	}
	var c createOnly
	if err := json.Unmarshal(raw, &c); err != nil {
		return createOnly{}, false, fmt.Errorf("hetzner: the record of machine %s is damaged: %w", id, err)
	}
	r.mem[id] = c
	return c, true, nil
}

// put records c for machine id.
func (r *records) put(id string, c createOnly) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.dir != "" {
		raw, _ := json.Marshal(c) // plain struct: cannot fail
		tmp, err := os.CreateTemp(r.dir, id+".*.tmp")
		if err != nil {
			return fmt.Errorf("hetzner: record machine %s: %w", id, err)
		}
		_, werr := tmp.Write(raw)
		serr := tmp.Sync()
		cerr := tmp.Close()
		if err := errors.Join(werr, serr, cerr); err != nil {
			_ = os.Remove(tmp.Name())
			return fmt.Errorf("hetzner: record machine %s: %w", id, err)
		}
		if err := os.Rename(tmp.Name(), r.path(id)); err != nil {
			_ = os.Remove(tmp.Name())
			return fmt.Errorf("hetzner: record machine %s: %w", id, err)
		}
	}
	r.mem[id] = c
	return nil
}

// drop forgets machine id's record.
func (r *records) drop(id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.mem, id)
	if r.dir == "" {
		return nil
	}
	if err := os.Remove(r.path(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("hetzner: drop the record of machine %s: %w", id, err)
	}
	return nil
}
