package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/examples/internal/program"
)

// options are the command line: the flags every example has
// (program.Flags: -postgres, -redis, -data, -v).
type options struct {
	program.Flags
	// newKey returns a fresh idempotency key (uuid.NewString); tests pass
	// their own, to check that none is printed.
	newKey func() string
}

// parseOptions reads the command line; getenv supplies DATABASE_URL and
// REDIS_URL (os.Getenv; tests pass their own).
func parseOptions(args []string, getenv func(string) string, stderr io.Writer) (options, error) {
	o := options{newKey: uuid.NewString}
	fs := o.Flags.FlagSet("telemetry", stderr, getenv, "print the library's logs at debug level (by default info and above)")
	err := program.Parse(fs, args)
	return o, err
}

func main() { program.Main(parseOptions, run) }

// telemetry is the OpenTelemetry SDK as the example wires it: a tracer
// provider whose spans a recorder keeps in memory, and a meter provider
// read on demand by a manual reader. A service would register exporters
// instead (OTLP, Prometheus, stdouttrace): the Claimer sees only the
// providers.
type telemetry struct {
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
	mp     *sdkmetric.MeterProvider
}

func newTelemetry() *telemetry {
	t := &telemetry{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	t.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(t.spans))
	t.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(t.reader))
	return t
}

func (t *telemetry) shutdown(ctx context.Context) {
	_ = t.tp.Shutdown(ctx)
	_ = t.mp.Shutdown(ctx)
}

// run opens the services, builds a Claimer with the OpenTelemetry SDK's
// providers and a slog logger, runs the claims of the demo and prints
// their outcomes, then the spans and the metrics the library emitted.
func run(ctx context.Context, o options, out io.Writer) error {
	if o.newKey == nil {
		o.newKey = uuid.NewString
	}
	log := program.Logger(out, o.Verbose, slog.LevelInfo)
	b, err := program.OpenBackend(ctx, o.Backend, nil, out) // prints which stores it runs on
	if err != nil {
		return err
	}
	defer b.Close()
	tel := newTelemetry()
	defer tel.shutdown(context.WithoutCancel(ctx))
	opts := []claim.Option{
		claim.WithTracerProvider(tel.tp),
		claim.WithMeterProvider(tel.mp),
		claim.WithLogger(log),
	}
	// The in-process Redis (miniredis) does not expire keys with time, so
	// it would answer the takeover in progress for as long as the stalled
	// lease's key stays; the workflow part then runs on the durable store
	// alone.
	memRedis := o.Backend.RedisURL == ""
	// The durable store's transaction type decides the type parameter,
	// hence the two branches.
	if b.Postgres != nil {
		err = runDemo(ctx, b.Postgres, b.ClaimOptions(), opts, memRedis, o.newKey, out)
	} else {
		err = runDemo(ctx, b.SQLite, b.ClaimOptions(), opts, memRedis, o.newKey, out)
	}
	if err != nil {
		return err
	}
	if err := tel.tp.ForceFlush(ctx); err != nil {
		return err
	}
	printSpans(out, tel.spans.Ended())
	var rm metricdata.ResourceMetrics
	if err := tel.reader.Collect(ctx, &rm); err != nil {
		return err
	}
	printMetrics(out, rm)
	return nil
}

// runDemo builds the Claimers of the demo on store, with Redis (redisOpts)
// and the telemetry (opts), and runs it. With memRedis the workflow part
// gets a Claimer without Redis.
func runDemo[TTx any](ctx context.Context, store durable.Store[TTx], redisOpts, opts []claim.Option, memRedis bool, newKey func() string, out io.Writer) error {
	c, err := claim.New(store, append(slices.Clone(redisOpts), opts...)...)
	if err != nil {
		return err
	}
	if err := demo(ctx, c, newKey, out); err != nil {
		return err
	}
	flow := c
	if memRedis {
		fmt.Fprintln(out, "   (5 to 8 on the durable store alone: the in-process Redis does not expire a lease with time; name a Redis server with -redis to see it in front)")
		if flow, err = claim.New(store, opts...); err != nil {
			return err
		}
	}
	return takeover(ctx, flow, newKey, out)
}

