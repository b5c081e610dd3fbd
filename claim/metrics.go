package claim

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/internal/fastpath"
)

// Metric names; the package documentation lists them (# Metrics) for users.
const (
	metricClaims          = "oncekey.claims"
	metricClaimDuration   = "oncekey.claim.duration"
	metricMismatches      = "oncekey.mismatches"
	metricReplays         = "oncekey.replays"
	metricTakeovers       = "oncekey.takeovers"
	metricFenced          = "oncekey.fenced"
	metricUncertain       = "oncekey.uncertain"
	metricRedisFallbacks  = "oncekey.redis.fallbacks"
	metricBreakerState    = "oncekey.redis.breaker"
	metricBreakerOpens    = "oncekey.redis.breaker.opens"
	metricEvictionPolicy  = "oncekey.redis.eviction"
	metricDegraded        = "oncekey.durable.degraded"
	metricRecords         = "oncekey.records"
	metricOldestAge       = "oncekey.records.oldest_age"
	metricStaleProcessing = "oncekey.records.stale_processing"
	metricExpiredUnswept  = "oncekey.records.expired_unswept"
	metricExpiredStuck    = "oncekey.records.expired_stuck"
	metricReconciled      = "oncekey.reconciled"
	metricWoken           = "oncekey.waits.woken"
)

type meters struct {
	// on: a MeterProvider was given. Without one the per-claim recording
	// is skipped altogether (the counters would be no-ops anyway), clock
	// reading included.
	on bool

	claims, mismatches, replays, takeovers, fenceds, uncertains, fallbacks, reconcile, breakerOpens, wakes metric.Int64Counter
	duration                                                                                               metric.Float64Histogram
	evicting                                                                                               atomic.Bool
	degraded                                                                                               atomic.Bool // durability settings can lose commits

	statsMu sync.Mutex
	statsAt time.Time
	stats   durable.Stats
	statsOK bool
}

func newMeters[TTx any](c *Claimer[TTx]) (*meters, error) {
	mp := c.cfg.meter
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	mt := mp.Meter("github.com/oncekey/oncekey/claim")
	m := &meters{on: c.cfg.meter != nil}
	var errs []error
	counter := func(name, desc string) metric.Int64Counter {
		ctr, err := mt.Int64Counter(name, metric.WithDescription(desc))
		errs = append(errs, err)
		return ctr
	}
	m.claims = counter(metricClaims, "Claims by outcome.")
	m.mismatches = counter(metricMismatches, "Keys reused with a different request.")
	m.replays = counter(metricReplays, "Stored results replayed, by source.")
	m.takeovers = counter(metricTakeovers, "Expired leases taken over, including reconciler adoptions.")
	m.fenceds = counter(metricFenced, "Writes rejected because the lease was lost.")
	m.uncertains = counter(metricUncertain, "Operations marked uncertain.")
	m.fallbacks = counter(metricRedisFallbacks, "Claims that went to the durable store without Redis.")
	m.reconcile = counter(metricReconciled, "Records handled by the reconciler, by result.")
	m.breakerOpens = counter(metricBreakerOpens, "Times the Redis breaker opened: claims then went to the durable store alone.")
	m.wakes = counter(metricWoken, "Waiting duplicates (WithWait) woken by a wake from Redis rather than by their poll.")
	var err error
	m.duration, err = mt.Float64Histogram(metricClaimDuration, metric.WithUnit("s"), metric.WithDescription("Claim latency."))
	errs = append(errs, err)

	gauge := func(name, unit, desc string) metric.Int64ObservableGauge {
		g, err := mt.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	breaker := gauge(metricBreakerState, "1", "Redis breaker: 0 closed, 1 half-open, 2 open.")
	eviction := gauge(metricEvictionPolicy, "1", "1 when Redis may evict keys (maxmemory-policy is not noeviction).")
	degraded := gauge(metricDegraded, "1", "1 when the database can lose acknowledged commits (synchronous_commit, fsync, asynchronous standbys).")
	records := gauge(metricRecords, "1", "Records by state.")
	oldest := gauge(metricOldestAge, "s", "Age of the oldest record still within retention.")
	stale := gauge(metricStaleProcessing, "1", "Processing records whose lease expired.")
	unswept := gauge(metricExpiredUnswept, "1", "Finished records past retention not swept yet.")
	stuck := gauge(metricExpiredStuck, "1", "Processing or uncertain records past retention (never deleted).")
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	_, err = mt.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		if c.scripts != nil {
			var v int64
			switch c.scripts.Breaker() {
			case fastpath.BreakerHalfOpen:
				v = 1
			case fastpath.BreakerOpen:
				v = 2
			}
			o.ObserveInt64(breaker, v)
			ev := int64(0)
			if m.evicting.Load() {
				ev = 1
			}
			o.ObserveInt64(eviction, ev)
		}
		st, ok := m.storeStats(ctx, c.store, c.cfg.statsMaxAge)
		if ok && st.Durability != "" {
			m.degraded.Store(true)
		} else if ok {
			m.degraded.Store(false)
		}
		dg := int64(0)
		if m.degraded.Load() {
			dg = 1
		}
		o.ObserveInt64(degraded, dg)
		if !ok {
			return nil
		}
		for _, s := range []durable.State{durable.Processing, durable.Completed, durable.Failed, durable.Uncertain} {
			o.ObserveInt64(records, st.ByState[s], metric.WithAttributes(attribute.String("state", string(s))))
		}
		o.ObserveInt64(oldest, int64(st.OldestUnexpiredAge/time.Second))
		o.ObserveInt64(stale, st.StaleProcessing)
		o.ObserveInt64(unswept, st.ExpiredUnswept)
		o.ObserveInt64(stuck, st.ExpiredStuck)
		return nil
	}, breaker, eviction, degraded, records, oldest, stale, unswept, stuck)
	if err != nil {
		return nil, err
	}
	return m, nil
}

