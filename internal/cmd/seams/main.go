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
// It runs in the workspace root (go.work); CI runs it.
package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path"
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
	for _, b := range bad {
		fmt.Println(b)
	}
	if len(bad) > 0 {
		fmt.Printf("seams: %d imports of another module's internal packages; share through claim/driver, durable/driver or testkit instead\n", len(bad))
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
