package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestRacePackages keeps make test's split honest: a package whose code starts a
// goroutine (a go statement, or a WaitGroup's or errgroup's Go) runs under the race
// detector in make test (the Makefile's RACE_PKGS, a -run subset in its race-pkgs
// recipe, or an index package in INDEX_PKGS); every package RACE_PKGS names exists and
// has concurrent code of its own to check (it starts goroutines, or imports sync or
// sync/atomic to share memory with its callers' goroutines), since a sequential
// package costs the race build its dependencies and finds nothing. The rest run once,
// in the plain build (Makefile, "race and plain").
func TestRacePackages(t *testing.T) {
	const root = "../.."
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	pkgPath := regexp.MustCompile(`\./[A-Za-z0-9_/.-]*`)
	raced := map[string]bool{}  // packages named
	under := map[string]bool{}  // packages named with /...: their subpackages too
	listed := map[string]bool{} // packages RACE_PKGS names
	for i, part := range []string{makeVar(t, string(mk), "RACE_PKGS"), makeVar(t, string(mk), "INDEX_PKGS"), makeRecipe(t, string(mk), "race-pkgs")} {
		for _, p := range pkgPath.FindAllString(part, -1) {
			p = strings.TrimSuffix(strings.TrimPrefix(p, "./"), "/")
			if q, ok := strings.CutSuffix(p, "/..."); ok {
				p, under[q] = q, true
			}
			raced[p] = true
			listed[p] = listed[p] || i == 0
		}
	}
	pkgs := goPackages(t, root)
	for p := range raced {
		if _, ok := pkgs[p]; !ok {
			t.Errorf("the Makefile races %s, which is not a package", p)
		}
	}
	fset := token.NewFileSet()
	for p, files := range pkgs {
		var starts token.Pos
		shares := false
		for _, f := range files {
			file, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			if pos, ok := firstGo(file); ok && starts == token.NoPos {
				starts = pos
			}
			shares = shares || importsSync(file)
		}
		switch {
		case starts != token.NoPos && !raced[p] && !coveredBy(p, under):
			t.Errorf("%s starts a goroutine (%s) but make test never runs it under the race detector: add it to RACE_PKGS", p, fset.Position(starts))
		case listed[p] && starts == token.NoPos && !shares:
			t.Errorf("RACE_PKGS names %s, whose code neither starts goroutines nor imports sync or sync/atomic: its tests belong to the plain build", p)
		}
	}
}

// coveredBy says whether p is under a package named with a /... pattern (INDEX_PKGS'
// ./engine/... covers engine/internal/chain).
func coveredBy(p string, under map[string]bool) bool {
	for q := p; strings.Contains(q, "/"); {
		q = q[:strings.LastIndex(q, "/")]
		if under[q] {
			return true
		}
	}
	return false
}

// firstGo returns the position of the first place in file that starts a goroutine: a
// go statement, or a call of a method named Go with one argument (sync.WaitGroup.Go,
// errgroup.Group.Go: each runs its function on a goroutine of its own).
func firstGo(file *ast.File) (token.Pos, bool) {
	var at token.Pos
	ast.Inspect(file, func(n ast.Node) bool {
		if at != token.NoPos {
			return false // found: Inspect still visits siblings, which must not move it
		}
		switch n := n.(type) {
		case *ast.GoStmt:
			at = n.Pos()
		case *ast.CallExpr:
			if sel, ok := n.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "Go" && len(n.Args) == 1 {
				at = n.Pos()
			}
		}
		return at == token.NoPos
	})
	return at, at != token.NoPos
}

// importsSync says whether file imports sync or sync/atomic.
func importsSync(file *ast.File) bool {
	for _, imp := range file.Imports {
		if imp.Path.Value == `"sync"` || imp.Path.Value == `"sync/atomic"` {
			return true
		}
	}
	return false
}

// makeVar returns the value of a Makefile variable set with := or =, its backslash
// continuations joined.
func makeVar(t *testing.T, mk, name string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `\s*:?=((?:.*\\\n)*.*)$`).FindStringSubmatch(mk)
	if m == nil {
		t.Fatalf("the Makefile sets no %s", name)
	}
	return m[1]
}

// makeRecipe returns the recipe lines (tab-indented) of a Makefile target.
func makeRecipe(t *testing.T, mk, target string) string {
	t.Helper()
	i := strings.Index(mk, "\n"+target+":")
	if i < 0 {
		t.Fatalf("the Makefile has no %s target", target)
	}
	var b strings.Builder
	for _, line := range strings.Split(mk[i+1:], "\n")[1:] {
		if !strings.HasPrefix(line, "\t") {
			break
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}

// TestFuzzTargetsListed: every fuzz target of the module runs in make test's fuzz or
// make test-long's fuzz-long, so none is written and then never fuzzed.
func TestFuzzTargetsListed(t *testing.T) {
	const root = "../.."
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	listed := makeRecipe(t, string(mk), "fuzz") + makeRecipe(t, string(mk), "fuzz-long")
	target := regexp.MustCompile(`(?m)^func (Fuzz\w+)\(`)
	found := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range target.FindAllStringSubmatch(string(src), -1) {
			found++
			if !strings.Contains(listed, "'^"+m[1]+"$$'") {
				t.Errorf("%s (%s) is in neither make fuzz nor make fuzz-long", m[1], path)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if found < 10 {
		t.Fatalf("found %d fuzz targets: the walk is wrong", found)
	}
}
