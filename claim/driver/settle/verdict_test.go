package settle_test

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"slices"
	"testing"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/driver/settle"
)

// transports are the files where each transport reads the engine's report:
// each must switch on Report.Verdict once, naming every verdict.
var transports = []string{
	"../../claimhttp/middleware.go",
	"../../claimgrpc/server.go",
	"../../claimriver/claimriver.go",
	"../consume/consume.go",
}

// TestVerdictsHandledEverywhere fails when a transport reads a Report other
// than through one switch on its Verdict, leaves a verdict out of that
// switch, or gives it a default clause (where a new verdict would fall
// unnoticed).
func TestVerdictsHandledEverywhere(t *testing.T) {
	t.Parallel()
	want := verdictNames(t)
	if len(want) != len(settle.Verdicts()) {
		t.Fatalf("verdict.go declares %d verdicts, Verdicts() lists %d", len(want), len(settle.Verdicts()))
	}
	for _, path := range transports {
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		var switches []*ast.SwitchStmt
		ast.Inspect(f, func(n ast.Node) bool {
			if s, ok := n.(*ast.SwitchStmt); ok && callsVerdict(s.Tag) {
				switches = append(switches, s)
			}
			if sel, ok := n.(*ast.SelectorExpr); ok && (sel.Sel.Name == "Lost" || sel.Sel.Name == "Err") {
				if id, ok := sel.X.(*ast.Ident); ok && (id.Name == "rep" || id.Name == "r") && sel.Sel.Name == "Lost" {
					t.Errorf("%s: reads the report's Lost field (%s): read its Verdict", path, fset.Position(sel.Pos()))
				}
			}
			return true
		})
		if len(switches) != 1 {
			t.Errorf("%s: %d switches on Report.Verdict(), want 1", path, len(switches))
			continue
		}
		var got []string
		for _, c := range switches[0].Body.List {
			cc := c.(*ast.CaseClause)
			if cc.List == nil {
				t.Errorf("%s: the verdict switch has a default clause (%s)", path, fset.Position(cc.Pos()))
			}
			for _, e := range cc.List {
				if sel, ok := e.(*ast.SelectorExpr); ok {
					got = append(got, sel.Sel.Name)
				}
			}
		}
		for _, name := range want {
			if !slices.Contains(got, name) {
				t.Errorf("%s: the verdict switch does not answer settle.%s", path, name)
			}
		}
	}
}

func callsVerdict(e ast.Expr) bool {
	call, ok := e.(*ast.CallExpr)
	if !ok {
		return false
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	return ok && sel.Sel.Name == "Verdict"
}

// verdictNames returns the names of the Verdict constants verdict.go
// declares.
func verdictNames(t *testing.T) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "verdict.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		typed := false
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			if id, ok := vs.Type.(*ast.Ident); ok {
				typed = id.Name == "Verdict"
			}
			if typed {
				for _, n := range vs.Names {
					names = append(names, n.Name)
				}
			}
		}
	}
	return names
}

func TestReport_Verdict(t *testing.T) {
	t.Parallel()
	complete, fail := settle.Settlement{Kind: settle.Complete}, settle.Settlement{Kind: settle.Fail}
	uncertain, release := settle.Settlement{Kind: settle.Uncertain}, settle.Settlement{Kind: settle.Release}
	other := errors.New("disk full")
	for _, c := range []struct {
		r    settle.Report
		want settle.Verdict
	}{
		{settle.Report{Settlement: complete}, settle.Recorded},
		{settle.Report{Settlement: fail}, settle.Recorded},
		{settle.Report{Settlement: uncertain}, settle.RecordedUncertain},
		{settle.Report{Settlement: release}, settle.RecordedRelease},
		{settle.Report{Settlement: complete, Lost: claim.ErrFenced}, settle.Lost},
		{settle.Report{Settlement: complete, Err: fmt.Errorf("complete: %w", claim.ErrFenced)}, settle.Lost},
		{settle.Report{Settlement: complete, Err: settle.ErrPending}, settle.Pending},
		{settle.Report{Settlement: uncertain, Err: settle.ErrPending}, settle.Pending},
		{settle.Report{Settlement: release, Err: settle.ErrPending}, settle.ReleasePending},
		{settle.Report{Settlement: complete, Err: settle.ErrLeaseRanOut}, settle.RanOut},
		{settle.Report{Settlement: complete, Err: other}, settle.Unrecorded},
	} {
		if got := c.r.Verdict(); got != c.want {
			t.Errorf("%+v: verdict %v, want %v", c.r, got, c.want)
		}
	}
}
