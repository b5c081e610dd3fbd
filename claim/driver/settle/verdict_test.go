package settle_test

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"slices"
	"strings"
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

// consumerAdapters are the consumer adapters' files: they read no Report
// (the engine's verdict becomes an action in consume, listed above), and
// map the engine's Action to their broker's in one switch naming every
// action, with no default.
var consumerAdapters = []string{
	"../../claimnats/claimnats.go",
	"../../claimamqp/claimamqp.go",
	"../../claimkafka/claimkafka.go",
}

// TestVerdictsHandledEverywhere_Consumers fails when a consumer adapter
// imports the engine (its own settle code), or does not map every action
// of consume in exactly one switch without a default clause.
func TestVerdictsHandledEverywhere_Consumers(t *testing.T) {
	t.Parallel()
	actions := []string{"Ack", "Retry", "Hold", "Terminate"}
	for _, path := range consumerAdapters {
		t.Run(path, func(t *testing.T) {
			for _, p := range actionSwitchProblems(t, path, actions) {
				t.Error(p)
			}
		})
	}
}

// A consumer adapter that settles on its own (imports the engine), or
// leaves an action to a default clause, is reported.
func TestVerdictsHandledEverywhere_ConsumersReportsBadAdapter(t *testing.T) {
	t.Parallel()
	const bad = `package bad

import "github.com/oncekey/oncekey/claim/driver/settle"

var _ settle.Report

func act(dec decision) {
	switch dec.Action {
	case Ack:
	case Retry, Hold:
	default:
	}
}
`
	ps := actionSwitchProblemsOf(t, "bad.go", bad, []string{"Ack", "Retry", "Hold", "Terminate"})
	got := fmt.Sprint(ps)
	for _, want := range []string{"imports the settlement engine", "default clause", "does not answer Terminate"} {
		if !strings.Contains(got, want) {
			t.Errorf("not reported: %s; reports: %v", want, ps)
		}
	}
}

func actionSwitchProblems(t *testing.T, path string, actions []string) []string {
	t.Helper()
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return actionSwitchProblemsOf(t, path, string(src), actions)
}

func actionSwitchProblemsOf(t *testing.T, path, src string, actions []string) []string {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, src, 0)
	if err != nil {
		t.Fatal(err)
	}
	var problems []string
	for _, imp := range f.Imports {
		if imp.Path.Value == `"github.com/oncekey/oncekey/claim/driver/settle"` {
			problems = append(problems, path+": imports the settlement engine: settle through consume")
		}
	}
	var switches []*ast.SwitchStmt
	ast.Inspect(f, func(n ast.Node) bool {
		if s, ok := n.(*ast.SwitchStmt); ok {
			if sel, ok := s.Tag.(*ast.SelectorExpr); ok && sel.Sel.Name == "Action" {
				switches = append(switches, s)
			}
		}
		return true
	})
	if len(switches) != 1 {
		return append(problems, fmt.Sprintf("%s: %d switches on a decision's Action, want 1", path, len(switches)))
	}
	var got []string
	for _, c := range switches[0].Body.List {
		cc := c.(*ast.CaseClause)
		if cc.List == nil {
			problems = append(problems, fmt.Sprintf("%s: the action switch has a default clause (%s)", path, fset.Position(cc.Pos())))
		}
		for _, e := range cc.List {
			if id, ok := e.(*ast.Ident); ok {
				got = append(got, id.Name)
			}
		}
	}
	for _, a := range actions {
		if !slices.Contains(got, a) {
			problems = append(problems, fmt.Sprintf("%s: the action switch does not answer %s", path, a))
		}
	}
	return problems
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
