// Command apicount counts the exported identifiers of the library's
// packages: every exported top-level const, var, type and func, every
// exported method of an exported type, and every exported field of an
// exported struct type and method of an exported interface. It counts two
// totals: the core (the library module and durable/sqlite) and the adapters
// (claimgrpc, claimnats, claimamqp, claimkafka, claimriver); it prints a third, the test
// kit claimtest's, without a limit. Test files, and the folders that are not the
// library (chaos, bench, examples, cmd, any internal or testdata folder),
// are not counted, nor are driver and testkit: the documented, unstable
// seam between the repository's modules, which promises nothing (see
// driver's package documentation), and its typed part inside a library
// package, files named *_seam.go (claim/driver_seam.go: claim.Driver). CI runs it and fails when a total
// passes its limit.
//
//	go run ./internal/cmd/apicount [-max N] [-max-adapters N] [-v] [dir]
//
// dir is the root of the count (default "."); the folders skipped are those
// below it, so `go run ./internal/cmd/apicount chaos` counts the public API
// of the chaos harness. Packages are named by their path from the current
// folder.
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// skip are the top-level folders that are not the library. Folders named
// internal or driver (claim/driver, durable/driver: the unstable seam
// between the modules, no API) are skipped wherever they are.
var skip = map[string]bool{"chaos": true, "bench": true, "examples": true, "docs": true, "cmd": true, "testkit": true}

// libraryModules are the nested modules that are part of the library's
// core and counted with it; adapterModules are counted as the adapters;
// other nested modules are skipped.
var (
	libraryModules = map[string]bool{"durable/sqlite": true}
	adapterModules = map[string]string{
		"claim/claimgrpc": "adapters", "claim/claimnats": "adapters", "claim/claimamqp": "adapters", "claim/claimkafka": "adapters", "claim/claimriver": "adapters",
		"claim/claimtest": "test kit",
	}
)

func main() {
	limit := flag.Int("max", 0, "fail when the core's total is above this (0: no limit)")
	adapterLimit := flag.Int("max-adapters", 0, "fail when the adapters' total is above this (0: no limit)")
	verbose := flag.Bool("v", false, "list every identifier")
	flag.Parse()
	root := "."
	if flag.NArg() > 0 {
		root = flag.Arg(0)
	}
	counts, names, err := count(root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "apicount:", err)
		os.Exit(2)
	}
	failed := false
	for _, g := range []struct {
		name  string
		limit int
	}{{"core", *limit}, {"adapters", *adapterLimit}, {"test kit", 0}} {
		if !report(root, g.name, g.limit, counts, names, *verbose) {
			failed = true
		}
	}
	if failed {
		os.Exit(1)
	}
}

// report prints the count of a group's packages (core, adapters, test
// kit), and returns false when its total is above limit (0: no limit).
func report(root, group string, limit int, counts map[string]int, names map[string][]string, verbose bool) bool {
	pkgs := make([]string, 0, len(counts))
	total := 0
	for p, n := range counts {
		if groupOf(root, p) != group {
			continue
		}
		pkgs = append(pkgs, p)
		total += n
	}
	sort.Strings(pkgs)
	for _, p := range pkgs {
		fmt.Printf("%4d  %s\n", counts[p], p)
		if verbose {
			sort.Strings(names[p])
			for _, n := range names[p] {
				fmt.Printf("        %s\n", n)
			}
		}
	}
	fmt.Printf("%4d  exported identifiers in %d %s packages\n\n", total, len(pkgs), group)
	if limit > 0 && total > limit {
		fmt.Fprintf(os.Stderr, "apicount: %s: %d exported identifiers, more than the limit of %d\n", group, total, limit)
		return false
	}
	return true
}

// groupOf returns the group of package folder p (as count names it,
// under root): its module's in adapterModules, else "core".
func groupOf(root, p string) string {
	rel, err := filepath.Rel(root, p)
	if err != nil {
		return "core"
	}
	rel = filepath.ToSlash(rel)
	for m, g := range adapterModules {
		if rel == m || strings.HasPrefix(rel, m+"/") {
			return g
		}
	}
	return "core"
}

func count(root string) (map[string]int, map[string][]string, error) {
	counts := map[string]int{}
	names := map[string][]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		first := strings.Split(filepath.ToSlash(rel), "/")[0]
		base := d.Name()
		if rel != "." && (skip[first] || base == "internal" || base == "driver" || base == "testdata" || strings.HasPrefix(base, ".")) {
			return filepath.SkipDir
		}
		if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil && rel != "." && !libraryModules[filepath.ToSlash(rel)] && adapterModules[filepath.ToSlash(rel)] == "" {
			return filepath.SkipDir // another module
		}
		files, err := os.ReadDir(path)
		if err != nil {
			return err
		}
		fset := token.NewFileSet()
		for _, fi := range files {
			name := fi.Name()
			if fi.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") || strings.HasSuffix(name, "_seam.go") {
				continue
			}
			f, err := parser.ParseFile(fset, filepath.Join(path, name), nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			if f.Name.Name == "main" {
				continue
			}
			pkg := filepath.ToSlash(filepath.Join(root, rel))
			for _, n := range exported(f) {
				counts[pkg]++
				names[pkg] = append(names[pkg], n)
			}
		}
		return nil
	})
	return counts, names, err
}

// exported lists the exported identifiers a file declares.
func exported(f *ast.File) []string {
	var out []string
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() {
				continue
			}
			if d.Recv == nil {
				out = append(out, d.Name.Name)
				continue
			}
			if recv := receiver(d.Recv.List[0].Type); ast.IsExported(recv) {
				out = append(out, recv+"."+d.Name.Name)
			}
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				switch s := spec.(type) {
				case *ast.ValueSpec:
					for _, n := range s.Names {
						if n.IsExported() {
							out = append(out, n.Name)
						}
					}
				case *ast.TypeSpec:
					if !s.Name.IsExported() {
						continue
					}
					out = append(out, s.Name.Name)
					out = append(out, members(s.Name.Name, s.Type)...)
				}
			}
		}
	}
	return out
}

// members lists the exported fields of a struct type and the exported
// methods of an interface type.
func members(typ string, t ast.Expr) []string {
	var list *ast.FieldList
	switch x := t.(type) {
	case *ast.StructType:
		list = x.Fields
	case *ast.InterfaceType:
		list = x.Methods
	default:
		return nil
	}
	var out []string
	for _, fld := range list.List {
		for _, n := range fld.Names {
			if n.IsExported() {
				out = append(out, typ+"."+n.Name)
			}
		}
	}
	return out
}

func receiver(t ast.Expr) string {
	for {
		switch x := t.(type) {
		case *ast.StarExpr:
			t = x.X
		case *ast.IndexExpr:
			t = x.X
		case *ast.IndexListExpr:
			t = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}
