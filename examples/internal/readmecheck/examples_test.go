package readmecheck

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// flagFuncs are the flag.FlagSet methods that define a flag, with the
// index of the flag's name among their arguments (its default follows).
var flagFuncs = map[string]int{
	"String": 0, "Bool": 0, "Duration": 0, "Int": 0, "Int64": 0, "Uint": 0, "Uint64": 0, "Float64": 0, "Func": 0, "BoolFunc": 0,
	"StringVar": 1, "BoolVar": 1, "DurationVar": 1, "IntVar": 1, "Int64Var": 1, "UintVar": 1, "Uint64Var": 1, "Float64Var": 1, "TextVar": 1, "Var": 1,
}

// flagDefs reads the flags a package's non-test files define on a FlagSet
// named fs: name → default when it is a string literal, "" otherwise. A
// call of a method named registers adds registered's flags.
func flagDefs(dir, registers string, registered map[string]string) (flags map[string]string, isMain bool, err error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, false, err
	}
	fset := token.NewFileSet()
	flags = map[string]string{}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, false, err
		}
		isMain = isMain || f.Name.Name == "main"
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if sel.Sel.Name == registers {
				for k, v := range registered {
					flags[k] = v
				}
				return true
			}
			recv, ok := sel.X.(*ast.Ident)
			i, isFlag := flagFuncs[sel.Sel.Name]
			if !ok || recv.Name != "fs" || !isFlag || len(call.Args) <= i {
				return true
			}
			lit, ok := call.Args[i].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			name, _ := strconv.Unquote(lit.Value)
			def := ""
			if len(call.Args) > i+1 {
				if d, ok := call.Args[i+1].(*ast.BasicLit); ok && d.Kind == token.STRING {
					def, _ = strconv.Unquote(d.Value)
				}
			}
			flags[name] = def
			return true
		})
	}
	return flags, isMain, nil
}

// examplePrograms returns the programs of the examples module (its
// directories of package main) with their flags: their own, and those of
// program.Flags (its FlagSet method registers -v and backend.Config's
// flags, by RegisterFlags).
func examplePrograms(t *testing.T, root string) map[string]map[string]string {
	t.Helper()
	backendFlags, _, err := flagDefs(filepath.Join(root, "internal", "backend"), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(backendFlags) == 0 {
		t.Fatal("backend.RegisterFlags defines no flags: the extraction is broken")
	}
	registered, _, err := flagDefs(filepath.Join(root, "internal", "program"), "RegisterFlags", backendFlags)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := registered["v"]; !ok || len(registered) != len(backendFlags)+1 {
		t.Fatalf("program.Flags defines %v: the extraction is broken", registered)
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	progs := map[string]map[string]string{}
	for _, e := range entries {
		if !e.IsDir() || e.Name() == "internal" {
			continue
		}
		flags, isMain, err := flagDefs(filepath.Join(root, e.Name()), "FlagSet", registered)
		if err != nil {
			t.Fatal(err)
		}
		if isMain {
			progs[e.Name()] = flags
		}
	}
	return progs
}

var (
	programRow = regexp.MustCompile("(?m)^\\| \\[`([a-z0-9_-]+)`\\]\\(")
	flagRow    = regexp.MustCompile("^\\| `-([A-Za-z0-9_-]+)` \\|")
)

// cells splits a Markdown table row into its trimmed cells.
func cells(row string) []string {
	row = strings.TrimSpace(row)
	row = strings.TrimPrefix(strings.TrimSuffix(row, "|"), "|")
	out := strings.Split(row, "|")
	for i := range out {
		out[i] = strings.TrimSpace(out[i])
	}
	return out
}

// checkExamplesREADME compares examples/README.md with the programs: the
// table of programs names each one; the flags table has a column per
// program and a row per flag, "yes" exactly where the program defines the
// flag, and each string default of a flag in its default column.
func checkExamplesREADME(md string, progs map[string]map[string]string) []error {
	var errs []error
	names := slices.Sorted(func(yield func(string) bool) {
		for p := range progs {
			if !yield(p) {
				return
			}
		}
	})
	var listed []string
	for _, m := range programRow.FindAllStringSubmatch(md, -1) {
		listed = append(listed, m[1])
	}
	sort.Strings(listed)
	if !slices.Equal(listed, names) {
		errs = append(errs, fmt.Errorf("the table of programs lists %v; the programs are %v", listed, names))
	}
	lines := strings.Split(md, "\n")
	head := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "| flag |") })
	if head < 0 {
		return append(errs, fmt.Errorf("no flags table (a row starting with %q)", "| flag |"))
	}
	cols := cells(lines[head])
	if len(cols) < 3 || cols[len(cols)-1] != "default" {
		return append(errs, fmt.Errorf("flags table header %q: want | flag | <program>... | default |", lines[head]))
	}
	progCols := cols[1 : len(cols)-1]
	if got := slices.Sorted(slices.Values(progCols)); !slices.Equal(got, names) {
		errs = append(errs, fmt.Errorf("the flags table has columns %v; the programs are %v", progCols, names))
	}
	rows := map[string]bool{}
	for _, l := range lines[head+2:] {
		m := flagRow.FindStringSubmatch(l)
		if m == nil {
			break
		}
		flag, c := m[1], cells(l)
		rows[flag] = true
		if len(c) != len(cols) {
			errs = append(errs, fmt.Errorf("row -%s has %d cells; the header %d", flag, len(c), len(cols)))
			continue
		}
		def := c[len(c)-1]
		for i, p := range progCols {
			d, has := progs[p][flag]
			switch {
			case c[i+1] == "yes" && !has:
				errs = append(errs, fmt.Errorf("-%s: the table says %s has it; it does not", flag, p))
			case c[i+1] != "yes" && has:
				errs = append(errs, fmt.Errorf("-%s: %s has it; the table does not say so", flag, p))
			case has && d != "" && !strings.Contains(def, "`"+d+"`"):
				errs = append(errs, fmt.Errorf("-%s: %s's default is %q; the table's default column says %s", flag, p, d, def))
			}
		}
	}
	for _, p := range names {
		for flag := range progs[p] {
			if !rows[flag] {
				errs = append(errs, fmt.Errorf("-%s of %s has no row in the flags table", flag, p))
			}
		}
	}
	return errs
}

