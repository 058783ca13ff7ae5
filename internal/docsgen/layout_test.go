package main

import (
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestDesignLayout: DESIGN.md's layout table lists every package of the module (what
// `go list ./...` lists: each directory holding a non-test .go file, outside testdata and
// hidden directories) and nothing that is gone; an entry without Go files (bench/peers'
// Rust, scripts) must still be a directory.
func TestDesignLayout(t *testing.T) {
	const root = "../.."
	design, err := os.ReadFile(filepath.Join(root, "DESIGN.md"))
	if err != nil {
		t.Fatal(err)
	}
	listed := layoutTable(t, string(design))
	pkgs := slices.Sorted(maps.Keys(goPackages(t, root)))
	if len(pkgs) < 20 {
		t.Fatalf("found %d packages under %s: the walk is wrong", len(pkgs), root)
	}
	for _, p := range pkgs {
		if !listed[p] {
			t.Errorf("package %s is not in DESIGN.md's layout table: add a row saying what it owns", p)
		}
	}
	for p := range listed {
		if _, err := os.Stat(filepath.Join(root, p)); err != nil {
			t.Errorf("DESIGN.md's layout table lists %s, which is gone: %v", p, err)
		}
	}
}

// goPackages returns the module's packages under root (each directory holding a
// non-test .go file, outside testdata, node_modules, Rust targets and hidden
// directories, as `go list ./...` finds them) with their non-test .go files.
func goPackages(t *testing.T, root string) map[string][]string {
	t.Helper()
	pkgs := map[string][]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "target" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, "_test.go") {
			rel, err := filepath.Rel(root, filepath.Dir(path))
			if err != nil {
				return err
			}
			pkgs[filepath.ToSlash(rel)] = append(pkgs[filepath.ToSlash(rel)], path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pkgs
}

// layoutTable returns the entries of the first column of DESIGN.md's "## Layout"
// table (a row may name several, each in backquotes).
func layoutTable(t *testing.T, design string) map[string]bool {
	t.Helper()
	i := strings.Index(design, "\n## Layout\n")
	if i < 0 {
		t.Fatal(`DESIGN.md has no "## Layout" section`)
	}
	section := design[i+len("\n## Layout\n"):]
	if j := strings.Index(section, "\n## "); j >= 0 {
		section = section[:j]
	}
	name := regexp.MustCompile("`([^`]+)`")
	listed := map[string]bool{}
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(line, "|")
		if !strings.HasPrefix(line, "| `") || len(cells) < 3 {
			continue
		}
		for _, m := range name.FindAllStringSubmatch(cells[1], -1) {
			listed[m[1]] = true
		}
	}
	if len(listed) == 0 {
		t.Fatal("DESIGN.md's layout table lists nothing")
	}
	return listed
}
