package claim_test

import (
	"context"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	otelembedded "go.opentelemetry.io/otel/metric/embedded"
	"go.opentelemetry.io/otel/metric/noop"
)

// recorder is a MeterProvider that keeps what the Claimer records, so the
// metrics test needs no OpenTelemetry SDK (which would enter every user's
// module graph through the library's go.mod). Counters add up per name and
// attribute set; observable gauges keep the last value of a collection.
// Instruments the Claimer does not read back are the no-op ones.
type recorder struct {
	otelembedded.MeterProvider
	m *recMeter
}

func newRecorder() *recorder { return &recorder{m: &recMeter{sums: map[string]int64{}}} }

func (r *recorder) Meter(string, ...metric.MeterOption) metric.Meter { return r.m }

// Collect runs the registered callbacks and returns the values, keyed by
// "name|k=v|..." with the attributes in their set's (sorted) order.
func (r *recorder) Collect(ctx context.Context) (map[string]int64, error) {
	m := r.m
	m.mu.Lock()
	cbs := append([]metric.Callback(nil), m.callbacks...)
	m.mu.Unlock()
	for _, cb := range cbs {
		if err := cb(ctx, recObserver{m: m}); err != nil {
			return nil, err
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]int64, len(m.sums))
	for k, v := range m.sums {
		out[k] = v
	}
	return out, nil
}

type recMeter struct {
	noop.Meter
	mu        sync.Mutex
	sums      map[string]int64
	callbacks []metric.Callback
}

func recKey(name string, attrs attribute.Set) string {
	key := name
	for _, kv := range attrs.ToSlice() {
		key += "|" + string(kv.Key) + "=" + kv.Value.String()
	}
	return key
}

func (m *recMeter) Int64Counter(name string, _ ...metric.Int64CounterOption) (metric.Int64Counter, error) {
	return &recCounter{m: m, name: name}, nil
}

func (m *recMeter) Int64ObservableGauge(name string, _ ...metric.Int64ObservableGaugeOption) (metric.Int64ObservableGauge, error) {
	return &recGauge{name: name}, nil
}

func (m *recMeter) RegisterCallback(f metric.Callback, _ ...metric.Observable) (metric.Registration, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.callbacks = append(m.callbacks, f)
	return noop.Registration{}, nil
}

type recCounter struct {
	noop.Int64Counter
	m    *recMeter
	name string
}

func (c *recCounter) Add(_ context.Context, v int64, opts ...metric.AddOption) {
	key := recKey(c.name, metric.NewAddConfig(opts).Attributes())
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	c.m.sums[key] += v
}

func (c *recCounter) Enabled(context.Context) bool { return true }

type recGauge struct {
	noop.Int64ObservableGauge
	name string
}

type recObserver struct {
	otelembedded.Observer
	m *recMeter
}

func (recObserver) ObserveFloat64(metric.Float64Observable, float64, ...metric.ObserveOption) {}

func (o recObserver) ObserveInt64(obsrv metric.Int64Observable, v int64, opts ...metric.ObserveOption) {
	g, ok := obsrv.(*recGauge)
	if !ok {
		return
	}
	key := recKey(g.name, metric.NewObserveConfig(opts).Attributes())
	o.m.mu.Lock()
	defer o.m.mu.Unlock()
	o.m.sums[key] = v
}
