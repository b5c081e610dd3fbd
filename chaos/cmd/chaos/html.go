package main

import (
	"bytes"
	"fmt"
	"html/template"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/oncekey/oncekey/chaos"
	"github.com/oncekey/oncekey/chaos/internal/check"
	"github.com/oncekey/oncekey/chaos/internal/history"
)

// histories keeps, while the run goes, the calls of every operation a
// check found a violation of (check.SetObserver), for -html. Operations
// are named as the report names them ("<scenario>/<n>#<epoch>", or a key
// "<scenario>/<n>" for an invariant of the key), the suite's own names.
type histories struct {
	mu    sync.Mutex
	calls map[string][]history.Call // by the violation's Op
}

func newHistories() *histories { return &histories{calls: map[string][]history.Call{}} }

func (h *histories) observe(in check.Input, rep check.Report) {
	want := map[string]bool{}
	for _, v := range rep.Violations {
		if v.Op != "" {
			want[v.Op] = true
		}
	}
	if len(want) == 0 {
		return
	}
	got := map[string][]history.Call{}
	for _, c := range in.Calls {
		if op := c.Op(); want[op] {
			got[op] = append(got[op], c)
		}
		if want[c.Key] && c.Op() != c.Key {
			got[c.Key] = append(got[c.Key], c)
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for op, cs := range got {
		h.calls[op] = cs
	}
}

func (h *histories) get(op string) ([]history.Call, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	cs, ok := h.calls[op]
	return cs, ok
}

// unsafeName matches what a page's file name does not keep of an
// operation's name.
var unsafeName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// htmlSummary is index.html's data.
type htmlSummary struct {
	Report    chaos.Report
	Negative  string
	Scenarios []htmlScenario
	Pages     int
}

type htmlScenario struct {
	chaos.Result
	Status     string
	Faults     []string // "kind: n", fired first
	Unfired    []string
	Violations []htmlViolation
	// Timeline draws the scenario's infrastructure faults (Result.Timeline)
	// over its run.
	Timeline template.HTML
}

type htmlViolation struct {
	chaos.Violation
	Page    string // file name of the operation's page; "" without one
	Verdict string // porcupine's verdict on the operation's calls
}

// writeHTML writes -html's directory: a page of porcupine's visualization
// per operation with a violation (its calls, checked again with the
// checker's model) and index.html, the summary of the run linking to them.
// It returns the number of operation pages written.
func writeHTML(dir string, rep chaos.Report, h *histories, negative string) (int, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, err
	}
	sum := htmlSummary{Report: rep, Negative: negative}
	names := map[string]bool{"index": true}
	for _, r := range rep.Results {
		s := htmlScenario{Result: r, Status: status(r), Timeline: timelineSVG(r.Timeline, r.Duration, 0, 0)}
		if r.Skipped == "" {
			s.Unfired = r.Unfired()
		}
		kinds := make([]string, 0, len(r.Faults))
		for k := range r.Faults {
			kinds = append(kinds, k)
		}
		sort.Strings(kinds)
		for _, k := range kinds {
			s.Faults = append(s.Faults, fmt.Sprintf("%s: %d", k, r.Faults[k]))
		}
		// One page per operation: the scenario's violations of it are
		// noted on it.
		notes := map[string][]check.Violation{}
		var ops []string
		for _, v := range r.Violations {
			if v.Op == "" {
				continue
			}
			if _, ok := notes[v.Op]; !ok {
				ops = append(ops, v.Op)
			}
			notes[v.Op] = append(notes[v.Op], check.Violation(v))
		}
		pages, verdicts := map[string]string{}, map[string]string{}
		for _, op := range ops {
			calls, ok := h.get(op)
			if !ok {
				continue
			}
			name := unsafeName.ReplaceAllString(op, "_")
			for i := 2; names[name]; i++ {
				name = fmt.Sprintf("%s-%d", unsafeName.ReplaceAllString(op, "_"), i)
			}
			names[name] = true
			file := name + ".html"
			verdict, err := writeOpPage(filepath.Join(dir, file), r, op, calls, notes[op])
			if err != nil {
				return sum.Pages, err
			}
			pages[op], verdicts[op] = file, verdict
			sum.Pages++
		}
		for _, v := range r.Violations {
			s.Violations = append(s.Violations, htmlViolation{Violation: v, Page: pages[v.Op], Verdict: verdicts[v.Op]})
		}
		sum.Scenarios = append(sum.Scenarios, s)
	}
	var b bytes.Buffer
	if err := indexPage.Execute(&b, sum); err != nil {
		return sum.Pages, err
	}
	return sum.Pages, os.WriteFile(filepath.Join(dir, "index.html"), b.Bytes(), 0o644)
}

// writeOpPage writes porcupine's visualization of one operation's calls,
// with a header naming the operation, its violations and a link back to
// index.html.
func writeOpPage(path string, r chaos.Result, op string, calls []history.Call, notes []check.Violation) (string, error) {
	var page bytes.Buffer
	verdict, err := check.Visualize(&page, calls, notes, 10*time.Second)
	if err != nil {
		return "", err
	}
	// The faults in place while the operation's calls ran, above them.
	var from, to time.Duration
	for i, c := range calls {
		if i == 0 || c.Start < from {
			from = c.Start
		}
		if c.End > to {
			to = c.End
		}
	}
	var during []chaos.FaultSpan
	for _, f := range r.Timeline {
		if f.Start <= to && f.End >= from {
			during = append(during, f)
		}
	}
	var head bytes.Buffer
	if err := opHeader.Execute(&head, map[string]any{"Scenario": r.Scenario, "Op": op, "Notes": notes, "Verdict": verdict, "Calls": len(calls),
		"From": from, "To": to, "During": during, "Timeline": timelineSVG(r.Timeline, r.Duration, from, to)}); err != nil {
		return "", err
	}
	out := page.String()
	if i := strings.Index(out, "<body>"); i >= 0 {
		i += len("<body>")
		out = out[:i] + head.String() + out[i:]
	} else {
		out = head.String() + out
	}
	return verdict, os.WriteFile(path, []byte(out), 0o644)
}

func status(r chaos.Result) string {
	switch {
	case r.Skipped != "":
		return "skipped"
	case r.Error != "":
		return "error"
	case len(r.Violations) > 0:
		return "violations"
	case len(r.Unfired()) > 0:
		return "unfired faults"
	}
	return "ok"
}

// Timeline geometry: a lane per kind of fault.
const (
	timelineWidth = 900
	timelineLabel = 230
	timelineLane  = 16
)

// timelineSVG draws spans over a run of length total: a lane per kind,
// a bar per fault from its start to its heal (a title gives both); from
// and to, when to is positive, mark an operation's calls. Empty without
// spans.
func timelineSVG(spans []chaos.FaultSpan, total, from, to time.Duration) template.HTML {
	if len(spans) == 0 {
		return ""
	}
	for _, f := range spans {
		total = max(total, f.End)
	}
	total = max(total, to, time.Millisecond)
	var kinds []string
	lane := map[string]int{}
	for _, f := range spans {
		if _, ok := lane[f.Kind]; !ok {
			lane[f.Kind] = len(kinds)
			kinds = append(kinds, f.Kind)
		}
	}
	plot := float64(timelineWidth - timelineLabel)
	x := func(d time.Duration) float64 { return timelineLabel + plot*float64(d)/float64(total) }
	height := timelineLane*len(kinds) + 20
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="timeline" width="%d" height="%d" xmlns="http://www.w3.org/2000/svg" font-family="sans-serif" font-size="11">`, timelineWidth, height)
	if to > 0 {
		fmt.Fprintf(&b, `<rect x="%.1f" y="0" width="%.1f" height="%d" fill="#fde2e1"><title>this operation's calls, %v to %v</title></rect>`,
			x(from), max(x(to)-x(from), 1), height-20, ms(from), ms(to))
	}
	for i, k := range kinds {
		y := i * timelineLane
		fmt.Fprintf(&b, `<text x="0" y="%d">%s</text>`, y+12, template.HTMLEscapeString(k))
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#eee"/>`, timelineLabel, y+8, timelineWidth, y+8)
	}
	for _, f := range spans {
		y := lane[f.Kind] * timelineLane
		fmt.Fprintf(&b, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="#c0392b" fill-opacity="0.7"><title>%s at %v for %v</title></rect>`,
			x(f.Start), y+2, max(x(f.End)-x(f.Start), 1.5), timelineLane-4, template.HTMLEscapeString(f.Kind), ms(f.Start), ms(f.End-f.Start))
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d">0</text><text x="%d" y="%d" text-anchor="end">%v</text></svg>`,
		timelineLabel, height-4, timelineWidth, height-4, ms(total))
	return template.HTML(b.String()) // every string in it is escaped above
}

