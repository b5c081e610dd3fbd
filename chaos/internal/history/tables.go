package history

import (
	"context"
	"fmt"
	"regexp"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Execer runs a statement: a pgx pool, connection or transaction.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// Tables are the suite's own tables in one schema: chaos_effects, the
// append-only log of business effects, which deliberately has no unique
// constraint (a duplicate effect must be visible, not prevented), and
// chaos_resources, the mutable business resource a scenario may change or
// delete after the fact.
type Tables struct {
	schema string
}

// NewTables returns the tables of schema (a lowercase SQL identifier).
func NewTables(schema string) (Tables, error) {
	if !identRE.MatchString(schema) || len(schema) > 63 {
		return Tables{}, fmt.Errorf("history: schema %q is not a lowercase identifier", schema)
	}
	return Tables{schema: schema}, nil
}

// Effects returns the effects table's qualified name.
func (t Tables) Effects() string { return t.schema + ".chaos_effects" }

// Resources returns the resources table's qualified name.
func (t Tables) Resources() string { return t.schema + ".chaos_resources" }

// Create creates the tables if they do not exist.
func (t Tables) Create(ctx context.Context, db Execer) error {
	_, err := db.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+t.Effects()+` (
	id         bigserial   NOT NULL, -- a row number, not an identity of the operation
	scenario   text        NOT NULL,
	key        text        NOT NULL,
	epoch      integer     NOT NULL,
	owner      uuid        NOT NULL,
	generation bigint      NOT NULL,
	body       text        NOT NULL,
	via        text        NOT NULL,
	written_at timestamptz NOT NULL DEFAULT clock_timestamp()
	-- no PRIMARY KEY, no UNIQUE: a second effect of one operation must show up
);
CREATE TABLE IF NOT EXISTS `+t.Resources()+` (
	scenario text    NOT NULL,
	key      text    NOT NULL,
	epoch    integer NOT NULL,
	data     text    NOT NULL
)`)
	if err != nil {
		return fmt.Errorf("history: create tables: %w", err)
	}
	return nil
}

// InsertEffect appends one effect (and its business resource) with db,
// which is the business function's transaction in Do, so the effect
// commits or rolls back with the claim. It returns the effect's row id.
func (t Tables) InsertEffect(ctx context.Context, db Execer, scenario string, e Effect) (int64, error) {
	var id int64
	err := db.QueryRow(ctx, `WITH r AS (INSERT INTO `+t.Resources()+` (scenario, key, epoch, data) VALUES ($1, $2, $3, $7))
		INSERT INTO `+t.Effects()+` (scenario, key, epoch, owner, generation, body, via)
		VALUES ($1, $2, $3, $4, $5, $6, $8) RETURNING id`,
		scenario, e.Key, e.Epoch, e.Owner, int64(e.Generation), e.Body, "resource of "+e.Key, e.Via).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("history: insert effect: %w", err)
	}
	return id, nil
}

// ReadEffects returns every effect of scenario in row order.
func (t Tables) ReadEffects(ctx context.Context, db *pgxpool.Pool, scenario string) ([]Effect, error) {
	rows, err := db.Query(ctx, `SELECT id, key, epoch, owner, generation, body, via FROM `+t.Effects()+`
		WHERE scenario = $1 ORDER BY id`, scenario)
	if err != nil {
		return nil, fmt.Errorf("history: read effects: %w", err)
	}
	defer rows.Close()
	var out []Effect
	for rows.Next() {
		var e Effect
		var gen int64
		if err := rows.Scan(&e.ID, &e.Key, &e.Epoch, &e.Owner, &gen, &e.Body, &e.Via); err != nil {
			return nil, fmt.Errorf("history: read effects: %w", err)
		}
		e.Generation = uint64(gen)
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("history: read effects: %w", err)
	}
	return out, nil
}

// Records reads the library's records with plain SQL, independently of the
// library's own code: table is the qualified name of its table, tenant
// and operation select the scenario's records, and keys maps each record's
// key hash to the suite's key name (records of other keys are skipped).
type Records struct {
	Table     string
	Tenant    string
	Operation string
	Keys      map[[32]byte]string
}

