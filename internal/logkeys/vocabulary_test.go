package logkeys

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// libraryModules are the library's modules, by folder from the repository
// root: the log lines and errors of their packages are held to the
// vocabulary. The tool modules (chaos, bench, examples, cmd/oncekey) and
// the test kits' modules (claim/claimtest, testkit/containers, folders
// named internal) are not the library.
var libraryModules = []string{".", "durable/sqlite", "claim/claimgrpc", "claim/claimnats", "claim/claimamqp", "claim/claimkafka", "claim/claimriver"}

// notLibraryErrors are the folders of the library modules whose errors are
// not the library's: its commands and test kits. Their log calls are
// checked all the same.
var notLibraryErrors = []string{"internal/cmd", "testkit"}

// prefixes are the error prefixes a package allows, by its folder from the
// repository root, besides a leading %w (a wrapped error, which carries its
// own prefix): the exceptions the package documentation lists. A package
// not here is held to its name, a colon and a space.
var prefixes = map[string][]string{
	"durable/postgres": {"durable/postgres: "},
	"durable/sqlite":   {"durable/sqlite: "},
	// The setters every adapter wraps in its own ErrConfig name the
	// adapter's option.
	"claim/driver/settle": {"settle: ", "WithRetryAfter: ", "WithFinishTimeout: ", "WithLogger: "},
	// And consume's errors about a broker start with the adapter's name
	// (Broker.Name), or the option's (set).
	"claim/driver/consume": {"consume: ", "WithRetryDelay: ", "WithUncertainDelay: ", "WithDeliveryLimit: ", "%s: "},
}

// opaqueLists are the names of key-value lists a log call may spread
// without the test reading them here: a delivery's location
// (consume.Message.Where, Broker.Where), whose keys are read where the
// adapter's Where function builds them.
var opaqueLists = map[string]bool{"Where": true, "where": true}

// source is one parsed file of the library.
type source struct {
	dir    string // its package's folder from the repository root, slash-separated
	name   string // its path from the repository root
	module string // its module's folder from the repository root
	file   *ast.File
}

// TestLogKeysInVocabulary reads the keys of every log call of the library.
func TestLogKeysInVocabulary(t *testing.T) {
	fset, files := library(t)
	vocab, consts := vocabulary(t)
	problems, calls := logKeyProblems(fset, files, vocab, consts)
	for _, p := range problems {
		t.Error(p)
	}
	// The check reads logger calls by the declared type of their
	// receivers: a library with loggers and no call found means the
	// check no longer sees them.
	if calls < 40 {
		t.Errorf("%d log calls found in the library; the check does not see them", calls)
	}
	t.Logf("%d log calls checked in %d files", calls, len(files))
}

