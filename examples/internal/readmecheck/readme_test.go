package readmecheck

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
)

// imports are the packages a snippet may name without importing them. One
// that does not exist (or does not build) is an error only for a snippet
// that names it.
var imports = map[string]string{
	"context":     "context",
	"errors":      "errors",
	"fmt":         "fmt",
	"http":        "net/http",
	"time":        "time",
	"tls":         "crypto/tls",
	"x509":        "crypto/x509",
	"pgx":         "github.com/jackc/pgx/v5",
	"pgxpool":     "github.com/jackc/pgx/v5/pgxpool",
	"redis":       "github.com/redis/go-redis/v9",
	"canon":       "github.com/oncekey/oncekey/canon",
	"claim":       "github.com/oncekey/oncekey/claim",
	"claimhttp":   "github.com/oncekey/oncekey/claim/claimhttp",
	"claimclient": "github.com/oncekey/oncekey/claim/claimclient", // may not exist yet
	"durable":     "github.com/oncekey/oncekey/durable",
	"fence":       "github.com/oncekey/oncekey/fence",
	"lua":         "github.com/oncekey/oncekey/lua",
	"postgres":    "github.com/oncekey/oncekey/durable/postgres",
	"sqlite":      "github.com/oncekey/oncekey/durable/sqlite",
}

// prelude declares what the snippets take as given. Snippets run as
// function bodies after it, so they may shadow these names.
const prelude = `
var (
	ctx      context.Context
	pool     *pgxpool.Pool
	rdb      *redis.Client
	r        *http.Request
	w        http.ResponseWriter
	c        *claim.Claimer[pgx.Tx]
	req      claim.Request
	tenantID string
	key      string
	item     string
	body     []byte
	amount   int64
	handler  http.Handler
)

// gateway is a payment provider's client, as in examples/payments.
var gateway struct {
	Charge                  func(ctx context.Context, opID string, amount int64) (durable.Result, error)
	ErrTimeout, ErrNotCharged error
}
`

var codeBlock = regexp.MustCompile("(?ms)^```go\\n(.*?)^```")

// snippet is one ```go block of a Markdown file.
type snippet struct {
	line int // 1-based line of its first code line
	code string
}

func snippets(md string) []snippet {
	var out []snippet
	for _, m := range codeBlock.FindAllStringSubmatchIndex(md, -1) {
		out = append(out, snippet{line: strings.Count(md[:m[2]], "\n") + 1, code: md[m[2]:m[3]]})
	}
	return out
}

// source wraps s as a file of package readme: imports, the prelude, and the
// snippet as a function body, with a line directive so errors name the
// README's lines. A snippet that starts with "package" is a whole file and
// is taken as it is.
func source(file string, s snippet) string {
	if strings.HasPrefix(strings.TrimSpace(s.code), "package ") {
		return fmt.Sprintf("//line %s:%d\n%s", file, s.line, s.code)
	}
	var b strings.Builder
	b.WriteString("package readme\n\nimport (\n")
	for name, path := range imports {
		// Only the packages named, so a missing one fails only the
		// snippets that use it.
		if regexp.MustCompile(`\b` + name + `\.`).MatchString(prelude + s.code) {
			fmt.Fprintf(&b, "\t%s %q\n", name, path)
		}
	}
	b.WriteString(")\n")
	b.WriteString(prelude)
	fmt.Fprintf(&b, "\nfunc snippet() {\n//line %s:%d\n%s\n}\n", file, s.line, s.code)
	return b.String()
}

var (
	exportOnce sync.Once
	exportData map[string]string // import path to export data file
	exportErr  error
)

// exports builds (or takes from the build cache) the export data of the
// packages snippets may import, with their dependencies.
func exports() (map[string]string, error) {
	exportOnce.Do(func() {
		args := []string{"list", "-e", "-export", "-deps", "-f", "{{.ImportPath}}={{.Export}}"}
		for _, p := range imports {
			args = append(args, p)
		}
		cmd := exec.Command("go", args...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			exportErr = fmt.Errorf("go list: %v\n%s", err, stderr.String())
			return
		}
		exportData = map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if path, file, ok := strings.Cut(line, "="); ok && file != "" {
				exportData[path] = file
			}
		}
	})
	return exportData, exportErr
}

// check type-checks s and returns its hard errors: an unused variable or
// import is a soft error and is not reported, since snippets are fragments.
func check(t *testing.T, file string, s snippet) []error {
	t.Helper()
	data, err := exports()
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, file, source(file, s), parser.SkipObjectResolution)
	if err != nil {
		return []error{err}
	}
	var errs []error
	conf := types.Config{
		Importer: importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
			file, ok := data[path]
			if !ok {
				return nil, fmt.Errorf("no export data for package %s: add it to imports in readme_test.go, or make it build", path)
			}
			return os.Open(file)
		}),
		Error: func(err error) {
			if te, ok := err.(types.Error); ok && te.Soft {
				return
			}
			errs = append(errs, err)
		},
	}
	_, _ = conf.Check("readme", fset, []*ast.File{f}, nil)
	return errs
}

// markdown are the files whose Go snippets are checked, relative to the
// repository root, with the fewest snippets each must have (so a broken
// extraction or a lost usage section fails). chaos/README.md and
// bench/README.md took the README's chaos and performance material.
var markdown = []struct {
	file string
	min  int
}{
	{"README.md", 2},
	{"chaos/README.md", 0},
	{"bench/README.md", 0},
}

func TestREADMESnippetsCompile(t *testing.T) {
	for _, m := range markdown {
		md, err := os.ReadFile(filepath.Join("..", "..", "..", filepath.FromSlash(m.file)))
		if err != nil {
			t.Fatal(err)
		}
		all := snippets(string(md))
		if len(all) < m.min {
			t.Fatalf("%s has %d Go snippets, fewer than %d; the extraction is broken or the usage section is gone", m.file, len(all), m.min)
		}
		for _, s := range all {
			t.Run(fmt.Sprintf("%s:%d", m.file, s.line), func(t *testing.T) {
				for _, err := range check(t, m.file, s) {
					t.Error(err)
				}
			})
		}
	}
}

// The check must fail for a snippet that does not compile: a misspelt
// function, a wrong argument type, a syntax error, a missing package.
func TestREADMECheckCatchesBrokenSnippets(t *testing.T) {
	good := snippet{line: 1, code: "fp, err := canon.Request(r, canon.Options{Operation: \"POST /orders\"})\n"}
	if errs := check(t, "good.md", good); len(errs) != 0 {
		t.Fatalf("a correct snippet failed: %v", errs)
	}
	for _, code := range []string{
		"fp, err := canon.Requests(r, canon.Options{})\n",
		"fp, err := canon.Request(r, canon.Options{Operation: 42})\n",
		"fp, err := canon.Request(r, canon.Options{}\n",
		"x := nosuchpkg.Thing()\n",
		"c.NoSuchMethod(ctx)\n",
	} {
		if errs := check(t, "bad.md", snippet{line: 1, code: code}); len(errs) == 0 {
			t.Errorf("a broken snippet passed the check:\n%s", code)
		}
	}
	md := "text\n```go\nx := 1\n```\n\n```sh\nnot go\n```\n```go\ny := 2\n```\n"
	if got := snippets(md); len(got) != 2 || got[0].line != 3 || got[1].line != 10 || got[1].code != "y := 2\n" {
		t.Errorf("snippets(%q) = %+v", md, got)
	}
}