// Read returns the current records.
func (r Records) Read(ctx context.Context, db *pgxpool.Pool) ([]Record, error) {
	rows, err := db.Query(ctx, `SELECT key_hash, state::text, generation, owner_token, response_body, COALESCE(status_code, 0),
		expires_at <= clock_timestamp(),
		expires_at <= clock_timestamp() AND generation < (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::bigint - 120000
		FROM `+r.Table+` WHERE tenant_id = $1 AND operation = $2`, r.Tenant, r.Operation)
	if err != nil {
		return nil, fmt.Errorf("history: read records: %w", err)
	}
	defer rows.Close()
	var out []Record
	for rows.Next() {
		var (
			kh    []byte
			rec   Record
			gen   int64
			owner *uuid.UUID
			body  []byte
		)
		if err := rows.Scan(&kh, &rec.State, &gen, &owner, &body, &rec.Status, &rec.Expired, &rec.Sweepable); err != nil {
			return nil, fmt.Errorf("history: read records: %w", err)
		}
		var h [32]byte
		copy(h[:], kh)
		key, ok := r.Keys[h]
		if !ok {
			continue
		}
		rec.Key, rec.Generation = key, uint64(gen)
		if owner != nil {
			rec.Owner = *owner
		}
		if body != nil {
			rec.Body = Hash(body)
		}
		out = append(out, rec)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("history: read records: %w", err)
	}
	return out, nil
}

// Sampler reads every record's generation at an interval until stopped,
// so the checker can verify that a durable generation never decreases. It
// keeps a sample only when a key's generation differs from the last one
// kept for it: consecutive samples of a key are what the check compares,
// so a decrease is kept as surely, and the samples grow with the changes,
// not with (records x ticks). (Keeping every reading made a 1000-operation
// soak hold millions of samples, and the collector's pauses starved the
// leases of the scenario it was checking.)
type Sampler struct {
	rec     Records
	db      *pgxpool.Pool
	clock   *Recorder
	stop    chan struct{}
	stopped chan struct{}

	mu      sync.Mutex
	samples []Sample
	last    map[string]uint64
	errs    int
}

// add keeps a reading of key's generation taken at at when it differs
// from the last one kept for key. s.mu must be held.
func (s *Sampler) add(key string, at time.Duration, gen uint64) {
	if prev, ok := s.last[key]; ok && prev == gen {
		return
	}
	s.last[key] = gen
	s.samples = append(s.samples, Sample{Key: key, At: at, Generation: gen})
}

// StartSampler starts sampling r on db every interval, timed on clock.
func StartSampler(r Records, db *pgxpool.Pool, clock *Recorder, interval time.Duration) *Sampler {
	s := &Sampler{rec: r, db: db, clock: clock, stop: make(chan struct{}), stopped: make(chan struct{}), last: map[string]uint64{}}
	go func() {
		defer close(s.stopped)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			s.sample()
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

func (s *Sampler) sample() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	at := s.clock.Now()
	rows, err := s.db.Query(ctx, `SELECT key_hash, generation FROM `+s.rec.Table+` WHERE tenant_id = $1 AND operation = $2`,
		s.rec.Tenant, s.rec.Operation)
	if err != nil {
		s.mu.Lock()
		s.errs++
		s.mu.Unlock()
		return
	}
	defer rows.Close()
	var got []Sample
	for rows.Next() {
		var kh []byte
		var gen int64
		if rows.Scan(&kh, &gen) != nil {
			continue
		}
		var h [32]byte
		copy(h[:], kh)
		if key, ok := s.rec.Keys[h]; ok {
			got = append(got, Sample{Key: key, At: at, Generation: uint64(gen)})
		}
	}
	if rows.Err() != nil {
		return
	}
	s.mu.Lock()
	for _, g := range got {
		s.add(g.Key, g.At, g.Generation)
	}
	s.mu.Unlock()
}

// Stop stops sampling, takes a last sample, and returns them all.
func (s *Sampler) Stop() []Sample {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.stopped
	s.sample()
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Sample(nil), s.samples...)
}
