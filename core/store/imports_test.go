package store_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// driverImport is the import path prefix of the MongoDB driver: mongo, bson, options and the rest.
const driverImport = "go.mongodb.org/mongo-driver/"

// driverAllowed are the packages under core/, besides core/store and its subpackages, that may
// still import the MongoDB driver, each with why. Each one owns the collections named and
// builds their queries itself; the list only shrinks: a package that can say what it needs as
// a named method of core/store leaves it. Tests (_test.go files) are exempt everywhere: they
// build fixtures and inspect raw documents.
var driverAllowed = map[string]string{
	"core/backup":     "takes and restores whole-database dumps (every collection, raw BSON as extended JSON)",
	"core/backups":    "backup records and schedules (backups, backup_schedules): conditional claims and listing by binding",
	"core/bindings":   "binding documents: inserts and compare-and-sets with a $set of several fields",
	"core/bundles":    "the bundle catalog (bundles): upserts carrying a change-log outbox push",
	"core/certs":      "certificate statuses and certmagic's storage (sealed values, locks with conditional filters)",
	"core/changelog":  "the hash-chained log itself: ordered inserts, head documents, outbox drains of every tracked collection",
	"core/fencing":    "leases, fencing tokens and the write guard: conditional $lte filters, outbox pushes",
	"core/identity":   "users, tokens and token names: unique indexes, sessions, outbox pushes",
	"core/nodes":      "node documents and join tokens: status transitions conditional on status and session",
	"core/operations": "the operation queue: bucketed live and archived operations, lanes, sequences",
	"core/placement":  "provider placements, bucketed, and the delete intents",
	"core/policy":     "modules, bindings and the decision log with its seq",
	"core/registry":   "image release records (image_releases): tag history and conditional replaces",
	"core/rollout":    "runtime specs and slot sets",
	"core/runners":    "runner nodes, bucketed, and enrollments",
	"core/secrets":    "secret documents and sealed sets: versions, keyring rotation cursors",
	"core/services":   "projects, services, workloads and route claims: the catalog's queries and indexes",
}

// TestOnlyStoreImportsTheDriver fails when a package under core/ other than core/store (and
// the allow-list above) imports the MongoDB driver in a non-test file, and when an allowed
// package no longer does (so the list shrinks with the code).
func TestOnlyStoreImportsTheDriver(t *testing.T) {
	t.Parallel()
	core, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	importers := map[string][]string{} // package dir (core/...) -> files
	err = filepath.WalkDir(core, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(filepath.Dir(core), filepath.Dir(path))
		if err != nil {
			return err
		}
		pkg := filepath.ToSlash(rel)
		for _, imp := range f.Imports {
			p, err := strconv.Unquote(imp.Path.Value)
			if err != nil {
				return err
			}
			if strings.HasPrefix(p, driverImport) {
				importers[pkg] = append(importers[pkg], filepath.Base(path)+" imports "+p)
				break
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(importers["core/store"]) == 0 {
		t.Fatal("core/store imports no driver package: the walk is broken")
	}
	var pkgs []string
	for pkg := range importers {
		pkgs = append(pkgs, pkg)
	}
	slices.Sort(pkgs)
	for _, pkg := range pkgs {
		if pkg == "core/store" || strings.HasPrefix(pkg, "core/store/") {
			continue
		}
		if _, ok := driverAllowed[pkg]; !ok {
			t.Errorf("%s imports the MongoDB driver (%s): give core/store a named method for what it needs, or own the data and add it to driverAllowed with the reason",
				pkg, strings.Join(importers[pkg], "; "))
		}
	}
	for pkg := range driverAllowed {
		if len(importers[pkg]) == 0 {
			t.Errorf("%s is in driverAllowed but imports no driver package: take it off the list", pkg)
		}
	}
}
