package main

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"
)

// report is the -json report of a run.
type report struct {
	Started    time.Time        `json:"started"`
	Seconds    float64          `json:"seconds"`
	GoVersion  string           `json:"go_version"`
	GOMAXPROCS int              `json:"gomaxprocs"`
	NumCPU     int              `json:"num_cpu"`
	LoadAvg    [2]string        `json:"load_avg"` // /proc/loadavg at start and end
	Config     map[string]any   `json:"config"`
	Schema     string           `json:"schema"`     // the PostgreSQL schema of the run, dropped at exit
	Prefix     string           `json:"key_prefix"` // the Redis key prefix of the run, deleted at exit
	Workloads  []workloadReport `json:"workloads"`  // closed-loop
	// OpenLoop and Knee are the open-loop runs (-rate) and knee sweeps
	// (-knee).
	OpenLoop []openWorkloadReport `json:"open_loop,omitempty"`
	Knee     []kneeWorkloadReport `json:"knee,omitempty"`
	Failures []string             `json:"failures,omitempty"`

	cfg config
}

type workloadReport struct {
	Name     string          `json:"name"`
	About    string          `json:"about"`
	Rounds   int             `json:"rounds"`
	Variants []variantReport `json:"variants"`
	Extras   []extra         `json:"extras,omitempty"`
	// Missed says, for each target a variant missed, where the variant
	// differs from its floor in this run, or which floor bounds it.
	Missed []string `json:"missed,omitempty"`
}

type variantReport struct {
	Name        string  `json:"name"`
	Floor       bool    `json:"floor"`
	Rounds      int     `json:"rounds"`
	Requests    int64   `json:"requests"`
	Errors      int64   `json:"errors"`
	FirstError  string  `json:"first_error,omitempty"`
	Seconds     float64 `json:"seconds"`
	PerSecond   float64 `json:"per_second"`
	P50us       float64 `json:"p50_us"`
	P99us       float64 `json:"p99_us"`
	P999us      float64 `json:"p999_us"`
	MaxUs       float64 `json:"max_us"`
	RedisPerReq float64 `json:"redis_per_request"`
	SQLPerReq   float64 `json:"sql_per_request"`
	ClaimsPer   float64 `json:"durable_claims_per_request"`
	AllocsPer   float64 `json:"allocs_per_request"`
	// CPUus is this process's CPU time per request (user and system, the
	// harness included; the servers' CPU is not): on a shared machine the
	// figure least disturbed by other load.
	CPUus float64 `json:"cpu_us_per_request"`
	// BreakerOpened counts how often the Redis breaker of the library's
	// Claimer opened during the variant's rounds (Redis calls timing out
	// on a loaded machine): its requests then skipped Redis.
	BreakerOpened int64            `json:"breaker_opened,omitempty"`
	Outcomes      map[string]int64 `json:"outcomes"`
	Vs            string           `json:"vs,omitempty"`
	Ratio         float64          `json:"ratio,omitempty"`  // PerSecond / the PerSecond of Vs
	Target        float64          `json:"target,omitempty"` // at least: Ratio ≥ Target
	Meets         *bool            `json:"meets,omitempty"`
	// Costs compare the variant to floors by cost, each with a ceiling.
	Costs []costReport `json:"costs,omitempty"`
}

