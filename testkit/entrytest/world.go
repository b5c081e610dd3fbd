package entrytest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/postgres"
	"github.com/oncekey/oncekey/internal/fastpath"
	"github.com/oncekey/oncekey/lua"
	"github.com/oncekey/oncekey/testkit/pgproxy"
	"github.com/oncekey/oncekey/testkit/testenv"
)

// Lease is the Claimer's lease in every window but the renewals one:
// short, so the windows that outlast it stay short.
const Lease = 2 * time.Second

// renewalsLease is the lease of the renewals window: long enough that a
// cut past its first third still leaves the renewals after the cut seconds
// to land before the worker's deadline on a loaded machine.
const renewalsLease = 4 * time.Second

// payload is what the suite sends: the key it was sent under and how the
// handler behaves. V varies the payload under one key (a mismatch).
type payload struct {
	Key    string `json:"key"`
	Do     string `json:"do"`                // ok, fail, uncertain, panic
	WorkMs int    `json:"work_ms,omitempty"` // after the effect, work this long (stopping when its context ends)
	CutMs  int    `json:"cut_ms,omitempty"`  // at the effect, take the store down this long
	Size   int    `json:"size,omitempty"`    // pad the body to at least this many bytes
	V      string `json:"v,omitempty"`
}

func (p payload) bytes() []byte {
	b, err := json.Marshal(p)
	if err != nil {
		panic(err)
	}
	return b
}

// run is one execution of the handler.
type run struct {
	opID        string
	resp        Response
	returned    bool // false: still running, or it panicked
	panicked    bool
	interrupted error // the handler's context ended before its work did
}

// world is one window's adapter and everything around it.
type world struct {
	t      *testing.T
	name   string
	lease  time.Duration
	caps   Caps
	d      Driver
	a      Adapter
	schema testenv.Schema
	proxy  *pgproxy.Cutter
	redis  *redisGate // the Claimer's way to Redis, which the windows take down
	rdb    *redis.Client
	prefix string
	reader *claim.Claimer[pgx.Tx] // on the direct pool: reads records, resolves

	mu      sync.Mutex
	runs    map[string][]*run // by payload key
	started chan string       // the key of every run, as it starts
	outages sync.WaitGroup

	vs []Violation
}