// storeStats returns the store's stats, read at most once per maxAge so a
// busy metrics scraper costs the database little.
func (m *meters) storeStats(ctx context.Context, s interface {
	Stats(context.Context) (durable.Stats, error)
}, maxAge time.Duration) (durable.Stats, bool) {
	m.statsMu.Lock()
	defer m.statsMu.Unlock()
	if m.statsOK && time.Since(m.statsAt) < maxAge {
		return m.stats, true
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	st, err := s.Stats(ctx)
	if err != nil {
		return m.stats, m.statsOK
	}
	m.stats, m.statsAt, m.statsOK = st, time.Now(), true
	return st, true
}

// Attribute sets are built once, and so are the option slices that carry
// them: metric.WithAttributes allocates on every call, and so does passing
// one option to a variadic parameter of an interface method; this is the
// hot path.
var (
	outcomeOpts = map[string]outcomeOpt{}
	sourceRedis = []metric.AddOption{metric.WithAttributes(attribute.String("source", "redis"))}
	sourceStore = []metric.AddOption{metric.WithAttributes(attribute.String("source", "durable"))}
	// sourceProcess: the replay cache in process (WithReplayCache).
	sourceProcess = []metric.AddOption{metric.WithAttributes(attribute.String("source", "process"))}
)

// outcomeOpt is the attribute set of one outcome, as the options of the
// claims counter and of the duration histogram.
type outcomeOpt struct {
	add    []metric.AddOption
	record []metric.RecordOption
}

func init() {
	for _, v := range []string{"acquired", "executed", "replayed", "in_progress", "uncertain", "unknown",
		"mismatch", "invalid", "unavailable", "lease_expired", "error"} {
		a := metric.WithAttributes(attribute.String("outcome", v))
		outcomeOpts[v] = outcomeOpt{add: []metric.AddOption{a}, record: []metric.RecordOption{a}}
	}
}

func outcomeAttr(k Kind, err error) string {
	var v string
	switch {
	case err == nil:
		v = k.String()
	case errors.Is(err, ErrMismatch):
		v = "mismatch"
	case errors.Is(err, ErrInvalidScope):
		v = "invalid"
	case errors.Is(err, ErrUnavailable):
		v = "unavailable"
	case errors.Is(err, ErrLeaseExpired):
		v = "lease_expired"
	default:
		v = "error"
	}
	return v
}

// start returns when a claim starts, for its duration, or the zero time
// when metrics are off.
func (m *meters) start() time.Time {
	if !m.on {
		return time.Time{}
	}
	return time.Now()
}

func (m *meters) claimDone(ctx context.Context, start time.Time, k Kind, err error) {
	if !m.on {
		return
	}
	o := outcomeOpts[outcomeAttr(k, err)]
	m.claims.Add(ctx, 1, o.add...)
	m.duration.Record(ctx, time.Since(start).Seconds(), o.record...)
}

func (m *meters) mismatch(ctx context.Context)  { m.mismatches.Add(ctx, 1) }
func (m *meters) takeover(ctx context.Context)  { m.takeovers.Add(ctx, 1) }
func (m *meters) fenced(ctx context.Context)    { m.fenceds.Add(ctx, 1) }
func (m *meters) uncertain(ctx context.Context) { m.uncertains.Add(ctx, 1) }
func (m *meters) fallback(ctx context.Context)  { m.fallbacks.Add(ctx, 1) }
func (m *meters) evictionPolicy(string)         { m.evicting.Store(true) }

func (m *meters) replay(ctx context.Context, fromRedis bool) {
	if !m.on {
		return
	}
	src := sourceStore
	if fromRedis {
		src = sourceRedis
	}
	m.replays.Add(ctx, 1, src...)
}

// woken counts a waiting duplicate woken by its key's wake channel.
func (m *meters) woken(ctx context.Context) {
	if m.on {
		m.wakes.Add(ctx, 1)
	}
}

// replayLocal counts a replay answered by the replay cache in process.
func (m *meters) replayLocal(ctx context.Context) {
	if m.on {
		m.replays.Add(ctx, 1, sourceProcess...)
	}
}

func (m *meters) reconciled(ctx context.Context, t tally) {
	for _, kv := range []struct {
		name string
		n    int
	}{{"completed", t.completed}, {"failed", t.failed}, {"released", t.released}, {"resumed", t.resumed}, {"unknown", t.unknown}, {"skipped", t.skipped}, {"error", t.errors}} {
		if kv.n > 0 {
			m.reconcile.Add(ctx, int64(kv.n), metric.WithAttributes(attribute.String("result", kv.name)))
		}
	}
}