// costReport is a cost comparison: Ratio is the PerSecond of Vs over the
// variant's, how many times more a request of the variant costs than one
// of the floor Vs. Its Target, when set, is a ceiling (AtMost): Meets when
// Ratio ≤ Target. Without a target the ratio is reported only.
type costReport struct {
	Vs     string  `json:"vs"`
	Ratio  float64 `json:"ratio,omitempty"`
	Target float64 `json:"target,omitempty"`
	AtMost bool    `json:"at_most"`
	Meets  *bool   `json:"meets,omitempty"`
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func newReport(cfg config) *report {
	return &report{
		Started: time.Now(), GoVersion: runtime.Version(), GOMAXPROCS: runtime.GOMAXPROCS(0), NumCPU: runtime.NumCPU(),
		LoadAvg: [2]string{loadAvg()}, Config: cfg.describe(), cfg: cfg,
	}
}

// add records a finished workload.
func (rep *report) add(w *workload, extras []extra) {
	rounds := 0
	switch {
	case w.measure != nil:
		for _, v := range w.variants {
			rounds = max(rounds, v.st.rounds)
		}
	case len(w.variants) > 0:
		rounds, _ = plan(rep.cfg, len(w.variants))
	}
	wr := workloadReport{Name: w.name, About: w.about, Rounds: rounds, Extras: extras}
	rate := map[string]float64{}
	for _, v := range w.variants {
		s := &v.st
		vr := variantReport{Name: v.name, Floor: v.floor, Rounds: s.rounds, Requests: s.ops, Errors: s.errs,
			Seconds: s.elapsed.Seconds(), Vs: v.vs, Target: v.target, Outcomes: map[string]int64{},
			BreakerOpened: s.counts.opens}
		for _, c := range v.costs {
			vr.Costs = append(vr.Costs, costReport{Vs: c.floor, Target: c.atMost, AtMost: c.atMost > 0})
		}
		if s.firstErr != nil {
			vr.FirstError = s.firstErr.Error()
		}
		vr.PerSecond = throughput(v)
		if s.ops > 0 {
			n := float64(s.ops)
			vr.RedisPerReq = float64(s.counts.redis) / n
			vr.SQLPerReq = float64(s.counts.sql) / n
			vr.ClaimsPer = float64(s.counts.claims) / n
			vr.AllocsPer = float64(s.mallocs) / n
			vr.CPUus = us(s.cpu) / n
		}
		vr.P50us, vr.P99us, vr.P999us = us(s.h.quantile(0.5)), us(s.h.quantile(0.99)), us(s.h.quantile(0.999))
		vr.MaxUs = us(time.Duration(s.h.max))
		for k, c := range s.outcomes {
			if c > 0 {
				vr.Outcomes[outcomeNames[k]] = c
			}
		}
		rate[v.name] = vr.PerSecond
		wr.Variants = append(wr.Variants, vr)
	}
	for i := range wr.Variants {
		vr := &wr.Variants[i]
		if base := rate[vr.Vs]; vr.Vs != "" && base > 0 {
			vr.Ratio = vr.PerSecond / base
			if vr.Target > 0 {
				vr.Meets = boolp(vr.Ratio >= vr.Target)
			}
		}
		for j := range vr.Costs {
			c := &vr.Costs[j]
			if base := rate[c.Vs]; base > 0 && vr.PerSecond > 0 {
				c.Ratio = base / vr.PerSecond
				if c.Target > 0 {
					c.Meets = boolp(c.Ratio <= c.Target)
				}
			}
		}
		if vr.Errors > 0 {
			rep.Failures = append(rep.Failures, fmt.Sprintf("%s/%s: %d of %d requests failed; first: %s",
				w.name, vr.Name, vr.Errors, vr.Requests, vr.FirstError))
		}
		if vr.Requests == 0 {
			rep.Failures = append(rep.Failures, fmt.Sprintf("%s/%s: no request ran", w.name, vr.Name))
		}
	}
	for _, x := range extras {
		if x.Check && x.Failed {
			rep.Failures = append(rep.Failures, fmt.Sprintf("%s: check failed: %s = %g (want %s) %s", w.name, x.Name, x.Value, x.Target, x.Note))
		}
	}
	wr.Missed = missed(wr.Variants)
	for _, x := range extras {
		if x.Meets != nil && !*x.Meets && x.Bound != "" {
			wr.Missed = append(wr.Missed, fmt.Sprintf("%s (target %s): %s", x.Name, x.Target, x.Bound))
		}
	}
	rep.Workloads = append(rep.Workloads, wr)
}

// missed explains each target the variants missed, from the same run: for
// a throughput ratio, what a request of the variant spends beyond one of
// its floor (this process's CPU, Redis calls, statements, allocations; on
// a machine the client shares with the servers, that is where the time
// goes); for a cost ceiling, whether the variant's own floor already costs
// more than the ceiling (the protocol's statements on this record bound
// it, not the library), or the library's share misses it.
func missed(vs []variantReport) []string {
	find := func(name string) *variantReport {
		for i := range vs {
			if vs[i].Name == name {
				return &vs[i]
			}
		}
		return nil
	}
	costTo := func(v *variantReport, base string) *costReport {
		for i := range v.Costs {
			if v.Costs[i].Vs == base {
				return &v.Costs[i]
			}
		}
		return nil
	}
	var out []string
	for i := range vs {
		v := &vs[i]
		if f := find(v.Vs); v.Meets != nil && !*v.Meets && f != nil {
			line := fmt.Sprintf("%s is %.2f of %s (target ≥ %.2f); a request beyond the floor's: %+.0fµs of this process's CPU (%.0fµs against %.0fµs), %+.2f Redis calls, %+.2f statements, %+.0f allocations",
				v.Name, v.Ratio, f.Name, v.Target, v.CPUus-f.CPUus, v.CPUus, f.CPUus,
				v.RedisPerReq-f.RedisPerReq, v.SQLPerReq-f.SQLPerReq, v.AllocsPer-f.AllocsPer)
			// A floor that also makes the variant's Redis calls bounds it
			// more closely: say what the variant costs against it.
			for _, c := range v.Costs {
				if g := find(c.Vs); c.Target == 0 && g != nil && g.Floor && g.RedisPerReq >= v.RedisPerReq && g.RedisPerReq > f.RedisPerReq {
					line += fmt.Sprintf("; against %s, which also makes its %.2f Redis calls, it costs %.2f× (%+.0fµs of CPU)", g.Name, g.RedisPerReq, c.Ratio, v.CPUus-g.CPUus)
				}
			}
			out = append(out, line)
		}
		for _, c := range v.Costs {
			if c.Meets == nil || *c.Meets {
				continue
			}
			head := fmt.Sprintf("%s costs %.2f× %s (ceiling %.2f×)", v.Name, c.Ratio, c.Vs, c.Target)
			f := find(v.Vs)
			// A floor that also makes the variant's Redis calls, and has
			// its own cost to the same floor, bounds it more closely.
			for _, c2 := range v.Costs {
				if g := find(c2.Vs); c2.Target == 0 && f != nil && g != nil && g.Floor && g.RedisPerReq >= v.RedisPerReq && g.RedisPerReq > f.RedisPerReq && costTo(g, c.Vs) != nil {
					f = g
					break
				}
			}
			var fc *costReport
			if f != nil {
				fc = costTo(f, c.Vs)
			}
			switch {
			case v.Floor:
				out = append(out, head+": a floor, the protocol's statements alone with no library code; the record and its round trips bound it")
			case fc != nil && fc.Ratio > c.Target:
				out = append(out, fmt.Sprintf("%s: bounded by its floor, %s alone costs %.2f×, over the ceiling; the library adds %.2f× on top",
					head, f.Name, fc.Ratio, c.Ratio/fc.Ratio))
			case fc != nil:
				out = append(out, fmt.Sprintf("%s: its floor %s costs %.2f×, within the ceiling; the library's own share misses it (%.2f of the floor)",
					head, f.Name, fc.Ratio, ratio(fc.Ratio, c.Ratio)))
			default:
				out = append(out, head+": no floor in this run bounds it")
			}
		}
	}
	return out
}

func metMark(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}

// fmtDur prints a duration with three significant digits.
func fmtDur(d time.Duration) string {
	switch {
	case d <= 0:
		return "0"
	case d < time.Millisecond:
		return fmt.Sprintf("%.0fµs", us(d))
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.2fms", us(d)/1000)
	case d < time.Second:
		return fmt.Sprintf("%.1fms", us(d)/1000)
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}

func fmtUs(v float64) string { return fmtDur(time.Duration(v * float64(time.Microsecond))) }

// table writes the report: the closed-loop table with each workload's own
// figures and checks, the open-loop table, the knee sweeps, the failures.
func (rep *report) table(w io.Writer) {
	if len(rep.Workloads) > 0 {
		rep.closedTable(w)
	}
	if len(rep.OpenLoop) > 0 {
		rep.openTable(w)
	}
	if len(rep.Knee) > 0 {
		rep.kneeTable(w)
	}
	for _, f := range rep.Failures {
		fmt.Fprintf(w, "- FAILURE: %s\n", f)
	}
}

// closedTable writes the closed-loop runs as a markdown table, then each
// workload's own figures and checks.
func (rep *report) closedTable(w io.Writer) {
	if !slices.ContainsFunc(rep.Workloads, func(wr workloadReport) bool { return len(wr.Variants) > 0 }) {
		rep.extrasOnly(w)
		return
	}
	fmt.Fprintf(w, "| workload | variant | req/s | p50 | p99 | p99.9 | redis/req | sql/req | allocs/req | cpu/req | ratio | target |\n")
	fmt.Fprintf(w, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|---|---|\n")
	for _, wr := range rep.Workloads {
		for _, v := range wr.Variants {
			name := v.Name
			if v.Floor {
				name += " (floor)"
			}
			var ratios, targets []string
			if v.Vs != "" {
				ratios = append(ratios, fmt.Sprintf("%.2f of %s", v.Ratio, v.Vs))
			}
			if v.Meets != nil {
				targets = append(targets, fmt.Sprintf("≥ %.2f %s", v.Target, metMark(*v.Meets)))
			}
			for _, c := range v.Costs {
				ratios = append(ratios, fmt.Sprintf("costs %.2f× %s", c.Ratio, c.Vs))
				if c.Meets != nil {
					targets = append(targets, fmt.Sprintf("≤ %.2f× %s", c.Target, metMark(*c.Meets)))
				}
			}
			ratio, target := strings.Join(ratios, "; "), strings.Join(targets, "; ")
			errs := ""
			if v.Errors > 0 {
				errs = fmt.Sprintf(" [%d errors]", v.Errors)
			}
			if v.BreakerOpened > 0 {
				errs += fmt.Sprintf(" [breaker opened %d×]", v.BreakerOpened)
			}
			fmt.Fprintf(w, "| %s | %s%s | %.0f | %s | %s | %s | %.2f | %.2f | %.0f | %.0fµs | %s | %s |\n",
				wr.Name, name, errs, v.PerSecond, fmtUs(v.P50us), fmtUs(v.P99us), fmtUs(v.P999us),
				v.RedisPerReq, v.SQLPerReq, v.AllocsPer, v.CPUus, ratio, target)
		}
	}
	fmt.Fprintln(w)
	rep.extrasOnly(w)
	for _, wr := range rep.Workloads {
		for _, m := range wr.Missed {
			fmt.Fprintf(w, "- %s, missed: %s\n", wr.Name, m)
		}
	}
}

// extrasOnly writes each workload's own figures and checks, a line each.
func (rep *report) extrasOnly(w io.Writer) {
	for _, wr := range rep.Workloads {
		for _, x := range wr.Extras {
			val := fmt.Sprintf("%.3g", x.Value)
			if x.Unit == "µs" {
				val = fmtUs(x.Value)
			} else if x.Unit != "" {
				val += " " + x.Unit
			}
			mark := ""
			switch {
			case x.Check && x.Failed:
				mark = " FAILED"
			case x.Meets != nil && *x.Meets:
				mark = " (target " + x.Target + " met)"
			case x.Meets != nil:
				mark = " (target " + x.Target + " MISSED)"
			case x.Check:
				mark = " ok"
			}
			note := ""
			if x.Note != "" {
				note = "; " + x.Note
			}
			fmt.Fprintf(w, "- %s, %s: %s%s%s\n", wr.Name, x.Name, val, mark, note)
		}
	}
	fmt.Fprintln(w)
}

// openWorkloadReport is an open-loop run of a workload's variants at one
// rate (-rate).
type openWorkloadReport struct {
	Name        string              `json:"name"`
	Rate        float64             `json:"rate"` // intended requests per second
	MaxInflight int                 `json:"max_inflight"`
	Variants    []openVariantReport `json:"variants"`
}

type openVariantReport struct {
	Name       string  `json:"name"`
	Floor      bool    `json:"floor"`
	Rounds     int     `json:"rounds"`
	Scheduled  int64   `json:"scheduled"` // requests the arrival schedule held
	Sent       int64   `json:"sent"`      // of which started
	Dropped    int64   `json:"dropped"`   // of which not started: the in-flight cap was reached
	Errors     int64   `json:"errors"`
	FirstError string  `json:"first_error,omitempty"`
	Seconds    float64 `json:"seconds"` // from each round's start to its end or last completion (the later), summed
	// Achieved is the successful requests over Seconds.
	Achieved float64 `json:"achieved_per_second"`
	// The latencies run from each request's intended send time.
	P50us    float64          `json:"p50_us"`
	P99us    float64          `json:"p99_us"`
	P999us   float64          `json:"p999_us"`
	MaxUs    float64          `json:"max_us"`
	Outcomes map[string]int64 `json:"outcomes"`
}

// kneeWorkloadReport is a knee sweep of a workload's variants (-knee).
type kneeWorkloadReport struct {
	Name        string              `json:"name"`
	P99BoundUs  float64             `json:"p99_bound_us"`
	StepSeconds float64             `json:"step_seconds"` // per variant and rate
	MaxInflight int                 `json:"max_inflight"`
	Rates       []float64           `json:"rates"`
	Variants    []kneeVariantReport `json:"variants"`
}

type kneeVariantReport struct {
	Name  string     `json:"name"`
	Floor bool       `json:"floor"`
	Steps []kneeStep `json:"steps"`
	// Knee is the highest rate at which the step stayed within the bound
	// (0: none did); FirstOver the lowest at which it did not (0: none, so
	// Knee is a lower bound).
	Knee      float64 `json:"knee"`
	FirstOver float64 `json:"first_over,omitempty"`
	// Ratios compare the knee to the knees of the floors the variant is
	// compared to in the closed-loop run.
	Ratios []kneeRatio `json:"ratios,omitempty"`
}

// kneeRatio is the variant's knee over the floor Vs's knee. Bounded is
// false when either knee is only a lower bound (or zero): the ratio is
// then not the ratio of the true knees.
type kneeRatio struct {
	Vs      string  `json:"vs"`
	Ratio   float64 `json:"ratio"`
	Bounded bool    `json:"bounded"`
}

// addOpen records an open-loop run of vs.
func (rep *report) addOpen(name string, vs []*variant, stats []openStats) {
	wr := openWorkloadReport{Name: name, Rate: rep.cfg.rate, MaxInflight: rep.cfg.maxInflight}
	for i, v := range vs {
		s := &stats[i]
		vr := openVariantReport{Name: v.name, Floor: v.floor, Rounds: s.rounds, Scheduled: s.scheduled, Sent: s.sent,
			Dropped: s.dropped, Errors: s.errs, Seconds: s.elapsed.Seconds(), Achieved: s.achieved(),
			P50us: us(s.h.quantile(0.5)), P99us: us(s.h.quantile(0.99)), P999us: us(s.h.quantile(0.999)),
			MaxUs: us(time.Duration(s.h.max)), Outcomes: map[string]int64{}}
		if s.firstErr != nil {
			vr.FirstError = s.firstErr.Error()
			rep.Failures = append(rep.Failures, fmt.Sprintf("%s open-loop/%s: %d of %d requests failed; first: %s",
				name, v.name, s.errs, s.sent, vr.FirstError))
		}
		if s.sent == 0 {
			rep.Failures = append(rep.Failures, fmt.Sprintf("%s open-loop/%s: no request ran", name, v.name))
		}
		for k, c := range s.outcomes {
			if c > 0 {
				vr.Outcomes[outcomeNames[k]] = c
			}
		}
		wr.Variants = append(wr.Variants, vr)
	}
	rep.OpenLoop = append(rep.OpenLoop, wr)
}

// addKnee records a knee sweep of vs (the failed requests are recorded as
// the sweep goes).
func (rep *report) addKnee(name string, vs []*variant, steps [][]kneeStep) {
	cfg := rep.cfg
	wr := kneeWorkloadReport{Name: name, P99BoundUs: us(cfg.kneeP99), StepSeconds: cfg.kneeStep.Seconds(),
		MaxInflight: cfg.maxInflight, Rates: cfg.kneeRates}
	type knee struct{ at, over float64 }
	knees := map[string]knee{}
	for i, v := range vs {
		vr := kneeVariantReport{Name: v.name, Floor: v.floor, Steps: steps[i]}
		vr.Knee, vr.FirstOver = kneeOf(steps[i])
		knees[v.name] = knee{vr.Knee, vr.FirstOver}
		wr.Variants = append(wr.Variants, vr)
	}
	for i, v := range vs {
		floors := []string{}
		if v.vs != "" {
			floors = append(floors, v.vs)
		}
		for _, c := range v.costs {
			floors = append(floors, c.floor)
		}
		for _, f := range floors {
			fk, ok := knees[f]
			if !ok {
				continue
			}
			vk := knees[v.name]
			r := kneeRatio{Vs: f, Bounded: vk.over > 0 && fk.over > 0 && vk.at > 0 && fk.at > 0}
			if fk.at > 0 {
				r.Ratio = vk.at / fk.at
			}
			wr.Variants[i].Ratios = append(wr.Variants[i].Ratios, r)
		}
	}
	rep.Knee = append(rep.Knee, wr)
}

// openTable writes the open-loop runs as a markdown table.
func (rep *report) openTable(w io.Writer) {
	fmt.Fprintf(w, "| workload | variant | rate | achieved/s | sent | dropped | p50 | p99 | p99.9 | max |\n")
	fmt.Fprintf(w, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, wr := range rep.OpenLoop {
		for _, v := range wr.Variants {
			name := v.Name
			if v.Floor {
				name += " (floor)"
			}
			if v.Errors > 0 {
				name += fmt.Sprintf(" [%d errors]", v.Errors)
			}
			fmt.Fprintf(w, "| %s | %s | %g/s | %.0f | %d | %d | %s | %s | %s | %s |\n", wr.Name, name, wr.Rate, v.Achieved,
				v.Sent, v.Dropped, fmtUs(v.P50us), fmtUs(v.P99us), fmtUs(v.P999us), fmtUs(v.MaxUs))
		}
	}
	fmt.Fprintln(w)
}

// kneeTable writes the knee sweeps: per variant its knee and the p99 at
// each rate it ran, then the knee ratios.
func (rep *report) kneeTable(w io.Writer) {
	for _, wr := range rep.Knee {
		fmt.Fprintf(w, "| %s | knee (p99 ≤ %s) | first over |", wr.Name, fmtUs(wr.P99BoundUs))
		for _, r := range wr.Rates {
			fmt.Fprintf(w, " p99 at %g/s |", r)
		}
		fmt.Fprintf(w, "\n|---|--:|--:|%s\n", strings.Repeat("--:|", len(wr.Rates)))
		for _, v := range wr.Variants {
			name := v.Name
			if v.Floor {
				name += " (floor)"
			}
			knee, over := "none", "—"
			if v.Knee > 0 {
				knee = fmt.Sprintf("%g/s", v.Knee)
			}
			if v.FirstOver > 0 {
				over = fmt.Sprintf("%g/s", v.FirstOver)
			} else if v.Knee > 0 {
				knee = "≥ " + knee
			}
			fmt.Fprintf(w, "| %s | %s | %s |", name, knee, over)
			for i := range wr.Rates {
				cell := ""
				if i < len(v.Steps) {
					s := v.Steps[i]
					cell = fmtUs(s.P99us)
					if s.Dropped > 0 {
						cell += fmt.Sprintf(", %d dropped", s.Dropped)
					}
					if s.Errors > 0 {
						cell += fmt.Sprintf(", %d errors", s.Errors)
					}
					if s.Exceeded {
						cell = "**" + cell + "**"
					}
				}
				fmt.Fprintf(w, " %s |", cell)
			}
			fmt.Fprintln(w)
		}
		fmt.Fprintln(w)
		knees := map[string]string{}
		for _, v := range wr.Variants {
			knees[v.Name] = "none"
			if v.Knee > 0 {
				knees[v.Name] = fmt.Sprintf("%g/s", v.Knee)
			}
		}
		for _, v := range wr.Variants {
			for _, r := range v.Ratios {
				ratio := "n/a"
				if r.Ratio > 0 {
					ratio = fmt.Sprintf("%.2f", r.Ratio)
				}
				note := ""
				if !r.Bounded {
					note = "; a knee is missing or only a lower bound, so this is not the ratio of the knees"
				}
				fmt.Fprintf(w, "- %s knee, %s / %s: %s (%s / %s%s)\n", wr.Name, v.Name, r.Vs, ratio, knees[v.Name], knees[r.Vs], note)
			}
		}
		fmt.Fprintln(w)
	}
}