func ms(d time.Duration) string { return d.Round(time.Millisecond).String() }

var opHeader = template.Must(template.New("op").Funcs(template.FuncMap{"ms": ms,
	"sub": func(a, b time.Duration) time.Duration { return a - b }}).Parse(`
<div style="font-family: sans-serif; margin: 8px 0 16px">
  <p><a href="index.html">&larr; summary</a></p>
  <h1 style="font-size: 1.3em">{{.Op}} <small>({{.Scenario}}, {{.Calls}} calls; porcupine: {{.Verdict}})</small></h1>
  <ul>{{range .Notes}}
    <li><b>{{.Invariant}}</b>: {{.Detail}}</li>{{end}}
  </ul>
  {{if .Timeline}}<h2 style="font-size: 1.1em">Faults while its calls ran ({{ms .From}} to {{ms .To}})</h2>
  {{.Timeline}}
  <ul>{{range .During}}
    <li>{{.Kind}} at {{ms .Start}} for {{ms (sub .End .Start)}}</li>{{else}}<li>none</li>{{end}}
  </ul>{{end}}
  <p>Each line is a client. Calls that change nothing (no effect, fenced) are grey annotations; the checker's violations are red, after the last call. A call with a question mark was ambiguous (it may or may not have applied) and has an open end.</p>
</div>
`))