// TestLogKeysReportsUnknownKey is the negative control of
// TestLogKeysInVocabulary: a source with bad keys is reported.
func TestLogKeysReportsUnknownKey(t *testing.T) {
	const src = `package bad

import (
	"log/slog"

	"github.com/oncekey/oncekey/internal/logkeys"
)

type worker struct{ log *slog.Logger }

func (w worker) run(err error) {
	w.log.Warn("m", "op", 1, "error", err)
	w.log.Info("m", logkeys.Op, 1, logkeys.Err, err)
	slog.Default().Info("m", slog.String("operation_id", "x"))
	w.log.With("tenant", "t").Info("m")
	args := []any{logkeys.Generation, 1}
	args = append(args, "key", 2)
	w.log.Error("m", args...)
	var dynamic string
	w.log.Debug("m", dynamic, 3)
	newLogger().Info("m", "op", 4)
}
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "bad.go", src, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	vocab, consts := vocabulary(t)
	problems, calls := logKeyProblems(fset, []source{{dir: "bad", name: "bad.go", file: f}}, vocab, consts)
	if calls != 8 { // six log calls, a With and an Attr
		t.Errorf("%d log calls found, want 8", calls)
	}
	got := strings.Join(problems, "\n")
	for _, want := range []string{`key "error"`, `key "operation_id"`, `key "tenant"`, `key "key"`, "bad.go:20:19: a key that is not a string constant",
		"bad.go:21:2: a log call on newLogger, which this check does not know"} {
		if !strings.Contains(got, want) {
			t.Errorf("not reported: %s; reports:\n%s", want, got)
		}
	}
	for _, ok := range []string{`"op"`, `"err"`, `"generation"`} {
		if strings.Contains(got, ok) {
			t.Errorf("%s reported, but it is in the vocabulary:\n%s", ok, got)
		}
	}
	if len(problems) != 6 {
		t.Errorf("%d reports, want 6:\n%s", len(problems), got)
	}

	// In this module, which imports this package, a key is a constant.
	problems, _ = logKeyProblems(fset, []source{{dir: "claim/bad", name: "bad.go", module: ".", file: f}}, vocab, consts)
	got = strings.Join(problems, "\n")
	for _, want := range []string{`bad.go:12:18: key "op" written as a string`, `bad.go:17:22: key "key" written as a string`} {
		if !strings.Contains(got, want) {
			t.Errorf("in the root module, not reported: %s; reports:\n%s", want, got)
		}
	}
}

// TestErrorPrefixes reads the text of every errors.New and fmt.Errorf of
// the library's packages.
func TestErrorPrefixes(t *testing.T) {
	fset, files := library(t)
	problems, n := errorPrefixProblems(fset, errorScope(files))
	for _, p := range problems {
		t.Error(p)
	}
	if n < 100 {
		t.Errorf("%d error texts found in the library; the check does not see them", n)
	}
	t.Logf("%d error texts checked", n)
}

// TestErrorPrefixesReportsWrongPrefix is the negative control of
// TestErrorPrefixes: texts with another package's prefix, or none, are
// reported.
func TestErrorPrefixesReportsWrongPrefix(t *testing.T) {
	const good = `package widget

import (
	"errors"
	"fmt"
)

var errBase = errors.New("widget: base")

func f(n int) error {
	if n == 0 {
		return fmt.Errorf("%w: zero", errBase)
	}
	return fmt.Errorf("widget: "+"%d", n)
}
`
	const bad = `package widget

import (
	stderrors "errors"
	"fmt"
)

var errOther = stderrors.New("oncekey: base")

func g(format string) error {
	_ = fmt.Errorf("claim: %v", 1)
	_ = fmt.Errorf("wid: %v", 1)
	return fmt.Errorf(format)
}
`
	fset := token.NewFileSet()
	var files []source
	for i, src := range []string{good, bad} {
		name := fmt.Sprintf("widget/f%d.go", i)
		f, err := parser.ParseFile(fset, name, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, source{dir: "widget", name: name, file: f})
	}
	problems, n := errorPrefixProblems(fset, files)
	if n != 7 {
		t.Errorf("%d error texts found, want 7", n)
	}
	got := strings.Join(problems, "\n")
	for _, want := range []string{`f1.go:8:30: "oncekey: base"`, `f1.go:11:17: "claim: %v"`, `f1.go:12:17: "wid: %v"`, "f1.go:13:20: an error text that is not a string constant"} {
		if !strings.Contains(got, want) {
			t.Errorf("not reported: %s; reports:\n%s", want, got)
		}
	}
	if strings.Contains(got, "f0.go") {
		t.Errorf("a text with its package's prefix or a leading %%w reported:\n%s", got)
	}
	// The exceptions apply by folder: the stores' prefix is their path.
	f, err := parser.ParseFile(fset, "durable/postgres/x.go", `package postgres
import "errors"
var (
	a = errors.New("durable/postgres: a")
	b = errors.New("postgres: b")
)
`, 0)
	if err != nil {
		t.Fatal(err)
	}
	problems, _ = errorPrefixProblems(fset, []source{{dir: "durable/postgres", name: "durable/postgres/x.go", file: f}})
	if len(problems) != 1 || !strings.Contains(problems[0], `"postgres: b"`) {
		t.Errorf("durable/postgres: reports %q, want the one of \"postgres: b\"", problems)
	}
}

// TestVocabularyDocumented holds the package documentation, the one place
// the keys are written down, to the constants: each key is there.
func TestVocabularyDocumented(t *testing.T) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "logkeys.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	doc := f.Doc.Text()
	vocab, _ := vocabulary(t)
	for k := range vocab {
		if !regexp.MustCompile(`(?m)^  - ([a-z_]+, )*` + regexp.QuoteMeta(k) + `[:,]`).MatchString(doc) {
			t.Errorf("key %q is not documented in the package comment's list", k)
		}
	}
}

// vocabulary returns the keys, and the keys by constant name, that
// logkeys.go declares.
func vocabulary(t *testing.T) (map[string]bool, map[string]string) {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "logkeys.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	vocab, consts := map[string]bool{}, map[string]string{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			v := s.(*ast.ValueSpec)
			for i, n := range v.Names {
				lit, ok := v.Values[i].(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					t.Fatalf("logkeys.go: %s is not a string literal", n.Name)
				}
				k, _ := strconv.Unquote(lit.Value)
				if vocab[k] {
					t.Fatalf("logkeys.go: key %q declared twice", k)
				}
				vocab[k], consts[n.Name] = true, k
			}
		}
	}
	if len(vocab) == 0 {
		t.Fatal("logkeys.go declares no key")
	}
	return vocab, consts
}

// library parses every non-test Go file of the library's modules. In the
// repository (a go.work beside the root go.mod) every module must be
// there; in a copy of the root module alone (the module cache) only it is.
func library(t *testing.T) (*token.FileSet, []source) {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil || !strings.HasPrefix(string(mod), "module github.com/oncekey/oncekey\n") {
		t.Fatalf("%s is not the root of module github.com/oncekey/oncekey (%v)", root, err)
	}
	_, err = os.Stat(filepath.Join(root, "go.work"))
	inRepo := err == nil
	fset := token.NewFileSet()
	var files []source
	for _, m := range libraryModules {
		dir := filepath.Join(root, filepath.FromSlash(m))
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
			if inRepo {
				t.Fatalf("library module %s: %v", m, err)
			}
			continue
		}
		n := len(files)
		err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if p == dir {
					return nil
				}
				if b := d.Name(); b == "testdata" || strings.HasPrefix(b, ".") || strings.HasPrefix(b, "_") {
					return filepath.SkipDir
				}
				if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
					return filepath.SkipDir // another module: in the list, or not the library
				}
				return nil
			}
			if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
				return nil
			}
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			rel = filepath.ToSlash(rel)
			src, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			f, err := parser.ParseFile(fset, rel, src, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			files = append(files, source{dir: path.Dir(rel), name: rel, module: m, file: f})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(files) == n {
			t.Fatalf("library module %s has no Go files", m)
		}
	}
	return fset, files
}

// errorScope returns the files of files whose errors are the library's.
func errorScope(files []source) []source {
	var out []source
	for _, s := range files {
		if !under(s.dir, notLibraryErrors) {
			out = append(out, s)
		}
	}
	return out
}

func under(dir string, folders []string) bool {
	for _, f := range folders {
		if dir == f || strings.HasPrefix(dir, f+"/") {
			return true
		}
	}
	return false
}

// importName returns the name file f imports package p by, "" when it does
// not import it.
func importName(f *ast.File, p string) string {
	for _, im := range f.Imports {
		if v, _ := strconv.Unquote(im.Path.Value); v == p {
			if im.Name != nil {
				return im.Name.Name
			}
			return path.Base(p)
		}
	}
	return ""
}

// logMethods are the methods of *slog.Logger (and functions of log/slog)
// that log or add attributes, with the index of their first key-value
// argument.
var logMethods = map[string]int{
	"Debug": 1, "Info": 1, "Warn": 1, "Error": 1,
	"DebugContext": 2, "InfoContext": 2, "WarnContext": 2, "ErrorContext": 2,
	"Log": 3, "LogAttrs": 3, "With": 0,
}

// attrFuncs are log/slog's constructors of an Attr: their first argument
// is its key.
var attrFuncs = map[string]bool{
	"String": true, "Int": true, "Int64": true, "Uint64": true, "Float64": true, "Bool": true,
	"Time": true, "Duration": true, "Any": true, "Group": true,
}

// isSlogLogger reports whether typ is *slog.Logger or slog.Logger, slog
// being the name log/slog is imported by.
func isSlogLogger(typ ast.Expr, slog string) bool {
	if s, ok := typ.(*ast.StarExpr); ok {
		typ = s.X
	}
	sel, ok := typ.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != "Logger" {
		return false
	}
	x, ok := sel.X.(*ast.Ident)
	return ok && slog != "" && x.Name == slog
}

// loggers are the names the library declares loggers by: variables,
// parameters and fields of type *slog.Logger, and functions and methods
// that return one.
type loggers struct{ values, funcs map[string]bool }

func findLoggers(files []source) loggers {
	l := loggers{values: map[string]bool{}, funcs: map[string]bool{}}
	for _, s := range files {
		slog := importName(s.file, "log/slog")
		if slog == "" {
			continue
		}
		returnsLogger := func(ft *ast.FuncType) bool {
			return ft.Results != nil && len(ft.Results.List) == 1 && isSlogLogger(ft.Results.List[0].Type, slog)
		}
		ast.Inspect(s.file, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.Field:
				if isSlogLogger(n.Type, slog) {
					for _, id := range n.Names {
						l.values[id.Name] = true
					}
				}
				if ft, ok := n.Type.(*ast.FuncType); ok && returnsLogger(ft) {
					for _, id := range n.Names {
						l.funcs[id.Name] = true
					}
				}
			case *ast.ValueSpec:
				if n.Type != nil && isSlogLogger(n.Type, slog) {
					for _, id := range n.Names {
						l.values[id.Name] = true
					}
				}
			case *ast.FuncDecl:
				if returnsLogger(n.Type) {
					l.funcs[n.Name.Name] = true
				}
			}
			return true
		})
	}
	return l
}

// isLogger reports whether e is a logger: a name declared as one, a call of
// a function that returns one, slog.Default(), slog.New(...) or a logger's
// With.
func (l loggers) isLogger(e ast.Expr, slog string) bool {
	switch e := e.(type) {
	case *ast.ParenExpr:
		return l.isLogger(e.X, slog)
	case *ast.Ident:
		return l.values[e.Name]
	case *ast.SelectorExpr:
		return l.values[e.Sel.Name]
	case *ast.CallExpr:
		switch fn := e.Fun.(type) {
		case *ast.Ident:
			return l.funcs[fn.Name]
		case *ast.SelectorExpr:
			if x, ok := fn.X.(*ast.Ident); ok && slog != "" && x.Name == slog {
				return fn.Sel.Name == "Default" || fn.Sel.Name == "New" || fn.Sel.Name == "With"
			}
			if fn.Sel.Name == "With" || fn.Sel.Name == "WithGroup" {
				return l.isLogger(fn.X, slog)
			}
			return l.funcs[fn.Sel.Name]
		}
	}
	return false
}

// terminal returns the last name of e: x of x, f of a.f, f of a.f(...).
func terminal(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.SelectorExpr:
		return e.Sel.Name
	case *ast.CallExpr:
		return terminal(e.Fun)
	case *ast.ParenExpr:
		return terminal(e.X)
	}
	return ""
}

// keyChecker reads the keys of the log calls of one file.
type keyChecker struct {
	fset    *token.FileSet
	vocab   map[string]bool
	consts  map[string]string
	slog    string // the name log/slog is imported by
	logkeys string // the name this package is imported by
	// constants says the file is in this module, which imports this
	// package: its keys are the constants, not their strings.
	constants bool
	problems  []string
}

func (c *keyChecker) report(n ast.Node, format string, args ...any) {
	c.problems = append(c.problems, fmt.Sprintf("%s: %s", c.fset.Position(n.Pos()), fmt.Sprintf(format, args...)))
}

// key checks a key: a string literal or a constant of this package.
func (c *keyChecker) key(e ast.Expr) {
	k, ok := "", false
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind == token.STRING {
			k, ok = unquote(e)
			if ok && c.constants {
				c.report(e, "key %q written as a string: this module uses the constants of internal/logkeys", k)
			}
		}
	case *ast.SelectorExpr:
		if x, isIdent := e.X.(*ast.Ident); isIdent && c.logkeys != "" && x.Name == c.logkeys {
			k, ok = c.consts[e.Sel.Name]
		}
	}
	switch {
	case !ok:
		c.report(e, "a key that is not a string constant: use a constant of internal/logkeys or its string")
	case !c.vocab[k]:
		c.report(e, "key %q is not in the vocabulary (internal/logkeys)", k)
	}
}

// isAttr reports whether e builds a slog.Attr; its key is checked where
// the walk meets the call.
func (c *keyChecker) isAttr(e ast.Expr) bool {
	call, ok := e.(*ast.CallExpr)
	if !ok {
		return false
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	x, ok := sel.X.(*ast.Ident)
	return ok && c.slog != "" && x.Name == c.slog && attrFuncs[sel.Sel.Name]
}

// pairs checks a list of alternating keys and values (an Attr counts as
// one element); spread says its last element is spread (x...), in body.
func (c *keyChecker) pairs(args []ast.Expr, spread bool, body ast.Node, seen map[string]bool) {
	for i := 0; i < len(args); {
		a := args[i]
		if spread && i == len(args)-1 {
			c.list(a, body, seen)
			return
		}
		if c.isAttr(a) {
			i++
			continue
		}
		c.key(a)
		i += 2
	}
}

// list checks the keys of a spread key-value list.
func (c *keyChecker) list(e ast.Expr, body ast.Node, seen map[string]bool) {
	switch e := e.(type) {
	case *ast.ParenExpr:
		c.list(e.X, body, seen)
	case *ast.CompositeLit:
		c.pairs(e.Elts, false, body, seen)
	case *ast.CallExpr:
		if fn, ok := e.Fun.(*ast.Ident); ok && fn.Name == "append" && len(e.Args) > 0 {
			c.list(e.Args[0], body, seen)
			c.pairs(e.Args[1:], e.Ellipsis.IsValid(), body, seen)
			return
		}
		c.report(e, "a spread key-value list this check cannot read")
	case *ast.Ident:
		if seen[e.Name] {
			return
		}
		seen[e.Name] = true
		found := false
		if body != nil {
			ast.Inspect(body, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.AssignStmt:
					if len(n.Lhs) != len(n.Rhs) {
						return true
					}
					for i, l := range n.Lhs {
						if id, ok := l.(*ast.Ident); ok && id.Name == e.Name {
							found = true
							c.list(n.Rhs[i], body, seen)
						}
					}
				case *ast.ValueSpec:
					for i, id := range n.Names {
						if id.Name == e.Name && i < len(n.Values) {
							found = true
							c.list(n.Values[i], body, seen)
						}
					}
				}
				return true
			})
		}
		if !found && !opaqueLists[e.Name] {
			c.report(e, "a spread key-value list %s this check cannot read", e.Name)
		}
	case *ast.SelectorExpr:
		if !opaqueLists[e.Sel.Name] {
			c.report(e, "a spread key-value list %s this check cannot read", e.Sel.Name)
		}
	default:
		c.report(e, "a spread key-value list this check cannot read")
	}
}

// logKeyProblems returns where files log with a key not in vocab (consts
// names its keys by constant), and how many log calls it read.
func logKeyProblems(fset *token.FileSet, files []source, vocab map[string]bool, consts map[string]string) ([]string, int) {
	lg := findLoggers(files)
	var problems []string
	calls := 0
	for _, s := range files {
		c := &keyChecker{fset: fset, vocab: vocab, consts: consts,
			slog: importName(s.file, "log/slog"), logkeys: importName(s.file, "github.com/oncekey/oncekey/internal/logkeys"),
			constants: s.module == "."}
		var stack []ast.Node
		body := func() ast.Node {
			for i := len(stack) - 1; i >= 0; i-- {
				switch n := stack[i].(type) {
				case *ast.FuncLit:
					return n.Body
				case *ast.FuncDecl:
					return n.Body
				}
			}
			return nil
		}
		ast.Inspect(s.file, func(n ast.Node) bool {
			if n == nil {
				stack = stack[:len(stack)-1]
				return true
			}
			stack = append(stack, n)
			switch n := n.(type) {
			case *ast.KeyValueExpr:
				// A broker's Where: the key-value lists it returns.
				if id, ok := n.Key.(*ast.Ident); ok && opaqueLists[id.Name] {
					if fl, ok := n.Value.(*ast.FuncLit); ok {
						ast.Inspect(fl.Body, func(m ast.Node) bool {
							if r, ok := m.(*ast.ReturnStmt); ok {
								for _, res := range r.Results {
									if id, ok := res.(*ast.Ident); ok && id.Name == "nil" {
										continue
									}
									c.list(res, fl.Body, map[string]bool{})
								}
							}
							return true
						})
					}
				}
			case *ast.CallExpr:
				sel, ok := n.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				x, _ := sel.X.(*ast.Ident)
				pkgFunc := x != nil && c.slog != "" && x.Name == c.slog
				if pkgFunc && attrFuncs[sel.Sel.Name] {
					calls++
					if len(n.Args) > 0 {
						c.key(n.Args[0])
					}
					if sel.Sel.Name == "Group" && len(n.Args) > 1 {
						c.pairs(n.Args[1:], n.Ellipsis.IsValid(), body(), map[string]bool{})
					}
					return true
				}
				first, isLog := logMethods[sel.Sel.Name]
				if !isLog {
					return true
				}
				if !pkgFunc && !lg.isLogger(sel.X, c.slog) {
					// A logger the check does not know (a name not
					// declared *slog.Logger) would go unread: one
					// named like a logger is reported.
					if strings.Contains(strings.ToLower(terminal(sel.X)), "log") {
						c.report(n, "a log call on %s, which this check does not know as a *slog.Logger", terminal(sel.X))
					}
					return true
				}
				calls++
				if first > len(n.Args) {
					return true
				}
				if sel.Sel.Name == "LogAttrs" {
					for _, a := range n.Args[first:] {
						if !c.isAttr(a) {
							c.report(a, "an attribute this check cannot read")
						}
					}
					return true
				}
				c.pairs(n.Args[first:], n.Ellipsis.IsValid(), body(), map[string]bool{})
			}
			return true
		})
		problems = append(problems, c.problems...)
	}
	sort.Strings(problems)
	return problems, calls
}

// errorPrefixProblems returns the errors.New and fmt.Errorf calls of files
// whose text does not start with a prefix its package allows, and how many
// it read.
func errorPrefixProblems(fset *token.FileSet, files []source) ([]string, int) {
	var problems []string
	n := 0
	for _, s := range files {
		errs, fm := importName(s.file, "errors"), importName(s.file, "fmt")
		allowed, ok := prefixes[s.dir]
		if !ok {
			allowed = []string{s.file.Name.Name + ": "}
		}
		ast.Inspect(s.file, func(node ast.Node) bool {
			call, ok := node.(*ast.CallExpr)
			if !ok || len(call.Args) == 0 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			x, ok := sel.X.(*ast.Ident)
			if !ok || !(errs != "" && x.Name == errs && sel.Sel.Name == "New" || fm != "" && x.Name == fm && sel.Sel.Name == "Errorf") {
				return true
			}
			n++
			text, ok := leading(call.Args[0])
			if !ok {
				problems = append(problems, fmt.Sprintf("%s: an error text that is not a string constant", fset.Position(call.Args[0].Pos())))
				return true
			}
			if strings.HasPrefix(text, "%w") {
				return true
			}
			for _, p := range allowed {
				if strings.HasPrefix(text, p) {
					return true
				}
			}
			problems = append(problems, fmt.Sprintf("%s: %q does not start with %s (package %s) or a wrapped error (%%w)",
				fset.Position(call.Args[0].Pos()), text, strings.Join(quoteAll(allowed), " or "), s.dir))
			return true
		})
	}
	sort.Strings(problems)
	return problems, n
}

// leading returns the start of a text: a string literal, or the leftmost
// literal of a concatenation.
func leading(e ast.Expr) (string, bool) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind == token.STRING {
			return unquote(e)
		}
	case *ast.BinaryExpr:
		if e.Op == token.ADD {
			return leading(e.X)
		}
	case *ast.ParenExpr:
		return leading(e.X)
	}
	return "", false
}

func unquote(l *ast.BasicLit) (string, bool) {
	s, err := strconv.Unquote(l.Value)
	return s, err == nil
}

func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = strconv.Quote(s)
	}
	return out
}
