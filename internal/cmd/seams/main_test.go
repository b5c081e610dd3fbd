package main

import (
	"go/parser"
	"go/token"
	"slices"
	"testing"
)

var mods = []module{
	{Path: "example.com/lib", Dir: "."},
	{Path: "example.com/lib/adapter", Dir: "adapter"},
	{Path: "example.com/lib/chaos", Dir: "chaos"},
	{Path: "example.com/lib/x/internal/testonly", Dir: "x/internal/testonly"},
}

func TestCheck(t *testing.T) {
	imports := map[string][]string{
		"example.com/lib/adapter": {
			"example.com/lib/claim",              // the library's API
			"example.com/lib/driver/settle",      // the seam
			"example.com/lib/adapter/internal/x", // its own internal
			"example.com/other/internal/y",       // outside the workspace
			"example.com/lib/internal/fastpath",  // the library's internal: caught
			"example.com/lib/claim/internal/z",   // caught
		},
	}
	got := check(mods, imports)
	want := []string{
		"example.com/lib/adapter imports example.com/lib/claim/internal/z (internal to example.com/lib)",
		"example.com/lib/adapter imports example.com/lib/internal/fastpath (internal to example.com/lib)",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("check = %q\nwant %q", got, want)
	}
	if got := check(mods, map[string][]string{"example.com/lib/adapter": {"example.com/lib/driver"}}); len(got) != 0 {
		t.Fatalf("check of a clean module = %q", got)
	}
}

func TestReleased(t *testing.T) {
	for _, m := range mods {
		want := m.Dir == "." || m.Dir == "adapter"
		if m.released() != want {
			t.Errorf("%s released = %v, want %v", m.Dir, m.released(), want)
		}
	}
}

// TestWorkspace runs the check on this repository: no released module
// imports another module's internal packages.
func TestWorkspace(t *testing.T) {
	ms, err := workspace()
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) < 2 {
		t.Fatalf("workspace = %v; want the library and its modules", ms)
	}
	imports := map[string][]string{}
	for _, m := range ms {
		if !m.released() {
			continue
		}
		if imports[m.Path], err = importsOf(m.abs); err != nil {
			t.Fatal(err)
		}
	}
	if bad := check(ms, imports); len(bad) > 0 {
		t.Fatalf("%d imports of another module's internal packages:\n%q", len(bad), bad)
	}
}

func TestAnyFuncVars(t *testing.T) {
	t.Parallel()
	src := `package p

import "time"

var (
	Retention func(claimer any, operation string) time.Duration
	InTx      func(fn func(tx interface{}) error) error
	Typed     func(operation string) time.Duration
	hidden    func(any)
	Value     any
)
`
	f, err := parser.ParseFile(token.NewFileSet(), "p.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, id := range anyFuncVarsIn(f) {
		got = append(got, id.Name)
	}
	if want := []string{"Retention", "InTx"}; !slices.Equal(got, want) {
		t.Fatalf("anyFuncVarsIn = %v, want %v", got, want)
	}
}
