// Command prodcheck proves that a production build of the library has no
// negative-control switch of the settlement engine. It builds the probe
// (a main package that links claim/driver/settle, claim/driver/consume
// and claim/claimhttp and calls the engine) without build tags, as every
// application builds it, and fails when the binary holds
// internal/settlemode's Break, its variable current, or any other variable
// of that package: without -tags oncekey_negative the engine's mode is the
// constant settlemode.Correct and nothing can change it. As a control it
// builds the probe again with -tags oncekey_negative and requires Break
// and current there, so the check cannot pass because the probe links
// nothing.
//
//	go run ./internal/cmd/prodcheck
//
// It runs inside the workspace (go.work); CI runs it.
package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

const (
	probe = "github.com/oncekey/oncekey/internal/cmd/prodcheck/probe"
	pkg   = "github.com/oncekey/oncekey/internal/settlemode."
)

func main() {
	if err := run(); err != nil {
		fmt.Println("prodcheck:", err)
		os.Exit(1)
	}
}

func run() error {
	dir, err := os.MkdirTemp("", "prodcheck")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	prod, err := symbols(dir, "prod")
	if err != nil {
		return err
	}
	var bad []string
	for _, s := range prod {
		if isSwitch(s) {
			bad = append(bad, s.String())
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("a build without -tags oncekey_negative can change the settlement engine's mode; it links:\n  %s", strings.Join(bad, "\n  "))
	}

	neg, err := symbols(dir, "negative", "-tags", "oncekey_negative")
	if err != nil {
		return err
	}
	for _, want := range []string{pkg + "Break", pkg + "current"} {
		if !has(neg, want) {
			return fmt.Errorf("control: the build with -tags oncekey_negative does not link %s; the probe does not link the engine's switch, so the check proves nothing", want)
		}
	}
	fmt.Printf("prodcheck: no settlemode.Break and no settlemode variable in a production build of the engine (%d symbols); the build with -tags oncekey_negative links both (control)\n", len(prod))
	return nil
}

// symbol is a line of go tool nm: its type letter and name.
type symbol struct{ typ, name string }

func (s symbol) String() string { return s.typ + " " + s.name }

// isSwitch reports whether s is a part of the switch: settlemode's Break
// (or anything under that name) or any of its variables (data or bss).
func isSwitch(s symbol) bool {
	if !strings.Contains(s.name, pkg) {
		return false
	}
	if strings.Contains(s.name, pkg+"Break") || strings.Contains(s.name, pkg+"current") {
		return true
	}
	switch s.typ {
	case "D", "d", "B", "b":
		return true
	}
	return false
}

func has(syms []symbol, name string) bool {
	for _, s := range syms {
		if s.name == name {
			return true
		}
	}
	return false
}

// symbols builds the probe with the go build flags into dir/name and
// returns the symbols go tool nm lists.
func symbols(dir, name string, flags ...string) ([]symbol, error) {
	bin := filepath.Join(dir, name)
	args := append(append([]string{"build", "-o", bin}, flags...), probe)
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	out, err := exec.Command("go", "tool", "nm", bin).Output()
	if err != nil {
		return nil, fmt.Errorf("go tool nm %s: %v", bin, err)
	}
	var syms []symbol
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		// "ADDRESS TYPE NAME", or "TYPE NAME" for an undefined symbol; a
		// name may hold spaces (a type's).
		if len(f) >= 3 && len(f[1]) == 1 {
			syms = append(syms, symbol{f[1], strings.Join(f[2:], " ")})
		} else if len(f) >= 2 && len(f[0]) == 1 {
			syms = append(syms, symbol{f[0], strings.Join(f[1:], " ")})
		}
	}
	if len(syms) == 0 {
		return nil, fmt.Errorf("go tool nm %s: no symbols", bin)
	}
	return syms, sc.Err()
}