// examples/README.md tells the truth about the programs: each is in the
// table of programs, and the flags table has their flags, columns and
// default addresses.
func TestExamplesREADMEMatchesThePrograms(t *testing.T) {
	root := filepath.Join("..", "..")
	md, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	progs := examplePrograms(t, root)
	if len(progs) < 4 || len(progs["orders"]) == 0 {
		t.Fatalf("programs %v: the extraction is broken", progs)
	}
	for _, err := range checkExamplesREADME(string(md), progs) {
		t.Error(err)
	}
}

// The check fails for a README that went stale: a program missing from
// either table, a flag missing or claimed, another default address.
func TestExamplesREADMECheckCatchesStaleTables(t *testing.T) {
	progs := map[string]map[string]string{
		"orders":   {"addr": "127.0.0.1:8080", "v": ""},
		"payments": {"addr": "127.0.0.1:8081", "v": "", "gateway-mode": "normal"},
	}
	good := "| example | x |\n| --- | --- |\n| [`orders`](orders) | a |\n| [`payments`](payments) | b |\n\n" +
		"| flag | orders | payments | default |\n| --- | --- | --- | --- |\n" +
		"| `-addr` | yes | yes | `127.0.0.1:8080` / `127.0.0.1:8081` |\n" +
		"| `-v` | yes | yes | off |\n" +
		"| `-gateway-mode` | | yes | `normal` |\n\nafter\n"
	if errs := checkExamplesREADME(good, progs); len(errs) != 0 {
		t.Fatalf("a true README failed: %v", errs)
	}
	for name, bad := range map[string]string{
		"program not listed":   strings.Replace(good, "| [`payments`](payments) | b |\n", "", 1),
		"program column gone":  strings.NewReplacer("| flag | orders | payments | default |", "| flag | orders | default |", "| --- | --- | --- | --- |", "| --- | --- | --- |", " | yes | yes |", " | yes |", "| `-gateway-mode` | | yes |", "| `-gateway-mode` | |").Replace(good),
		"flag claimed":         strings.Replace(good, "| `-gateway-mode` | | yes |", "| `-gateway-mode` | yes | yes |", 1),
		"flag without its row": strings.Replace(good, "| `-v` | yes | yes | off |\n", "", 1),
		"another default":      strings.Replace(good, "`127.0.0.1:8081`", "`127.0.0.1:8080`", 1),
		"flag only in README":  strings.Replace(good, "\n\nafter", "\n| `-gone` | yes | | off |\n\nafter", 1),
	} {
		if errs := checkExamplesREADME(bad, progs); len(errs) == 0 {
			t.Errorf("%s: a stale README passed the check", name)
		}
	}
}
