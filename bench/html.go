package main

import (
	"bytes"
	"fmt"
	"html/template"
	"math"
	"os"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// percentiles are the latencies -html plots per variant, in microseconds.
type percentiles struct {
	name           string
	p50, p99, p999 float64
	floor          bool
}

// htmlChart is one figure of the -html page.
type htmlChart struct {
	Title   string
	Caption string
	SVG     template.HTML
}

// writeHTML writes the -html page: one self-contained HTML file with an
// inline SVG figure (drawn by gonum.org/v1/plot) per workload of the run:
// the p50, p99 and p99.9 latency of each variant, for the closed-loop
// workloads and the open-loop runs, and the knee sweeps' p99 against the
// achieved throughput of each variant at each step, with the p99 bound.
// No script, no style sheet or font is fetched: the file opens offline.
func writeHTML(path string, rep *report) error {
	var charts []htmlChart
	for _, w := range rep.Workloads {
		ps := make([]percentiles, 0, len(w.Variants))
		for _, v := range w.Variants {
			ps = append(ps, percentiles{name: v.Name, p50: v.P50us, p99: v.P99us, p999: v.P999us, floor: v.Floor})
		}
		c, err := percentileChart(w.Name+" (closed loop)", ps)
		if err != nil {
			return fmt.Errorf("bench: -html: %s: %w", w.Name, err)
		}
		c.Caption = w.About
		charts = append(charts, c)
	}
	for _, w := range rep.OpenLoop {
		ps := make([]percentiles, 0, len(w.Variants))
		for _, v := range w.Variants {
			ps = append(ps, percentiles{name: v.Name, p50: v.P50us, p99: v.P99us, p999: v.P999us, floor: v.Floor})
		}
		title := fmt.Sprintf("%s (open loop at %g/s)", w.Name, w.Rate)
		c, err := percentileChart(title, ps)
		if err != nil {
			return fmt.Errorf("bench: -html: %s: %w", title, err)
		}
		c.Caption = "Latency from each request's due time (no coordinated omission)."
		charts = append(charts, c)
	}
	for _, k := range rep.Knee {
		c, err := kneeChart(k)
		if err != nil {
			return fmt.Errorf("bench: -html: %s knee: %w", k.Name, err)
		}
		charts = append(charts, c)
	}
	var b bytes.Buffer
	err := htmlPage.Execute(&b, map[string]any{
		"Started": rep.Started.UTC().Format("2006-01-02 15:04:05 UTC"), "Seconds": rep.Seconds, "Go": rep.GoVersion,
		"GOMAXPROCS": rep.GOMAXPROCS, "NumCPU": rep.NumCPU, "Load": rep.LoadAvg, "Charts": charts, "Failures": rep.Failures,
	})
	if err != nil {
		return err
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}

// percentileChart plots the p50, p99 and p99.9 of each variant: one row
// per variant (floors marked), latency on a log axis. A variant without a
// latency (no request succeeded) has no points.
func percentileChart(title string, ps []percentiles) (htmlChart, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "latency (ms, log scale)"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = logTicks{}
	p.Legend.Top = true
	names := make([]string, len(ps))
	series := []struct {
		label string
		value func(percentiles) float64
	}{
		{"p50", func(x percentiles) float64 { return x.p50 }},
		{"p99", func(x percentiles) float64 { return x.p99 }},
		{"p99.9", func(x percentiles) float64 { return x.p999 }},
	}
	points := make([]plotter.XYs, len(series))
	lo, hi := math.Inf(1), math.Inf(-1)
	for i, x := range ps {
		// The first variant on top: NominalY counts from the bottom.
		row := float64(len(ps) - 1 - i)
		names[len(ps)-1-i] = x.name
		if x.floor {
			names[len(ps)-1-i] += " (floor)"
		}
		for s, se := range series {
			if v := se.value(x); v > 0 {
				points[s] = append(points[s], plotter.XY{X: v / 1000, Y: row})
				lo, hi = math.Min(lo, v/1000), math.Max(hi, v/1000)
			}
		}
	}
	p.NominalY(names...)
	p.Y.Padding = vg.Points(10)
	drawn := false
	for s, se := range series {
		if len(points[s]) == 0 {
			continue
		}
		drawn = true
		sc, err := plotter.NewScatter(points[s])
		if err != nil {
			return htmlChart{}, err
		}
		sc.GlyphStyle.Color = plotutil.Color(s)
		sc.GlyphStyle.Shape = plotutil.Shape(s)
		sc.GlyphStyle.Radius = vg.Points(4)
		p.Add(sc)
		p.Legend.Add(se.label, sc)
	}
	if !drawn {
		// A log axis needs a positive range: an empty chart spans 0.1-10ms.
		p.X.Min, p.X.Max = 0.1, 10
	} else {
		// Room on the right for the legend, and off the frame on the left.
		p.Add(plotter.NewGrid())
		p.X.Min, p.X.Max = lo/1.5, hi*4
	}
	return render(p, title, 9*vg.Inch, vg.Length(1.6+0.38*float64(max(len(ps), 2)))*vg.Inch)
}

// kneeChart plots a knee sweep: for each variant, the p99 of each step
// against the throughput achieved, both on log axes, with the p99 bound.
func kneeChart(k kneeWorkloadReport) (htmlChart, error) {
	title := k.Name + " knee (open loop)"
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "achieved throughput (requests/s, log scale)"
	p.Y.Label.Text = "p99 latency (ms, log scale)"
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker, p.Y.Tick.Marker = logTicks{}, logTicks{}
	p.Legend.Top, p.Legend.Left = true, true
	p.Add(plotter.NewGrid())
	minX, maxX := math.Inf(1), math.Inf(-1)
	bound := k.P99BoundUs / 1000
	for i, v := range k.Variants {
		var xys plotter.XYs
		for _, s := range v.Steps {
			if s.Achieved > 0 && s.P99us > 0 {
				xys = append(xys, plotter.XY{X: s.Achieved, Y: s.P99us / 1000})
				minX, maxX = math.Min(minX, s.Achieved), math.Max(maxX, s.Achieved)
			}
		}
		if len(xys) == 0 {
			continue
		}
		l, pts, err := plotter.NewLinePoints(xys)
		if err != nil {
			return htmlChart{}, err
		}
		l.Color, pts.Color = plotutil.Color(i), plotutil.Color(i)
		pts.Shape = plotutil.Shape(i)
		if v.Floor {
			l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		}
		p.Add(l, pts)
		label := v.Name
		if v.Floor {
			label += " (floor)"
		}
		if v.Knee > 0 {
			label += fmt.Sprintf(": knee %g/s", v.Knee)
			if v.FirstOver == 0 {
				label = strings.Replace(label, "knee ", "knee ≥ ", 1)
			}
		} else {
			label += ": no knee"
		}
		p.Legend.Add(label, l, pts)
	}
	if math.IsInf(minX, 1) {
		// No step with a throughput and a latency: an empty chart.
		minX, maxX = 1, 10
		p.Y.Min, p.Y.Max = 1, 100
	}
	// Padded, so that the 1-2-5 ticks on either side of the rates show.
	minX, maxX = minX/1.3, maxX*1.3
	p.X.Min, p.X.Max = minX, maxX
	if bound > 0 {
		b, err := plotter.NewLine(plotter.XYs{{X: minX, Y: bound}, {X: maxX, Y: bound}})
		if err != nil {
			return htmlChart{}, err
		}
		b.Color = plotutil.Color(7)
		b.Dashes = []vg.Length{vg.Points(2), vg.Points(2)}
		p.Add(b)
		p.Legend.Add(fmt.Sprintf("p99 bound %gms", bound), b)
	}
	c, err := render(p, title, 9*vg.Inch, 5*vg.Inch)
	c.Caption = fmt.Sprintf("Each point is a step of %gs per variant at one rate; a variant stops after two steps in a row over the bound (or with drops or errors). Knee: the highest rate whose step stayed within the bound.", k.StepSeconds)
	return c, err
}

// logTicks marks a log axis at 1, 2 and 5 times the powers of ten in its
// range, labelled, and at the other integer multiples, unlabelled
// (plot.LogTicks labels the powers of ten alone, none on a short range).
type logTicks struct{}

func (logTicks) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	if lo <= 0 || hi <= lo {
		return nil
	}
	for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
		base := math.Pow(10, e)
		for m := 1; m < 10; m++ {
			v := float64(m) * base
			if v < lo*(1-1e-9) || v > hi*(1+1e-9) {
				continue
			}
			t := plot.Tick{Value: v}
			if m == 1 || m == 2 || m == 5 {
				t.Label = strconv.FormatFloat(v, 'g', -1, 64)
			}
			ticks = append(ticks, t)
		}
	}
	return ticks
}