// demo runs four claims through Do: a first request, which runs the
// business function; a duplicate sent while that function still runs,
// answered "in progress"; a retry after it finished, which replays the
// stored result; and the key reused with another request, refused. It
// prints each outcome with the operation identity (a hash), never the key.
func demo[TTx any](ctx context.Context, c *claim.Claimer[TTx], newKey func() string, out io.Writer) error {
	scope := durable.Scope{Tenant: "tenant-42", Operation: "POST /orders", Key: newKey()}
	req := claim.Request{Scope: scope, Fingerprint: "v1:book-x1"}
	// The first request's business function waits, holding the key, until
	// the duplicate, another caller, has had its answer.
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	placeOrder := func(ctx context.Context, _ TTx, _ claim.Op) (durable.Result, error) {
		once.Do(func() {
			close(started)
			select {
			case <-release:
			case <-ctx.Done():
			}
		})
		return durable.Result{StatusCode: 201, Body: []byte(`{"order":"ord_1"}`)}, nil
	}
	type answer struct {
		out claim.Outcome
		err error
	}
	firstDone := make(chan answer, 1)
	go func() {
		out, err := c.Do(ctx, req, placeOrder)
		firstDone <- answer{out, err}
	}()
	var dup claim.Outcome
	var dupErr error
	select {
	case <-started:
		// Redis holds the first request's lease and answers at once;
		// without Redis the store would, after the first commits.
		dup, dupErr = c.Do(ctx, req, func(context.Context, TTx, claim.Op) (durable.Result, error) {
			return durable.Result{}, errors.New("telemetry: the duplicate ran the business function")
		})
		close(release)
	case a := <-firstDone:
		firstDone <- a
	}
	a := <-firstDone
	first, err := a.out, a.err
	if err != nil {
		return fmt.Errorf("telemetry: first request: %w", err)
	}
	report(out, "1. first request", first, nil)
	report(out, "2. duplicate while it ran", dup, dupErr)
	replay, err := c.Do(ctx, req, placeOrder)
	if err != nil {
		return fmt.Errorf("telemetry: retry: %w", err)
	}
	report(out, "3. retry after it finished", replay, nil)
	other := claim.Request{Scope: scope, Fingerprint: "v1:pen-x2"}
	mis, err := c.Do(ctx, other, placeOrder)
	if err != nil && !errors.Is(err, claim.ErrMismatch) {
		return fmt.Errorf("telemetry: reused key: %w", err)
	}
	report(out, "4. the key reused for another order", mis, err)
	if first.Kind != claim.Executed || replay.Kind != claim.Replayed || !errors.Is(err, claim.ErrMismatch) {
		return fmt.Errorf("telemetry: unexpected outcomes: %v, %v, %v", first.Kind, replay.Kind, err)
	}
	return nil
}

// stallLease is the lease of the worker that stalls in takeover: short, so
// that the demo waits little for it to run out.
const stallLease = 300 * time.Millisecond

// takeover runs the workflow mode (Claim, then the lease's Complete) with
// a worker that stalls past its lease: another worker takes the operation
// over (the library logs it), completes it, and the stalled worker's late
// completion is fenced off.
func takeover[TTx any](ctx context.Context, c *claim.Claimer[TTx], newKey func() string, out io.Writer) error {
	req := claim.Request{
		Scope:       durable.Scope{Tenant: "tenant-42", Operation: "POST /shipments", Key: newKey()},
		Fingerprint: "v1:ship-ord_1", Lease: stallLease,
	}
	stalled, err := c.Claim(ctx, req)
	if err != nil || stalled.Kind != claim.Acquired {
		return fmt.Errorf("telemetry: stalled worker's claim: %v, %w", stalled.Kind, err)
	}
	report(out, "5. a worker claims another operation (Claim, lease "+stallLease.String()+") and stalls", stalled, nil)
	select {
	case <-time.After(stallLease + 100*time.Millisecond):
	case <-ctx.Done():
		return ctx.Err()
	}
	next, err := c.Claim(ctx, req)
	if err != nil || next.Kind != claim.Acquired {
		return fmt.Errorf("telemetry: takeover: %v, %w", next.Kind, err)
	}
	report(out, "6. another worker claims it after the lease ran out", next, nil)
	if err := next.Lease.Complete(ctx, durable.Result{StatusCode: 201, Body: []byte(`{"shipment":"shp_1"}`)}); err != nil {
		return fmt.Errorf("telemetry: completion: %w", err)
	}
	fmt.Fprintln(out, "7. it completes: stored")
	err = stalled.Lease.Complete(ctx, durable.Result{StatusCode: 201, Body: []byte(`{"shipment":"shp_2"}`)})
	if !errors.Is(err, claim.ErrFenced) {
		return fmt.Errorf("telemetry: the stalled worker's completion: %v, want claim.ErrFenced", err)
	}
	fmt.Fprintln(out, "8. the stalled worker wakes up and completes: refused (claim.ErrFenced), nothing written")
	return nil
}

