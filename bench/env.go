package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
	"github.com/oncekey/oncekey/durable/driver/pgmigrate"
	"github.com/oncekey/oncekey/durable/postgres"
	"github.com/oncekey/oncekey/internal/fastpath"
	"github.com/oncekey/oncekey/lua"
)

// The request every workload claims: one tenant and operation, a realistic
// fingerprint and a small stored result.
const (
	tenant      = "bench"
	operation   = "POST /orders"
	fingerprint = "v1:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
)

var result = durable.Result{
	StatusCode: 201,
	Headers:    map[string][]string{"Content-Type": {"application/json"}},
	Body:       []byte(`{"id":"ord_1","status":"created"}`),
	Version:    1,
}

// env is the shared setup of a run: one pool and one Redis client (both
// counted), a schema and a key prefix of its own, and the Claimers.
type env struct {
	cfg    config
	pool   *pgxpool.Pool
	store  durable.Store[pgx.Tx]
	table  string // the store's table, schema-qualified
	rdb    *redis.Client
	schema string
	prefix string
	sql    *sqlCounter
	rc     *redisCounter
	opens  atomic.Int64 // times the breaker of withRedis opened

	// insertOrder is the fresh workload's business write: one row of the
	// run's own orders table, created with the schema.
	insertOrder string
	// real is the fresh workload's realistic business transaction (issue
	// 44): its statements on four tables of the run's schema (realistic.go).
	real realSQL
	// pkOnlyTable is the record's table with its primary key alone
	// (floor-sql-pk-only).
	pkOnlyTable string
	// insertKeyRow is floor-key-row's record: one 32-byte key hash into
	// the run's key_rows table.
	insertKeyRow string
	// slimTable and slimPendingTable are the slim record (slimTableSQL)
	// with each index set (slimHotIndexes, slimPendingIndexes).
	slimTable, slimPendingTable string
	// digestKeyTable is a second store's table, migrated and then
	// contracted (migration 007: the operation digest as its primary key);
	// digestKey and digestKeyNoRedis are withRedis and noRedis over it.
	digestKeyTable              string
	digestKey, digestKeyNoRedis *claim.Claimer[pgx.Tx]

	withRedis *claim.Claimer[pgx.Tx] // Redis in front
	noRedis   *claim.Claimer[pgx.Tx] // PostgreSQL only
	// atCommit and atCommitNoRedis are withRedis and noRedis with
	// claim.WithWriteAtCommit: Do's opt-in, side by side with the default.
	atCommit        *claim.Claimer[pgx.Tx]
	atCommitNoRedis *claim.Claimer[pgx.Tx]
	// replayCache is withRedis with claim.WithReplayCache: hot keys
	// replayed from process memory.
	replayCache *claim.Claimer[pgx.Tx]
	// setup is withRedis with a Redis timeout of at least a second, for
	// untimed preparation that must not degrade on a loaded machine.
	setup *claim.Claimer[pgx.Tx]

	closers []func()
}