func newWorld(t *testing.T, d Driver, window string, lease time.Duration) *world {
	t.Helper()
	ctx := context.Background()
	w := &world{t: t, name: window, lease: lease, caps: d.Caps(), d: d, runs: map[string][]*run{}, started: make(chan string, 64)}
	if w.caps.Tenant == "" {
		t.Fatal("entrytest: Caps.Tenant is empty")
	}
	w.schema = testenv.Postgres(t)
	if err := postgres.Migrate(ctx, w.schema.Pool, postgres.WithSchema(w.schema.Name)); err != nil {
		t.Fatal(err)
	}
	direct, err := postgres.New(w.schema.Pool, postgres.WithSchema(w.schema.Name))
	if err != nil {
		t.Fatal(err)
	}
	if w.reader, err = claim.New(direct, claim.WithLease(lease), claim.WithRetention(time.Hour)); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(w.schema.URL)
	if err != nil {
		t.Fatal(err)
	}
	w.proxy, err = pgproxy.New("tcp", net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.proxy.Close)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = "127.0.0.1", w.proxy.Port()
	cfg.ConnConfig.TLSConfig, cfg.ConnConfig.Fallbacks = nil, nil
	cfg.ConnConfig.ConnectTimeout = time.Second
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	st, err := postgres.New(pool, postgres.WithSchema(w.schema.Name))
	if err != nil {
		t.Fatal(err)
	}
	// The suite reads and empties Redis on a client of its own (w.rdb); the
	// Claimer's client dials through the gate, so a window can make Redis
	// unreachable for the adapter alone.
	w.rdb, w.prefix = testenv.Redis(t)
	w.redis = &redisGate{conns: map[*gatedConn]struct{}{}}
	opt := testenv.RedisOptions(t)
	opt.Dialer = w.redis.dialer(redis.NewDialer(opt))
	crdb := redis.NewClient(opt)
	t.Cleanup(func() { _ = crdb.Close() })
	c, err := claim.New(st, claim.WithLease(lease), claim.WithRetention(time.Hour),
		claim.WithRedis(crdb, lua.Options{Prefix: w.prefix, Timeout: time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	record := func(ctx context.Context, scope durable.Scope) (durable.Record, error) {
		ref, err := direct.Ref(scope)
		if err != nil {
			return durable.Record{}, err
		}
		return direct.Get(ctx, ref)
	}
	w.a = d.Start(Env{T: t, Claimer: c, Schema: w.schema, Lease: lease, Handler: w.handle, Record: record})
	// Cleanups run last first: this one runs before the adapter's and
	// the pool's. A key still held (a broken settlement's renewals going
	// on forever, a handler stuck) is fenced, so its renewals stop.
	t.Cleanup(w.release)
	return w
}

// handle is the suite's handler: the effect (a count of the runs per key,
// downstream of the adapter), then what the payload says.
func (w *world) handle(ctx context.Context, opID string, raw []byte) Response {
	var p payload
	if err := json.Unmarshal(raw, &p); err != nil || p.Key == "" {
		// Not the suite's payload: no effect, a failure the checks see.
		w.violate("", "handler got a payload the suite did not send: %q", raw)
		return Response{Kind: Failure, Body: []byte("bad payload")}
	}
	r := &run{opID: opID}
	w.mu.Lock()
	w.runs[p.Key] = append(w.runs[p.Key], r)
	n := len(w.runs[p.Key])
	// The outage meets the first execution only: a takeover after it must
	// not cut the store again. It is counted with the run, so a window
	// that saw the run start and waits for the outages waits for this one.
	cut := p.CutMs > 0 && n == 1
	if cut {
		w.outages.Add(1)
	}
	w.mu.Unlock()
	select {
	case w.started <- p.Key:
	default:
	}
	finish := func(resp Response) Response {
		w.mu.Lock()
		r.resp, r.returned = resp, true
		w.mu.Unlock()
		return resp
	}
	if cut {
		w.outage(time.Duration(p.CutMs) * time.Millisecond)
	}
	if p.WorkMs > 0 {
		t := time.NewTimer(time.Duration(p.WorkMs) * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			w.mu.Lock()
			r.interrupted = context.Cause(ctx)
			w.mu.Unlock()
			// A handler stopped by its context answers an error, as a real
			// one would: the adapter decides what becomes of it.
			return finish(Response{Kind: Unknown, Body: []byte("interrupted")})
		}
	}
	body := fmt.Sprintf(`{"key":%q,"run":%d,"nonce":%q`, p.Key, n, nonce())
	if pad := p.Size - len(body) - 9; pad > 0 {
		body += `,"pad":"` + strings.Repeat("x", pad) + `"`
	}
	body += "}"
	switch p.Do {
	case "panic":
		w.mu.Lock()
		r.panicked = true
		w.mu.Unlock()
		panic("entrytest: the handler panics after its effect")
	case "uncertain":
		return finish(Response{Kind: Unknown, Body: []byte(body)})
	case "fail":
		return finish(Response{Kind: Failure, Body: []byte(body)})
	}
	return finish(Response{Kind: Success, Body: []byte(body)})
}

func nonce() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// outage takes the store down for d, from now. The caller counted it in
// w.outages.
func (w *world) outage(d time.Duration) {
	w.proxy.SetDown(true)
	time.AfterFunc(d, func() {
		defer w.outages.Done()
		w.proxy.SetDown(false)
	})
}

// runsOf returns a copy of the runs of key.
func (w *world) runsOf(key string) []run {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]run, len(w.runs[key]))
	for i, r := range w.runs[key] {
		out[i] = *r
	}
	return out
}

// waitStarted waits until a run of key started.
func (w *world) waitStarted(key string, within time.Duration) bool {
	deadline := time.After(within)
	for {
		if len(w.runsOf(key)) > 0 {
			return true
		}
		select {
		case <-w.started:
		case <-deadline:
			return false
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// waitReturned waits until every run of key returned or panicked.
func (w *world) waitReturned(key string, within time.Duration) {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		done := true
		for _, r := range w.runsOf(key) {
			if !r.returned && !r.panicked {
				done = false
			}
		}
		if done {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// send sends one request with a bound on how long the caller waits.
func (w *world) send(key string, p payload) Answer {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a := w.a.Send(ctx, key, p.bytes())
	w.t.Logf("%s: %s %s", key, a.Outcome, a.Detail)
	return a
}

// settle sends the request again until it gets a final answer (executed,
// replayed, uncertain, rejected) or within has passed, and returns every
// answer it got.
func (w *world) settle(key string, p payload, within time.Duration) []Answer {
	var as []Answer
	deadline := time.Now().Add(within)
	ctx, cancel := context.WithTimeout(context.Background(), within+30*time.Second)
	defer cancel()
	for {
		a := w.a.Send(ctx, key, p.bytes())
		as = append(as, a)
		if a.Outcome.final() || time.Now().After(deadline) {
			break
		}
		if len(w.runsOf(key)) > 2 {
			break // it runs on every retry: a violation already, whatever comes next
		}
		time.Sleep(200 * time.Millisecond)
	}
	// One log line: the answers, repeats counted.
	var b strings.Builder
	for i := 0; i < len(as); {
		j := i
		for j < len(as) && as[j].Outcome == as[i].Outcome && as[j].Detail == as[i].Detail {
			j++
		}
		fmt.Fprintf(&b, " %s (%s)", as[i].Outcome, as[i].Detail)
		if j-i > 1 {
			fmt.Fprintf(&b, " x%d", j-i)
		}
		i = j
	}
	w.t.Logf("%s: retried:%s", key, b.String())
	return as
}

// holdBound is how long a key may stay unsettled after its work ended
// before the suite calls it held: the lease twice over, a redelivery's
// delay, and slack for a loaded machine.
func (w *world) holdBound() time.Duration { return 2*w.lease + 5*time.Second }

// record reads the durable record of the operation key ran under.
func (w *world) record(key string) (durable.Record, bool) {
	runs := w.runsOf(key)
	if len(runs) == 0 {
		return durable.Record{}, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rec, err := w.reader.Operation(ctx, w.caps.Tenant, runs[0].opID)
	if err != nil {
		w.t.Fatalf("read the record of %s: %v", key, err)
	}
	return rec, true
}

// release fences every record still processing when the window ends, so a
// worker whose settlement never ended (its renewals go on) stops renewing:
// nothing outlives the window.
func (w *world) release() {
	w.outages.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := w.schema.Pool.Exec(ctx, `UPDATE idempotency_requests SET generation = generation + 1, owner_token = gen_random_uuid()
		WHERE state = 'processing' AND owner_token IS NOT NULL`)
	if err != nil && !errors.Is(err, context.Canceled) {
		w.t.Logf("entrytest: fence the records still held: %v", err)
	}
	// Give a renewal in flight the time to come back fenced.
	time.Sleep(w.lease / 2)
}

// flushRedis deletes every Redis key of the window; it fails the test when
// there is none (the adapter's Claimer does not use the window's Redis).
func (w *world) flushRedis() {
	if w.deleteRedisKeys() == 0 {
		w.t.Fatal("entrytest: Redis holds no key of the window: is the adapter's Claimer using it?")
	}
}

// deleteRedisKeys deletes every Redis key of the window and returns how
// many there were.
func (w *world) deleteRedisKeys() int {
	ctx := context.Background()
	iter := w.rdb.Scan(ctx, 0, w.prefix+":*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		w.t.Fatal(err)
	}
	if len(keys) == 0 {
		return 0
	}
	if err := w.rdb.Del(ctx, keys...).Err(); err != nil {
		w.t.Fatal(err)
	}
	return len(keys)
}

// redisCopy returns what Redis holds for the record of key (the record's
// one Redis key, read on the suite's own client).
func (w *world) redisCopy(key string) (fastpath.Stored, bool) {
	rec, ok := w.record(key)
	if !ok {
		return fastpath.Stored{}, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := fastpath.ReadStored(ctx, w.rdb, fastpath.KeysFor(w.prefix, rec.Ref))
	if err != nil {
		w.t.Fatalf("read the Redis copy of %s: %v", key, err)
	}
	return st, true
}

// errRedisDown is what the gate's dialer answers while Redis is down.
var errRedisDown = errors.New("entrytest: Redis is down (the window took it down)")

// redisGate stands between the Claimer's Redis client and Redis: while it
// is down, every connection it dialed is closed and every dial refused,
// as Redis unreachable looks to a client. Safe for concurrent use.
type redisGate struct {
	mu      sync.Mutex
	down    bool
	conns   map[*gatedConn]struct{}
	refused int // dials refused while down
}

// dialer returns a redis.Options.Dialer that dials with dial while the
// gate is up.
func (g *redisGate) dialer(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if g.refuse() {
			return nil, errRedisDown
		}
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		gc := &gatedConn{Conn: c, g: g}
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.down {
			_ = c.Close()
			g.refused++
			return nil, errRedisDown
		}
		g.conns[gc] = struct{}{}
		return gc, nil
	}
}

// refuse reports whether the gate is down, counting the refusal.
func (g *redisGate) refuse() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.down {
		g.refused++
	}
	return g.down
}

// setDown takes Redis down for the Claimer (closing every connection) or
// brings it back.
func (g *redisGate) setDown(down bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.down = down
	if down {
		for c := range g.conns {
			_ = c.Conn.Close()
			delete(g.conns, c)
		}
	}
}

// refusals returns how many dials the gate refused so far.
func (g *redisGate) refusals() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.refused
}

// gatedConn is a connection the gate dialed; closing it forgets it.
type gatedConn struct {
	net.Conn
	g *redisGate
}

func (c *gatedConn) Close() error {
	c.g.mu.Lock()
	delete(c.g.conns, c)
	c.g.mu.Unlock()
	return c.Conn.Close()
}

// resolution is how the operator resolves one key.
type resolution struct {
	state durable.State
	resp  Response
}

// resolve resolves uncertain records as an operator or a Reconciler does:
// adopt each and store its result (in the adapter's format, Driver.Encode)
// as completed or failed, in one pass.
func (w *world) resolve(byKey map[string]resolution) {
	byOp := map[string]durable.Result{}
	states := map[string]durable.State{}
	for key, r := range byKey {
		runs := w.runsOf(key)
		if len(runs) == 0 {
			w.t.Fatalf("resolve %s: it never ran", key)
		}
		byOp[runs[0].opID] = w.d.Encode(r.resp)
		states[runs[0].opID] = r.state
	}
	rc, err := claim.NewReconciler(w.reader, func(_ context.Context, rec durable.Record) (claim.Resolution, error) {
		id := rec.Ref.OperationID()
		if res, ok := byOp[id]; ok {
			return claim.Resolved(states[id], res), nil
		}
		return claim.Unresolved(), nil
	}, claim.WithStaleAfter(time.Hour))
	if err != nil {
		w.t.Fatal(err)
	}
	rep, err := rc.RunOnce(context.Background())
	if err != nil {
		w.t.Fatal(err)
	}
	if rep.Resolved != len(byKey) {
		w.violate("", "the operator resolved %d of %d uncertain operations: %+v", rep.Resolved, len(byKey), rep)
	}
}
