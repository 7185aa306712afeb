// Package config reads a daemon's flags from a YAML file: one top-level key per
// flag, decoded strictly, with command-line flags and BERTH_* variables on top.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
	"gopkg.in/yaml.v3"

	abierrors "github.com/berthhq/berth/abi/errors"
)

// MaxFileBytes bounds a configuration file (1 MiB); a larger one is refused.
const MaxFileBytes = 1 << 20

// EnvPrefix starts the environment variable of every flag: --data-dir is BERTH_DATA_DIR.
const EnvPrefix = "BERTH_"

// KeyError is a refused key of a configuration file: unknown, repeated, not a
// scalar, or a value the flag does not accept. File and Line locate it (Line
// is 1-based; 0 when the error concerns the whole file); Key is empty then too.
type KeyError struct {
	File string
	Line int
	Key  string
	Err  error
}

// Error reports "FILE:LINE: key \"KEY\": cause".
func (e *KeyError) Error() string {
	switch {
	case e.Key != "":
		return fmt.Sprintf("%s:%d: key %q: %v", e.File, e.Line, e.Key, e.Err)
	case e.Line > 0:
		return fmt.Sprintf("%s:%d: %v", e.File, e.Line, e.Err)
	}
	return fmt.Sprintf("%s: %v", e.File, e.Err)
}

// Unwrap returns the cause.
func (e *KeyError) Unwrap() error { return e.Err }

// ErrUnknownKey is the cause of a [KeyError] for a key that names no flag.
var ErrUnknownKey = errors.New("unknown key (not a berthd flag)")

// Source tells where a flag's effective value came from.
type Source string

// The sources of a flag value, strongest first.
const (
	FromFlag    Source = "flag"
	FromEnv     Source = "env"
	FromFile    Source = "file"
	FromDefault Source = "default"
)

// Options says what [Apply] reads besides the command line.
type Options struct {
	// File is the YAML file's path; empty reads no file.
	File string
	// Getenv looks up environment variables; nil reads none.
	Getenv func(string) string
	// Skip lists flag names that are never read from the file or the
	// environment (the --config flag itself, --help).
	Skip []string
}

// EnvName is the environment variable of flag name: BERTH_ and the name in
// upper case with dashes as underscores ("data-dir" is BERTH_DATA_DIR).
func EnvName(name string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// Apply sets every flag of fs that the command line left unset, first from its
// BERTH_* variable, then from the file's key of the same name; fs must be parsed
// already. It returns where each flag's value came from. Precedence is flag,
// environment, file, default.
//
// The file is a YAML mapping of flag names (as spelled after "--") to scalar
// values in the flag's own syntax (durations as "30s", sizes in bytes). An
// unknown key, a repeated key, a non-scalar or null value, or a value the flag
// refuses is an error naming the file, line and key; so is a file that is not a
// mapping or larger than [MaxFileBytes]. Every file error is an *abierrors.Error
// with code config_invalid wrapping a *[KeyError]; a bad environment value is one
// naming the variable. After an error fs may be partly set; do not use it.
// Restoring a command-line value after checking the file's goes through the
// flag's String form, which round-trips for scalar flags (the only kind a file
// can set).
func Apply(fs *pflag.FlagSet, opt Options) (map[string]Source, error) {
	skip := map[string]bool{}
	for _, s := range opt.Skip {
		skip[s] = true
	}
	var fileVals map[string]fileValue
	if opt.File != "" {
		var err error
		if fileVals, err = readFile(fs, opt.File, skip); err != nil {
			return nil, abierrors.Wrap(abierrors.ConfigInvalid, "invalid configuration", err)
		}
	}
	src := map[string]Source{}
	var errs []error
	fs.VisitAll(func(f *pflag.Flag) {
		src[f.Name] = FromDefault
		if skip[f.Name] {
			return
		}
		onCommandLine := f.Changed
		if onCommandLine {
			src[f.Name] = FromFlag
		}
		// A file value is checked even when the command line or the environment
		// overrides it, so `config check` finds every bad line.
		if fv, ok := fileVals[f.Name]; ok {
			old := f.Value.String()
			if err := fs.Set(f.Name, fv.value); err != nil {
				errs = append(errs, &KeyError{File: opt.File, Line: fv.line, Key: f.Name, Err: err})
				return
			}
			if onCommandLine {
				if err := fs.Set(f.Name, old); err != nil {
					errs = append(errs, fmt.Errorf("restore --%s: %w", f.Name, err))
				}
				return
			}
			src[f.Name] = FromFile
		}
		if onCommandLine || opt.Getenv == nil {
			return
		}
		if v := opt.Getenv(EnvName(f.Name)); v != "" {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", EnvName(f.Name), err))
				return
			}
			src[f.Name] = FromEnv
		}
	})
	if err := errors.Join(errs...); err != nil {
		return nil, abierrors.Wrap(abierrors.ConfigInvalid, "invalid configuration", err)
	}
	return src, nil
}