func randName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// newEnv connects, creates the schema and the Claimers. Call close at the
// end, also after an error.
func newEnv(ctx context.Context, cfg config) (*env, error) {
	e := &env{cfg: cfg, sql: &sqlCounter{}, rc: &redisCounter{}, schema: randName("bench_"), prefix: randName("bench")}
	pcfg, err := pgxpool.ParseConfig(cfg.postgres)
	if err != nil {
		return e, fmt.Errorf("%w: -postgres: %w", ErrConfig, err)
	}
	if err := postgres.ConfigurePool(pcfg); err != nil {
		return e, err
	}
	pcfg.MaxConns = int32(cfg.pgConns)
	pcfg.MinConns = int32(cfg.pgConns)
	pcfg.ConnConfig.Tracer = e.sql
	pcfg.ConnConfig.RuntimeParams["application_name"] = "oncekey-bench"
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	e.pool, err = pgxpool.NewWithConfig(cctx, pcfg)
	if err != nil {
		return e, fmt.Errorf("bench: postgres: %w", err)
	}
	e.closers = append(e.closers, e.pool.Close)
	if err := e.pool.Ping(cctx); err != nil {
		return e, fmt.Errorf("bench: postgres: %w", err)
	}

	ropt, err := redis.ParseURL(cfg.redis)
	if err != nil {
		return e, fmt.Errorf("%w: -redis: %w", ErrConfig, err)
	}
	ropt.PoolSize = cfg.concurrency + 8
	ropt.ContextTimeoutEnabled = true // as package lua asks: the per-call timeout ends a stalled read
	e.rdb = redis.NewClient(ropt)
	e.rdb.AddHook(e.rc)
	e.closers = append(e.closers, func() { e.rdb.Close() })
	if err := e.rdb.Ping(cctx).Err(); err != nil {
		return e, fmt.Errorf("bench: redis: %w", err)
	}

	e.store, err = postgres.New(e.pool, postgres.WithSchema(e.schema))
	if err != nil {
		return e, err
	}
	e.table = e.schema + ".idempotency_requests"
	e.pkOnlyTable = e.schema + ".record_pk_only"
	// Registered before Migrate: a half-made schema is dropped too.
	e.closers = append(e.closers, e.dropSchema)
	if err := postgres.Migrate(cctx, e.pool, postgres.WithSchema(e.schema)); err != nil {
		return e, err
	}
	if _, err := e.pool.Exec(cctx, "CREATE TABLE "+e.schema+".orders (id text PRIMARY KEY, amount bigint NOT NULL)"); err != nil {
		return e, fmt.Errorf("bench: orders table: %w", err)
	}
	e.insertOrder = "INSERT INTO " + e.schema + ".orders (id, amount) VALUES ($1, $2)"
	if e.real, err = createRealistic(cctx, e); err != nil {
		return e, err
	}
	// floor-sql-pk-only's table: the record's columns with its primary key
	// alone (no secondary index, no CHECK constraint).
	if _, err := e.pool.Exec(cctx, "CREATE TABLE "+e.pkOnlyTable+" (LIKE "+e.table+
		" INCLUDING DEFAULTS, PRIMARY KEY (tenant_id, operation, key_hash))"); err != nil {
		return e, fmt.Errorf("bench: primary-key-only table: %w", err)
	}
	// floor-key-row's record: the least a durable record can be, a 32-byte
	// key as the primary key.
	if _, err := e.pool.Exec(cctx, "CREATE TABLE "+e.schema+".key_rows (key_hash bytea PRIMARY KEY)"); err != nil {
		return e, fmt.Errorf("bench: key rows table: %w", err)
	}
	e.insertKeyRow = "INSERT INTO " + e.schema + ".key_rows (key_hash) VALUES ($1)"
	e.slimTable, e.slimPendingTable = e.schema+".record_slim", e.schema+".record_slim_pending"
	if err := createSlim(cctx, e, e.slimTable, slimHotIndexes); err != nil {
		return e, fmt.Errorf("bench: slim record table: %w", err)
	}
	if err := createSlim(cctx, e, e.slimPendingTable, slimPendingIndexes); err != nil {
		return e, fmt.Errorf("bench: slim record table: %w", err)
	}
	// The storm's effects: no unique constraint, so a second committed
	// execution of one operation shows as a second row.
	if _, err := e.pool.Exec(cctx, "CREATE TABLE "+e.schema+".storm_effects (variant text NOT NULL, op text NOT NULL)"); err != nil {
		return e, fmt.Errorf("bench: storm effects table: %w", err)
	}
	dkStore, err := e.digestKeyStore(cctx)
	if err != nil {
		return e, err
	}
	if e.digestKey, err = e.claimerOn(dkStore, e.rdb, nil); err != nil {
		return e, err
	}
	if e.digestKeyNoRedis, err = e.claimerOn(dkStore, nil, nil); err != nil {
		return e, err
	}
	e.withRedis, err = e.claimer(e.rdb, func(s fastpath.BreakerState) {
		if s == fastpath.BreakerOpen {
			e.opens.Add(1)
		}
	})
	if err != nil {
		return e, err
	}
	if e.noRedis, err = e.claimer(nil, nil); err != nil {
		return e, err
	}
	if e.atCommit, err = e.claimer(e.rdb, nil, claim.WithWriteAtCommit()); err != nil {
		return e, err
	}
	if e.atCommitNoRedis, err = e.claimer(nil, nil, claim.WithWriteAtCommit()); err != nil {
		return e, err
	}
	if e.replayCache, err = e.claimer(e.rdb, nil, claim.WithReplayCache(replayCacheBytes)); err != nil {
		return e, err
	}
	e.setup, err = claim.New[pgx.Tx](e.store, claim.WithLease(benchLease), claim.WithRetention(benchRetention),
		claim.WithRedis(e.rdb, lua.Options{Prefix: e.prefix, Timeout: max(time.Second, cfg.redisTimeout)}))
	return e, err
}

// claimer returns a Claimer over the env's store, with Redis client c in
// front (none when nil), and more options. onChange, when set, sees the
// breaker's states.
func (e *env) claimer(c *redis.Client, onChange func(fastpath.BreakerState), more ...claim.Option) (*claim.Claimer[pgx.Tx], error) {
	return e.claimerOn(e.store, c, onChange, more...)
}

// digestKeyTableName is the digest-keyed store's table, in the env's schema.
const digestKeyTableName = "record_digest_key"

// digestKeyStore creates the digest-keyed store's table (Migrate, then the
// contract step oncekey migrate contract runs) and returns its store.
func (e *env) digestKeyStore(ctx context.Context) (durable.Store[pgx.Tx], error) {
	opts := []postgres.Option{postgres.WithSchema(e.schema), postgres.WithTable(digestKeyTableName)}
	if err := postgres.Migrate(ctx, e.pool, opts...); err != nil {
		return nil, err
	}
	if _, err := pgmigrate.Contract(ctx, e.pool, postgres.Migrations(), pgmigrate.Target{Schema: e.schema, Table: digestKeyTableName}); err != nil {
		return nil, fmt.Errorf("bench: contract %s: %w", digestKeyTableName, err)
	}
	e.digestKeyTable = e.schema + "." + digestKeyTableName
	return postgres.New(e.pool, opts...)
}