// render draws p as an SVG element for inline use (no XML prolog).
func render(p *plot.Plot, title string, w, h vg.Length) (htmlChart, error) {
	c := vgsvg.New(w, h)
	p.Draw(draw.New(c))
	var b bytes.Buffer
	if _, err := c.WriteTo(&b); err != nil {
		return htmlChart{}, err
	}
	svg := b.String()
	if i := strings.Index(svg, "<svg"); i >= 0 {
		svg = svg[i:]
	}
	// The SVG is gonum's own output, its text escaped by its SVG writer.
	return htmlChart{Title: title, SVG: template.HTML(svg)}, nil
}

var htmlPage = template.Must(template.New("bench").Parse(`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>oncekey bench {{.Started}}</title>
<style>
body { font-family: sans-serif; margin: 2em; max-width: 70em; }
figure { margin: 2em 0; }
figcaption { color: #555; max-width: 60em; }
svg { max-width: 100%; height: auto; }
.fail { color: #c0392b; font-weight: bold; }
</style>
</head>
<body>
<h1>oncekey bench</h1>
<p>Started {{.Started}}, {{printf "%.0f" .Seconds}}s; {{.Go}}, GOMAXPROCS {{.GOMAXPROCS}} of {{.NumCPU}} CPUs; load average {{index .Load 0}} at start, {{index .Load 1}} at end.</p>
{{range .Failures}}<p class="fail">Failure: {{.}}</p>
{{end}}{{if not .Charts}}<p>No workload finished: nothing to plot.</p>{{end}}
{{range .Charts}}<figure>
<h2>{{.Title}}</h2>
{{.SVG}}
{{if .Caption}}<figcaption>{{.Caption}}</figcaption>{{end}}
</figure>
{{end}}
</body>
</html>
`))
