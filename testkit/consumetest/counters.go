// Package consumetest holds test helpers the consumer adapters' tests
// share (claimnats, claimamqp): the scenarios both run, in workflow and
// in Do mode (Rig, Scenarios), the checks of their dead-letter reports
// and delivery limits (DeliveryLimit), and their conformance driver
// (Driver, with its client side Sends).
//
// It is part of oncekey's unstable module seam (package testkit): not for
// applications, no compatibility promise between versions.
package consumetest

import (
	"context"
	"sort"
	"sync"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// Counters is a MeterProvider that adds up its Int64Counters by name and
// attributes ("name|key=value|..."), so a test needs no OpenTelemetry SDK.
type Counters struct {
	noop.MeterProvider
	mu   sync.Mutex
	sums map[string]int64
}

// NewCounters returns an empty Counters.
func NewCounters() *Counters { return &Counters{sums: map[string]int64{}} }

// Meter returns a meter whose Int64Counters add up in c.
func (c *Counters) Meter(string, ...metric.MeterOption) metric.Meter { return meter{c: c} }

// Get returns the sum recorded under key.
func (c *Counters) Get(key string) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sums[key]
}

// Keys returns the keys recorded, sorted.
func (c *Counters) Keys() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ks []string
	for k := range c.sums {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

type meter struct {
	noop.Meter
	c *Counters
}

func (m meter) Int64Counter(name string, _ ...metric.Int64CounterOption) (metric.Int64Counter, error) {
	return counter{c: m.c, name: name}, nil
}

type counter struct {
	noop.Int64Counter
	c    *Counters
	name string
}

func (k counter) Add(_ context.Context, n int64, opts ...metric.AddOption) {
	key := k.name
	set := metric.NewAddConfig(opts).Attributes()
	for _, kv := range set.ToSlice() {
		key += "|" + string(kv.Key) + "=" + kv.Value.String()
	}
	k.c.mu.Lock()
	k.c.sums[key] += n
	k.c.mu.Unlock()
}