// claimerOn is claimer over store s.
func (e *env) claimerOn(s durable.Store[pgx.Tx], c *redis.Client, onChange func(fastpath.BreakerState), more ...claim.Option) (*claim.Claimer[pgx.Tx], error) {
	opts := append([]claim.Option{claim.WithLease(benchLease), claim.WithRetention(benchRetention)}, more...)
	if c != nil {
		var rc redis.Scripter = c
		if onChange != nil {
			rc = fastpath.WithHooks(c, fastpath.Hooks{OnStateChange: onChange})
		}
		opts = append(opts, claim.WithRedis(rc, lua.Options{Prefix: e.prefix, Timeout: e.cfg.redisTimeout}))
	}
	return claim.New[pgx.Tx](s, opts...)
}

// counts returns the counters now.
func (e *env) counts() counts {
	return counts{sql: e.sql.sql.Load(), claims: e.sql.claims.Load(), sweeps: e.sql.sweeps.Load(), redis: e.rc.n.Load(), opens: e.opens.Load()}
}

// close drops the schema, deletes the key prefix and closes the clients,
// in reverse order of creation.
func (e *env) close() {
	if e.rdb != nil {
		e.deletePrefix()
	}
	for i := len(e.closers) - 1; i >= 0; i-- {
		e.closers[i]()
	}
}

func (e *env) dropSchema() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := e.pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+e.schema+" CASCADE"); err != nil {
		logf("drop schema %s: %v", e.schema, err)
	}
}

func (e *env) deletePrefix() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	iter := e.rdb.Scan(ctx, 0, e.prefix+":*", 1000).Iterator()
	var keys []string
	flush := func() {
		if len(keys) > 0 {
			e.rdb.Unlink(ctx, keys...)
			keys = keys[:0]
		}
	}
	for iter.Next(ctx) {
		if keys = append(keys, iter.Val()); len(keys) == 500 {
			flush()
		}
	}
	flush()
	if err := iter.Err(); err != nil {
		logf("delete redis prefix %s: %v", e.prefix, err)
	}
}

// scope returns the scope of key.
func scope(key string) durable.Scope {
	return durable.Scope{Tenant: tenant, Operation: operation, Key: key}
}

// request returns the claim request of key.
func request(key string) claim.Request {
	return claim.Request{Scope: scope(key), Fingerprint: fingerprint}
}

// deadRedis is a Redis that does not answer: a refused port, or a black
// hole that accepts connections and never replies.
type deadRedis struct {
	client *redis.Client
	ln     net.Listener
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  []net.Conn
}

// newDeadRedis returns a client of a Redis that refuses connections
// (blackhole false) or swallows every command (blackhole true). Its
// commands are counted by rc.
func newDeadRedis(blackhole bool, timeout time.Duration, poolSize int, rc *redisCounter) (*deadRedis, error) {
	d := &deadRedis{}
	addr := "127.0.0.1:1" // nothing listens on port 1: connect is refused at once
	if blackhole {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("bench: black hole: %w", err)
		}
		d.ln, addr = ln, ln.Addr().String()
		d.wg.Add(1)
		go d.accept()
	}
	redisLog.add(addr)
	d.client = redis.NewClient(&redis.Options{
		Addr: addr, PoolSize: poolSize, ContextTimeoutEnabled: true,
		DialTimeout: timeout, ReadTimeout: timeout, WriteTimeout: timeout,
	})
	d.client.AddHook(rc)
	return d, nil
}

func (d *deadRedis) accept() {
	defer d.wg.Done()
	for {
		c, err := d.ln.Accept()
		if err != nil {
			return
		}
		d.mu.Lock()
		d.conns = append(d.conns, c)
		d.mu.Unlock()
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			_, _ = io.Copy(io.Discard, c) // read everything, answer nothing
		}()
	}
}

func (d *deadRedis) close() {
	d.client.Close()
	if d.ln != nil {
		d.ln.Close()
		d.mu.Lock()
		for _, c := range d.conns {
			c.Close()
		}
		d.mu.Unlock()
		d.wg.Wait()
	}
}

// quietDead is go-redis's logger for the run: it drops the dial failures
// of the dead Redis addresses (each refused dial is logged otherwise) and
// passes everything else to the tool's log.
type quietDead struct {
	mu   sync.Mutex
	dead map[string]bool
}

var redisLog = &quietDead{dead: map[string]bool{}}

func (q *quietDead) add(addr string) {
	q.mu.Lock()
	q.dead[addr] = true
	q.mu.Unlock()
}

// Printf logs a go-redis message unless it is about a dead address.
func (q *quietDead) Printf(_ context.Context, format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	q.mu.Lock()
	defer q.mu.Unlock()
	for addr := range q.dead {
		if strings.Contains(msg, addr) {
			return
		}
	}
	logf("redis: %s", msg)
}