var indexPage = template.Must(template.New("index").Funcs(template.FuncMap{"ms": ms}).Parse(`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>oncekey chaos: {{.Report.Violations}} violations</title>
<style>
body { font-family: sans-serif; margin: 2em; }
table { border-collapse: collapse; margin-bottom: 1.5em; }
th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: left; vertical-align: top; }
.ok { color: #1e7e34; } .violations, .error, .unfired { color: #c0392b; font-weight: bold; } .skipped { color: #888; }
</style>
</head>
<body>
<h1>oncekey chaos run</h1>
<p>Seed {{.Report.Seed}}, lease {{ms .Report.Lease}}, {{.Report.Iterations}} operations per scenario, {{.Report.Clients}} clients each, {{ms .Report.Duration}} in all.{{if .Negative}} Negative control: <b>{{.Negative}}</b> (a deliberately broken store; violations are expected).{{end}}</p>
<p><b>{{.Report.Violations}}</b> violations; {{.Pages}} operation pages.</p>
<table>
<tr><th>scenario</th><th>status</th><th>operations</th><th>calls</th><th>faults fired</th><th>violations</th><th>duration</th></tr>
{{range .Scenarios}}<tr>
<td><a href="#{{.Scenario}}">{{.Scenario}}</a></td>
<td class="{{if eq .Status "unfired faults"}}unfired{{else}}{{.Status}}{{end}}">{{.Status}}</td>
<td>{{.Iterations}}</td><td>{{.Operations}}</td>
<td>{{.FaultsTotal}}{{if .Faults}}<br><small>{{range $i, $f := .Faults}}{{if $i}}, {{end}}{{$f}}{{end}}</small>{{end}}{{if .Unfired}}<br><small>never fired: {{range $i, $f := .Unfired}}{{if $i}}, {{end}}{{$f}}{{end}}</small>{{end}}{{with .Repeated}}<br><small>{{.Fault}} {{.Fired}} times ({{.Required}} required)</small>{{end}}</td>
<td>{{len .Violations}}</td><td>{{ms .Duration}}</td>
</tr>
{{end}}</table>
{{range .Scenarios}}
<h2 id="{{.Scenario}}">{{.Scenario}}</h2>
<p>{{.Forces}}</p>
{{if .Skipped}}<p class="skipped">Skipped: {{.Skipped}}</p>{{end}}
{{if .Error}}<p class="error">Could not run: {{.Error}}</p>{{end}}
{{if .Timeline}}<p>Its faults over the run ({{len .Result.Timeline}}; hover a bar for when and how long):</p>
{{.Timeline}}{{end}}
{{if .Violations}}<table>
<tr><th>invariant</th><th>operation</th><th>detail</th><th>porcupine</th></tr>
{{range .Violations}}<tr><td>{{.Invariant}}</td><td>{{if .Page}}<a href="{{.Page}}">{{.Op}}</a>{{else}}{{.Op}}{{end}}</td><td>{{.Detail}}</td><td>{{.Verdict}}</td></tr>
{{end}}</table>
{{else if not (or .Skipped .Error)}}<p class="ok">No violations ({{.Acknowledged}} operations acknowledged{{if .Inconclusive}}, {{.Inconclusive}} linearizability searches inconclusive{{end}}).</p>{{end}}
{{end}}
</body>
</html>
`))