func report(out io.Writer, what string, o claim.Outcome, err error) {
	switch {
	case errors.Is(err, claim.ErrMismatch):
		fmt.Fprintf(out, "%s: refused: the key holds another request (claim.ErrMismatch)\n", what)
	case err != nil:
		fmt.Fprintf(out, "%s: error: %v\n", what, err)
	case o.Kind == claim.Executed || o.Kind == claim.Replayed:
		src := ""
		if o.Kind == claim.Replayed {
			src = " from the durable store"
			if o.FromCache {
				src = " from Redis"
			}
		}
		fmt.Fprintf(out, "%s: %s%s, %d %s, operation %.16s\n", what, o.Kind, src, o.Result.StatusCode, o.Result.Body, o.OperationID)
	case o.Kind == claim.Acquired:
		fmt.Fprintf(out, "%s: %s, generation %d, operation %.16s\n", what, o.Kind, o.Lease.Token().Generation, o.OperationID)
	case o.Kind == claim.InProgress:
		fmt.Fprintf(out, "%s: %s, retry after %v, operation %.16s\n", what, o.Kind, o.RetryAfter, o.OperationID)
	default:
		fmt.Fprintf(out, "%s: %s, operation %.16s\n", what, o.Kind, o.OperationID)
	}
}

// printSpans prints the spans as trees, each child under its parent, in
// the order they started, with their oncekey attributes and events.
func printSpans(out io.Writer, spans []sdktrace.ReadOnlySpan) {
	fmt.Fprintf(out, "\nspans (%d):\n", len(spans))
	sort.SliceStable(spans, func(i, j int) bool { return spans[i].StartTime().Before(spans[j].StartTime()) })
	ids := map[string]bool{}
	for _, s := range spans {
		ids[s.SpanContext().SpanID().String()] = true
	}
	children := map[string][]sdktrace.ReadOnlySpan{}
	var roots []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if p := s.Parent(); p.IsValid() && ids[p.SpanID().String()] {
			children[p.SpanID().String()] = append(children[p.SpanID().String()], s)
		} else {
			roots = append(roots, s)
		}
	}
	var walk func(s sdktrace.ReadOnlySpan, depth int)
	walk = func(s sdktrace.ReadOnlySpan, depth int) {
		line := fmt.Sprintf("%s%s %v", strings.Repeat("  ", depth+1), s.Name(), s.EndTime().Sub(s.StartTime()).Round(10*time.Microsecond))
		if st := s.Status(); st.Code.String() != "Unset" {
			line += " status=" + st.Code.String()
			if st.Description != "" {
				line += ":" + st.Description
			}
		}
		fmt.Fprintln(out, line+attrs(s.Attributes()))
		for _, e := range s.Events() {
			fmt.Fprintf(out, "%s  event %s%s\n", strings.Repeat("  ", depth+1), e.Name, attrs(e.Attributes))
		}
		for _, c := range children[s.SpanContext().SpanID().String()] {
			walk(c, depth+1)
		}
	}
	for _, r := range roots {
		walk(r, 0)
	}
}

// printMetrics prints every metric the reader collected, with its data
// points.
func printMetrics(out io.Writer, rm metricdata.ResourceMetrics) {
	var lines []string
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			var points []string
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					points = append(points, fmt.Sprintf("%d%s", p.Value, set(p.Attributes)))
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					points = append(points, fmt.Sprintf("%d%s", p.Value, set(p.Attributes)))
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					points = append(points, fmt.Sprintf("count %d%s", p.Count, set(p.Attributes)))
				}
			default:
				points = append(points, fmt.Sprintf("%T", d))
			}
			slices.Sort(points)
			unit := ""
			if m.Unit != "" && m.Unit != "1" {
				unit = " (" + m.Unit + ")"
			}
			lines = append(lines, fmt.Sprintf("  %s%s: %s", m.Name, unit, strings.Join(points, "; ")))
		}
	}
	sort.Strings(lines)
	fmt.Fprintf(out, "\nmetrics (%d):\n", len(lines))
	for _, l := range lines {
		fmt.Fprintln(out, l)
	}
}

// attrs formats span attributes as " k=v ...".
func attrs(kv []attribute.KeyValue) string {
	var b strings.Builder
	for _, a := range kv {
		fmt.Fprintf(&b, " %s=%s", a.Key, a.Value.String())
	}
	return b.String()
}

// set formats a metric point's attributes as " {k=v, ...}".
func set(s attribute.Set) string {
	if s.Len() == 0 {
		return ""
	}
	var parts []string
	for _, a := range s.ToSlice() {
		parts = append(parts, fmt.Sprintf("%s=%s", a.Key, a.Value.String()))
	}
	return " {" + strings.Join(parts, ", ") + "}"
}
