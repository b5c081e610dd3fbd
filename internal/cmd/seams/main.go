// Command seams fails when a module of the workspace that is released for
// import (the library's adapters and stores) imports an internal package of
// another module. Go allows it, since the internal rule is by import path
// and every module here lives under github.com/oncekey/oncekey, but the
// modules are released separately: a user upgrading one and not the other
// would build against internal code of another version. What the modules
// share goes through the documented, unstable driver and testkit packages
// (see claim/driver's package documentation and RELEASING.md).
//
// The tool modules (chaos, bench, examples, cmd/oncekey) are not imported
// by anyone and are built from this repository at one commit; they may use
// the library's internal packages. Test-only modules (a folder named
// internal) are never released. Both are skipped. Test files count: a
// module's tests are run by its users too (go test all).
//
//	go run ./internal/cmd/seams
//
// It also fails on an exported package-level variable of a function type
// that takes or returns any (or interface{}) in a released module: the
// shape of an untyped seam filled by init functions, where a wrong type is
// a silent zero value instead of a compile error. A released module's
// packages reach claim's internals through claim.Driver, typed.
//
// It runs in the workspace root (go.work); CI runs it.
package main

import (
	"bufio"
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// tools are the workspace's modules that are not imported by anyone, by
// their folder.
var tools = map[string]bool{"chaos": true, "bench": true, "examples": true, "cmd/oncekey": true}

func main() {
	mods, err := workspace()
	if err != nil {
		fmt.Fprintln(os.Stderr, "seams:", err)
		os.Exit(2)
	}
	imports := map[string][]string{}
	for _, m := range mods {
		if !m.released() {
			continue
		}
		if imports[m.Path], err = importsOf(m.abs); err != nil {
			fmt.Fprintln(os.Stderr, "seams:", err)
			os.Exit(2)
		}
	}
	bad := check(mods, imports)
	for _, m := range mods {
		if !m.released() {
			continue
		}
		vars, err := anyFuncVars(m.abs)
		if err != nil {
			fmt.Fprintln(os.Stderr, "seams:", err)
			os.Exit(2)
		}
		bad = append(bad, vars...)
	}
	for _, b := range bad {
		fmt.Println(b)
	}
	if len(bad) > 0 {
		fmt.Printf("seams: %d imports of another module's internal packages or any-typed function variables; share through claim.Driver, claim/driver, durable/driver or testkit instead\n", len(bad))
		os.Exit(1)
	}
	fmt.Printf("seams: no released module imports another module's internal packages (%d modules checked)\n", len(imports))
}

// module is one workspace module: its path and its folder relative to the
// workspace root ("." for the root).
type module struct {
	Path, Dir string
	abs       string // its folder's absolute path
}

// released reports whether m is released for import: not a tool, not
// under an internal folder.
func (m module) released() bool {
	return !tools[m.Dir] && !hasInternal(m.Dir)
}

// check returns, sorted, every import that a released module's packages
// (imports, by module path) make of an internal package owned by another
// module of mods.
func check(mods []module, imports map[string][]string) []string {
	var bad []string
	for from, list := range imports {
		for _, p := range list {
			if !hasInternal(p) {
				continue
			}
			owner := ownerOf(mods, p)
			if owner == "" || owner == from {
				continue
			}
			bad = append(bad, fmt.Sprintf("%s imports %s (internal to %s)", from, p, owner))
		}
	}
	sort.Strings(bad)
	return bad
}

// ownerOf returns the module of mods that holds package p: the longest
// module path p is under, "" when none (a dependency outside the workspace).
func ownerOf(mods []module, p string) string {
	owner := ""
	for _, m := range mods {
		if (p == m.Path || strings.HasPrefix(p, m.Path+"/")) && len(m.Path) > len(owner) {
			owner = m.Path
		}
	}
	return owner
}

// hasInternal reports whether a slash-separated path has an element named
// internal.
func hasInternal(p string) bool {
	for _, e := range strings.Split(path.Clean(p), "/") {
		if e == "internal" {
			return true
		}
	}
	return false
}

// workspace lists go.work's modules.
func workspace() ([]module, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Path}} {{.Dir}}").Output()
	if err != nil {
		return nil, fmt.Errorf("go list -m: %w", err)
	}
	root, err := exec.Command("go", "env", "GOWORK").Output()
	if err != nil {
		return nil, fmt.Errorf("go env GOWORK: %w", err)
	}
	dir := path.Dir(strings.TrimSpace(string(root)))
	if dir == "." || strings.TrimSpace(string(root)) == "off" {
		return nil, fmt.Errorf("not in workspace mode: run it where go.work is")
	}
	var mods []module
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			continue
		}
		rel := strings.TrimPrefix(strings.TrimPrefix(f[1], dir), "/")
		if rel == "" {
			rel = "."
		}
		mods = append(mods, module{Path: f[0], Dir: rel, abs: f[1]})
	}
	return mods, sc.Err()
}

// importsOf lists every import of the packages in folder dir and below,
// their tests' included.
func importsOf(dir string) ([]string, error) {
	cmd := exec.Command("go", "list", "-f", `{{join .Imports "\n"}}
{{join .TestImports "\n"}}
{{join .XTestImports "\n"}}`, "./...")
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list in %s: %w\n%s", dir, err, stderr.String())
	}
	seen := map[string]bool{}
	var list []string
	for _, l := range strings.Fields(string(out)) {
		if !seen[l] {
			seen[l] = true
			list = append(list, l)
		}
	}
	return list, nil
}

// anyFuncVars lists the exported package-level variables of a function
// type with an any (or interface{}) parameter or result, in the non-test
// Go files of the module in folder dir (nested modules and testdata
// skipped).
func anyFuncVars(dir string) ([]string, error) {
	var bad []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != dir && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil && p != dir {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, v := range anyFuncVarsIn(f) {
			bad = append(bad, fmt.Sprintf("%s: exported variable %s is a function over any", fset.Position(v.Pos()), v.Name))
		}
		return nil
	})
	return bad, err
}

// anyFuncVarsIn returns f's exported package-level variables whose type is
// a function type with an any (or interface{}) parameter or result.
func anyFuncVarsIn(f *ast.File) []*ast.Ident {
	var out []*ast.Ident
	for _, decl := range f.Decls {
		g, ok := decl.(*ast.GenDecl)
		if !ok || g.Tok != token.VAR {
			continue
		}
		for _, spec := range g.Specs {
			vs := spec.(*ast.ValueSpec)
			ft, ok := vs.Type.(*ast.FuncType)
			if !ok || !takesAny(ft) {
				continue
			}
			for _, n := range vs.Names {
				if n.IsExported() {
					out = append(out, n)
				}
			}
		}
	}
	return out
}

// takesAny reports whether a function type has an any or interface{}
// parameter or result, at any depth (a callback's too).
func takesAny(ft *ast.FuncType) bool {
	found := false
	ast.Inspect(ft, func(n ast.Node) bool {
		switch t := n.(type) {
		case *ast.Ident:
			if t.Name == "any" {
				found = true
			}
		case *ast.InterfaceType:
			if t.Methods == nil || len(t.Methods.List) == 0 {
				found = true
			}
		}
		return !found
	})
	return found
}
