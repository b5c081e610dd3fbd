package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/claim/claimnats"
	"github.com/oncekey/oncekey/durable"
)

// charge is the message: charge an account an amount, once.
type charge struct {
	Charge string `json:"charge"`
	Amount int64  `json:"amount"`
}

// charges is the table the charges are written to, in the claim's
// transaction.
type charges[TTx any] interface {
	migrate(ctx context.Context) error
	insert(ctx context.Context, tx TTx, c charge) error
	// amounts returns the amounts charged under each charge id that starts
	// with prefix.
	amounts(ctx context.Context, prefix string) (map[string][]int64, error)
}

type pgCharges struct{ pool *pgxpool.Pool }

func (p pgCharges) migrate(ctx context.Context) error {
	_, err := p.pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS consumer_demo_charges (charge TEXT NOT NULL, amount BIGINT NOT NULL)`)
	return err
}

func (p pgCharges) insert(ctx context.Context, tx pgx.Tx, c charge) error {
	_, err := tx.Exec(ctx, `INSERT INTO consumer_demo_charges (charge, amount) VALUES ($1, $2)`, c.Charge, c.Amount)
	return err
}

func (p pgCharges) amounts(ctx context.Context, prefix string) (map[string][]int64, error) {
	rows, err := p.pool.Query(ctx, `SELECT charge, amount FROM consumer_demo_charges WHERE starts_with(charge, $1)`, prefix)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	return scanAmounts(rows)
}

// scanAmounts reads rows of (charge, amount) into the amounts of each
// charge.
func scanAmounts(rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}) (map[string][]int64, error) {
	m := map[string][]int64{}
	for rows.Next() {
		var c string
		var a int64
		if err := rows.Scan(&c, &a); err != nil {
			return nil, err
		}
		m[c] = append(m[c], a)
	}
	return m, rows.Err()
}

type sqliteCharges struct{ db *sql.DB }

func (s sqliteCharges) migrate(ctx context.Context) error {
	_, err := s.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS consumer_demo_charges (charge TEXT NOT NULL, amount INTEGER NOT NULL)`)
	return err
}

func (s sqliteCharges) insert(ctx context.Context, tx *sql.Tx, c charge) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO consumer_demo_charges (charge, amount) VALUES (?, ?)`, c.Charge, c.Amount)
	return err
}

func (s sqliteCharges) amounts(ctx context.Context, prefix string) (map[string][]int64, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT charge, amount FROM consumer_demo_charges WHERE substr(charge, 1, length(?)) = ?`, prefix, prefix)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	return scanAmounts(rows)
}

type worker[TTx any] struct {
	c     *claim.Claimer[TTx]
	cons  *claimnats.Consumer[TTx]
	table charges[TTx]
	log   *slog.Logger
	// givenUp counts the messages the consumer gave up on (terminated, or
	// at JetStream's MaxDeliver): JetStream keeps no dead-letter copy, so
	// the callback is where a real worker would keep them for an operator.
	givenUp atomic.Int32
}

func newWorker[TTx any](ctx context.Context, st durable.Store[TTx], opts []claim.Option, log *slog.Logger, table charges[TTx]) (*worker[TTx], error) {
	if err := table.migrate(ctx); err != nil {
		return nil, err
	}
	c, err := claim.New(st, append(opts, claim.WithLease(2*time.Second), claim.WithLogger(log))...)
	if err != nil {
		return nil, err
	}
	w := &worker[TTx]{c: c, table: table, log: log}
	w.cons, err = claimnats.New(c, claimnats.WithLogger(log), claimnats.WithRetryDelay(200*time.Millisecond),
		claimnats.WithDeadLetter(func(ctx context.Context, msg jetstream.Msg, err error) {
			w.givenUp.Add(1)
			log.WarnContext(ctx, "consumer: message given up; a real worker keeps it for an operator", "subject", msg.Subject(), "error", err)
		}))
	if err != nil {
		return nil, err
	}
	return w, nil
}

// handle charges one message in the claim's transaction.
func (w *worker[TTx]) handle(ctx context.Context, tx TTx, msg jetstream.Msg, op claim.Op) (durable.Result, error) {
	var c charge
	if err := json.Unmarshal(msg.Data(), &c); err != nil || c.Charge == "" || c.Amount <= 0 {
		return durable.Result{}, claim.Reject(durable.Result{StatusCode: 400, Body: []byte("bad charge")})
	}
	if err := w.table.insert(ctx, tx, c); err != nil {
		return durable.Result{}, err
	}
	return durable.Result{StatusCode: 201, Body: []byte("charged")}, nil
}

func randomName() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// run consumes until ctx is done, or runs the demo.
func (w *worker[TTx]) run(ctx context.Context, url string, demo bool, out io.Writer) error {
	nc, err := nats.Connect(url, nats.Timeout(10*time.Second))
	if err != nil {
		return fmt.Errorf("consumer: NATS: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if demo {
		return w.demo(ctx, url, js, out)
	}
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "ONCEKEY_CHARGES", Subjects: []string{"charges.charge"}}); err != nil {
		return fmt.Errorf("consumer: stream: %w", err)
	}
	c, err := js.CreateOrUpdateConsumer(ctx, "ONCEKEY_CHARGES", jetstream.ConsumerConfig{Durable: "charger", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		return err
	}
	cc, err := c.Consume(func(msg jetstream.Msg) {
		a, err := w.cons.Do(ctx, msg, w.handle)
		w.log.Info("consumer: message", "action", a.String(), "error", err)
	})
	if err != nil {
		return err
	}
	defer cc.Stop()
	// The sweeper deletes finished records past their retention, every
	// minute; nothing else does. It stops when the consumer does.
	swept := make(chan struct{})
	sweepCtx, stopSweep := context.WithCancel(ctx)
	go func() {
		defer close(swept)
		_ = w.c.RunSweeper(sweepCtx, time.Minute)
	}()
	defer func() {
		stopSweep()
		<-swept
	}()
	fmt.Fprintln(out, "consumer: consuming charges.charge of stream ONCEKEY_CHARGES")
	<-ctx.Done()
	return nil
}

// story prints the demo's lines and remembers failed expectations.
type story struct {
	out    io.Writer
	mu     sync.Mutex
	failed int
}

func (s *story) say(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprintf(s.out, "consumer: "+format+"\n", args...)
}

func (s *story) expect(ok bool, what string) {
	mark := "ok  "
	if !ok {
		mark = "FAIL"
		s.mu.Lock()
		s.failed++
		s.mu.Unlock()
	}
	s.say("%s %s", mark, what)
}