type fileValue struct {
	value string
	line  int
}

func readFile(fs *pflag.FlagSet, path string, skip map[string]bool) (map[string]fileValue, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, &KeyError{File: path, Err: err}
	}
	defer f.Close()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(io.LimitReader(f, MaxFileBytes+1)); err != nil {
		return nil, &KeyError{File: path, Err: err}
	}
	if buf.Len() > MaxFileBytes {
		return nil, &KeyError{File: path, Err: fmt.Errorf("larger than %d bytes", MaxFileBytes)}
	}
	var doc yaml.Node
	dec := yaml.NewDecoder(&buf)
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return map[string]fileValue{}, nil // an empty file sets nothing
		}
		return nil, &KeyError{File: path, Err: fmt.Errorf("not valid YAML: %w", err)}
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return nil, &KeyError{File: path, Line: extra.Line, Err: errors.New("more than one YAML document")}
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return map[string]fileValue{}, nil
	}
	if root.Kind != yaml.MappingNode {
		return nil, &KeyError{File: path, Line: root.Line, Err: errors.New("the file must be a mapping of flag names to values")}
	}
	out := map[string]fileValue{}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			return nil, &KeyError{File: path, Line: k.Line, Err: errors.New("a key must be a flag name")}
		}
		name := k.Value
		fl := fs.Lookup(name)
		if fl == nil || skip[name] {
			err := ErrUnknownKey
			if s := suggest(fs, name, skip); s != "" {
				err = fmt.Errorf("%w; did you mean %q?", ErrUnknownKey, s)
			}
			return nil, &KeyError{File: path, Line: k.Line, Key: name, Err: err}
		}
		if prev, dup := out[name]; dup {
			return nil, &KeyError{File: path, Line: k.Line, Key: name, Err: fmt.Errorf("repeated (first on line %d)", prev.line)}
		}
		if v.Kind != yaml.ScalarNode {
			return nil, &KeyError{File: path, Line: v.Line, Key: name, Err: errors.New("the value must be a single scalar")}
		}
		if v.Tag == "!!null" {
			return nil, &KeyError{File: path, Line: v.Line, Key: name, Err: errors.New("no value given (remove the key to keep the default)")}
		}
		out[name] = fileValue{value: v.Value, line: v.Line}
	}
	return out, nil
}

func suggest(fs *pflag.FlagSet, name string, skip map[string]bool) string {
	var names []string
	fs.VisitAll(func(f *pflag.Flag) {
		if !skip[f.Name] {
			names = append(names, f.Name)
		}
	})
	sort.Strings(names)
	norm := strings.ReplaceAll(strings.ToLower(name), "_", "-")
	for _, n := range names {
		if n == norm {
			return n
		}
	}
	return ""
}

// Sample writes a configuration file listing every flag of fs except skip as a
// commented-out key set to its default, under its usage text, so an operator
// uncomments what they change. The output passes [Apply] unchanged.
func Sample(w io.Writer, fs *pflag.FlagSet, skip ...string) error {
	omit := map[string]bool{}
	for _, s := range skip {
		omit[s] = true
	}
	var b strings.Builder
	b.WriteString("# Every key is a flag of the same name; flags and BERTH_* variables override this file.\n")
	fs.VisitAll(func(f *pflag.Flag) {
		if omit[f.Name] || f.Hidden {
			return
		}
		fmt.Fprintf(&b, "\n# %s (%s; %s)\n", strings.ReplaceAll(f.Usage, "\n", " "), f.Value.Type(), EnvName(f.Name))
		def := f.DefValue
		if f.Value.Type() != "bool" && f.Value.Type() != "int" && f.Value.Type() != "int64" {
			def = strconv.Quote(def)
		}
		fmt.Fprintf(&b, "# %s: %s\n", f.Name, def)
	})
	_, err := io.WriteString(w, b.String())
	return err
}
