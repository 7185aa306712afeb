package plugin

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"

	"github.com/berthhq/berth/abi/pluginapi"
)

// CatalogFile is the name of the plugin catalog in a plugin directory
// (docs/plugins.md section 2.1).
const CatalogFile = "plugins.json"

// ErrNoCatalog is returned (wrapped) by LoadCatalog when the directory holds
// no catalog file; it also matches os.ErrNotExist.
var ErrNoCatalog = fmt.Errorf("berth: no %s in the plugin directory: %w", CatalogFile, os.ErrNotExist)

// Entry is one plugin of a catalog.
type Entry struct {
	// Name is the plugin's name, a DNS label, unique in the catalog.
	Name string `json:"name"`
	// Kind is "provider" or "runtime".
	Kind pluginapi.Kind `json:"kind"`
	// Path is the binary, relative to the catalog's directory unless absolute.
	Path string `json:"path"`
	// SHA256 is the binary's hex SHA-256, checked before every launch. Required.
	SHA256 string `json:"sha256"`
	// Args are passed to the binary.
	Args []string `json:"args,omitempty"`
	// Config is the plugin's own configuration (a JSON object), given to a
	// provider's ValidateConfig and Configure.
	Config json.RawMessage `json:"config,omitempty"`
}

// Catalog is the parsed plugins.json of a plugin directory:
//
//	{"plugins": [{"name": "gateway", "kind": "provider", "path": "berth-plugin-gateway",
//	              "sha256": "9f86d0...", "config": {}}]}
type Catalog struct {
	Dir     string  `json:"-"` // absolute directory of the file
	Plugins []Entry `json:"plugins"`
}

var labelRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// LoadCatalog reads dir/plugins.json. It returns an error wrapping
// ErrNoCatalog when the file is absent, and a descriptive error for a file
// that does not parse or an entry without a valid name, kind, path or
// SHA-256, or a duplicate name. Paths come back absolute.
func LoadCatalog(dir string) (*Catalog, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("plugin catalog: %w", err)
	}
	raw, err := os.ReadFile(filepath.Join(abs, CatalogFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("plugin catalog in %s: %w", abs, ErrNoCatalog)
	}
	if err != nil {
		return nil, fmt.Errorf("plugin catalog: %w", err)
	}
	c := &Catalog{Dir: abs}
	if err := json.Unmarshal(raw, c); err != nil {
		return nil, fmt.Errorf("plugin catalog %s: %w", filepath.Join(abs, CatalogFile), err)
	}
	seen := map[string]bool{}
	for i := range c.Plugins {
		e := &c.Plugins[i]
		if err := e.validate(); err != nil {
			return nil, fmt.Errorf("plugin catalog %s: entry %d: %w", filepath.Join(abs, CatalogFile), i, err)
		}
		if seen[e.Name] {
			return nil, fmt.Errorf("plugin catalog %s: duplicate plugin %q", filepath.Join(abs, CatalogFile), e.Name)
		}
		seen[e.Name] = true
		if !filepath.IsAbs(e.Path) {
			e.Path = filepath.Join(abs, e.Path)
		}
	}
	return c, nil
}

func (e Entry) validate() error {
	if !labelRE.MatchString(e.Name) {
		return fmt.Errorf("name %q is not a DNS label", e.Name)
	}
	if e.Kind != pluginapi.KindProvider && e.Kind != pluginapi.KindRuntime && e.Kind != pluginapi.KindNetwork {
		return fmt.Errorf("plugin %s: kind %q: want provider, runtime or network", e.Name, e.Kind)
	}
	if e.Path == "" {
		return fmt.Errorf("plugin %s: no path", e.Name)
	}
	if sum, err := hex.DecodeString(e.SHA256); err != nil || len(sum) != 32 {
		return fmt.Errorf("plugin %s: sha256 %q is not a hex SHA-256", e.Name, e.SHA256)
	}
	if len(e.Config) > 0 {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(e.Config, &obj); err != nil {
			return fmt.Errorf("plugin %s: config is not a JSON object", e.Name)
		}
	}
	return nil
}

// Lookup returns the entry named name and whether there is one.
func (c *Catalog) Lookup(name string) (Entry, bool) {
	for _, e := range c.Plugins {
		if e.Name == name {
			return e, true
		}
	}
	return Entry{}, false
}

// PinEntry returns an entry for the binary dir/berth-plugin-<name> with the
// SHA-256 it has now, for hosts started without a catalog: the binary is then
// trusted as found at start, and any later change to it is refused before a
// relaunch. It fails when the binary cannot be read.
func PinEntry(dir, name string, kind pluginapi.Kind) (Entry, error) {
	path, err := filepath.Abs(filepath.Join(dir, "berth-plugin-"+name))
	if err != nil {
		return Entry{}, fmt.Errorf("plugin %s: %w", name, err)
	}
	sum, err := fileSHA256(path)
	if err != nil {
		return Entry{}, fmt.Errorf("plugin %s: hash binary: %w", name, err)
	}
	return Entry{Name: name, Kind: kind, Path: path, SHA256: hex.EncodeToString(sum)}, nil
}

// Apply returns base with the entry's name, path, checksum, arguments
// (appended to base.Args) and configuration filled in.
func (e Entry) Apply(base Config) Config {
	base.Name, base.Path, base.SHA256 = e.Name, e.Path, e.SHA256
	base.Args = append(append([]string(nil), e.Args...), base.Args...)
	base.PluginConfig = e.Config
	return base
}

// Resolve returns the catalog entry of the plugin name of kind in dir: from
// dir/plugins.json when there is one (an entry of another kind is an error),
// otherwise pinned from dir/berth-plugin-<name> as found now ([PinEntry]).
func Resolve(dir, name string, kind pluginapi.Kind) (Entry, error) {
	c, err := LoadCatalog(dir)
	if errors.Is(err, ErrNoCatalog) {
		return PinEntry(dir, name, kind)
	}
	if err != nil {
		return Entry{}, err
	}
	e, ok := c.Lookup(name)
	if !ok {
		return Entry{}, fmt.Errorf("plugin catalog %s: no plugin %q", filepath.Join(c.Dir, CatalogFile), name)
	}
	if e.Kind != kind {
		return Entry{}, fmt.Errorf("plugin catalog %s: plugin %q is a %s, want a %s", filepath.Join(c.Dir, CatalogFile), name, e.Kind, kind)
	}
	return e, nil
}

// ResolveDriver is Resolve for a runtime driver.
func ResolveDriver(dir, name string) (Entry, error) { return Resolve(dir, name, pluginapi.KindRuntime) }

// ResolveProvider is Resolve for a provider.
func ResolveProvider(dir, name string) (Entry, error) {
	return Resolve(dir, name, pluginapi.KindProvider)
}
