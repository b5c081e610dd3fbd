package lua_test

import (
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/oncekey/oncekey/lua"
)

// TestSources checks that Sources holds every .lua file of the folder, each
// opening with the header that describes it.
func TestSources(t *testing.T) {
	onDisk, err := filepath.Glob("*.lua")
	if err != nil {
		t.Fatal(err)
	}
	embedded, err := fs.Glob(lua.Sources, "*")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"claim.lua", "complete.lua", "record.lua", "release.lua", "renew.lua", "syncgen.lua"}
	if !slices.Equal(onDisk, want) || !slices.Equal(embedded, want) {
		t.Fatalf("scripts on disk %v, embedded %v; want %v", onDisk, embedded, want)
	}
	for _, name := range want {
		b, err := lua.Sources.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		src := string(b)
		parts := []string{"-- " + name + ": ", "-- KEYS[1]=", "-- ARGV[1]=", "-- Returns ", "-- Safe to re-run"}
		if name == "record.lua" { // the prelude: no keys or reply of its own
			parts = []string{"-- record.lua: ", "local function parse(v)"}
		}
		for _, part := range parts {
			if !strings.Contains(src, part) {
				t.Errorf("%s: header lacks %q", name, part)
			}
		}
	}
}

// Each script's first line says what it does.
func ExampleSources() {
	names, _ := fs.Glob(lua.Sources, "*.lua")
	for _, name := range names {
		src, _ := lua.Sources.ReadFile(name)
		first, _, _ := strings.Cut(string(src), "\n")
		fmt.Println(first)
	}
	// Output:
	// -- claim.lua: take the lease of one idempotency key, or say why not.
	// -- complete.lua: cache a finished result, and drop the lease if this owner
	// -- record.lua: the prelude put before each script when it is loaded (the
	// -- release.lua: drop the lease, only for the owner that holds it.
	// -- renew.lua: extend the lease, only for the owner that holds it.
	// -- syncgen.lua: give this owner's lease the database's generation.
}
