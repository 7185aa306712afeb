package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	hostwasm "github.com/berthhq/berth/host/wasm"
	"github.com/berthhq/berth/host/wasm/interrupt"
)

// maxBundleFile bounds one file read from an OPA bundle: 16 MiB, the
// server's module limit.
const maxBundleFile = 16 << 20

// isGzip reports whether raw starts as a gzip stream does, as an OPA bundle
// (tar.gz) does and a WebAssembly module does not.
func isGzip(raw []byte) bool { return bytes.HasPrefix(raw, []byte{0x1f, 0x8b}) }

// readModuleFile reads a module for the commands that run one locally
// (policy test, conformance wasm): a .wasm as it is, or an OPA bundle
// turned into the module that module push --kind opa uploads with the same
// entrypoint (and no --name or --module-version), so both name it by the
// same digest. entrypoint is only for a bundle.
func readModuleFile(path, entrypoint string) ([]byte, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read module: %w", err)
	}
	if !isGzip(raw) {
		if entrypoint != "" {
			return nil, fmt.Errorf("%s is not an OPA bundle: --entrypoint is for one (opa build -t wasm)", path)
		}
		return raw, nil
	}
	mod, err := opaBundleModule(raw, entrypoint, "", "")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return mod, nil
}

// opaBundleModule turns an OPA bundle (tar.gz from opa build -t wasm) into
// the module berth uploads: its policy.wasm with a berth.opa custom section
// holding name, version, entrypoint and the bundle's data document
// (docs/wasm-abi.md section 11.2).
func opaBundleModule(bundle []byte, entrypoint, name, version string) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(bundle))
	if err != nil {
		return nil, fmt.Errorf("not an OPA bundle (tar.gz): %w", err)
	}
	files := map[string][]byte{}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read the bundle: %w", err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		n := "/" + strings.TrimPrefix(h.Name, "/")
		if n != "/policy.wasm" && n != "/data.json" && n != "/.manifest" {
			continue
		}
		b, err := io.ReadAll(io.LimitReader(tr, maxBundleFile+1))
		if err != nil {
			return nil, fmt.Errorf("read %s from the bundle: %w", n, err)
		}
		if len(b) > maxBundleFile {
			return nil, fmt.Errorf("%s in the bundle is over %d bytes", n, maxBundleFile)
		}
		files[n] = b
	}
	wasm, ok := files["/policy.wasm"]
	if !ok {
		return nil, errors.New("the bundle has no policy.wasm; build it with opa build -t wasm -e <entrypoint>")
	}
	var manifest struct {
		Revision string `json:"revision"`
		Wasm     []struct {
			Entrypoint string `json:"entrypoint"`
			Module     string `json:"module"`
		} `json:"wasm"`
	}
	if m, ok := files["/.manifest"]; ok {
		if err := json.Unmarshal(m, &manifest); err != nil {
			return nil, fmt.Errorf("the bundle's .manifest is not JSON: %w", err)
		}
	}
	if entrypoint != "" && len(manifest.Wasm) > 0 {
		found := false
		var names []string
		for _, w := range manifest.Wasm {
			names = append(names, w.Entrypoint)
			found = found || w.Entrypoint == entrypoint
		}
		if !found {
			return nil, fmt.Errorf("the bundle has no entrypoint %q (it has %s)", entrypoint, strings.Join(names, ", "))
		}
	}
	if version == "" {
		version = manifest.Revision
	}
	cfg := hostwasm.OPAConfig{Name: name, Version: version, Entrypoint: entrypoint}
	if d, ok := files["/data.json"]; ok && len(bytes.TrimSpace(d)) > 0 && string(bytes.TrimSpace(d)) != "{}" {
		if !json.Valid(d) || bytes.TrimSpace(d)[0] != '{' {
			return nil, errors.New("the bundle's data.json is not a JSON object")
		}
		cfg.Data = json.RawMessage(bytes.TrimSpace(d))
	}
	sec, err := json.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("encode the berth.opa section: %w", err)
	}
	if _, ok := interrupt.CustomSection(wasm, hostwasm.OPAConfigSection); ok {
		return nil, fmt.Errorf("policy.wasm already has a %s section", hostwasm.OPAConfigSection)
	}
	return interrupt.AppendCustomSection(wasm, hostwasm.OPAConfigSection, sec), nil
}
