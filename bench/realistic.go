package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"

	"github.com/oncekey/oncekey/claim"
	"github.com/oncekey/oncekey/durable"
)

// Issue 44: the fresh workload's realistic business transaction, beside the
// minimal one (one INSERT into orders). It creates an order with two line
// items, takes the first line's quantity off the stock of its SKU (one row
// of realStockSKUs, chosen at random) and books the order's total in the
// ledger, on four tables with the indexes such tables have:
//
//   - sales_orders: bigserial primary key, customer_id (indexed),
//     created_at, status, total;
//   - order_lines: bigserial primary key, order_id (a foreign key to
//     sales_orders, indexed), sku, qty, price;
//   - stock: sku (primary key), on_hand, realStockSKUs rows;
//   - ledger: bigserial primary key, account_id (indexed), amount, ref
//     (unique: the request's key), created_at.
//
// Its statements, each a round trip: the order INSERT (RETURNING its id),
// one INSERT of both lines, the stock UPDATE, the ledger INSERT. The floor
// (floor-realistic-tx) sends them bare between BEGIN and COMMIT; the
// library variants run the same body (realOrder.write) as Do's fn, or, in
// library-claim-complete-realistic, in a transaction of its own between
// Claim and Lease.Complete.
const (
	realStockSKUs  = 5000
	realStockStart = 1_000_000_000 // on_hand of every SKU at the start
	realCustomers  = 100_000
	realLines      = 2
)

// realSQL are the realistic transaction's statements, on the run's schema.
type realSQL struct {
	insertOrder, insertLines, updateStock, insertLedger string
	orders, lines, stock, ledger                        string // the tables, schema-qualified
	skus                                                []string
}

// createRealistic creates the realistic transaction's tables in the run's
// schema and fills the stock, and returns its statements.
func createRealistic(ctx context.Context, e *env) (realSQL, error) {
	s := e.schema + "."
	r := realSQL{orders: s + "sales_orders", lines: s + "order_lines", stock: s + "stock", ledger: s + "ledger"}
	ddl := []string{
		`CREATE TABLE ` + r.orders + ` (id bigserial PRIMARY KEY, customer_id bigint NOT NULL,
	created_at timestamptz NOT NULL DEFAULT now(), status text NOT NULL, total bigint NOT NULL)`,
		`CREATE INDEX ON ` + r.orders + ` (customer_id)`,
		`CREATE TABLE ` + r.lines + ` (id bigserial PRIMARY KEY, order_id bigint NOT NULL REFERENCES ` + r.orders + ` (id),
	sku text NOT NULL, qty integer NOT NULL, price bigint NOT NULL)`,
		`CREATE INDEX ON ` + r.lines + ` (order_id)`,
		`CREATE TABLE ` + r.stock + ` (sku text PRIMARY KEY, on_hand bigint NOT NULL)`,
		fmt.Sprintf(`INSERT INTO %s (sku, on_hand) SELECT 'sku-' || lpad(i::text, 5, '0'), %d FROM generate_series(1, %d) i`,
			r.stock, realStockStart, realStockSKUs),
		`CREATE TABLE ` + r.ledger + ` (id bigserial PRIMARY KEY, account_id bigint NOT NULL, amount bigint NOT NULL,
	ref text NOT NULL UNIQUE, created_at timestamptz NOT NULL DEFAULT now())`,
		`CREATE INDEX ON ` + r.ledger + ` (account_id)`,
		`ANALYZE ` + r.stock,
	}
	for _, sql := range ddl {
		if _, err := e.pool.Exec(ctx, sql); err != nil {
			return r, fmt.Errorf("bench: realistic tables: %w", err)
		}
	}
	r.insertOrder = `INSERT INTO ` + r.orders + ` (customer_id, status, total) VALUES ($1, 'placed', $2) RETURNING id`
	r.insertLines = `INSERT INTO ` + r.lines + ` (order_id, sku, qty, price) VALUES ($1, $2, $3, $4), ($1, $5, $6, $7)`
	r.updateStock = `UPDATE ` + r.stock + ` SET on_hand = on_hand - $1 WHERE sku = $2`
	r.insertLedger = `INSERT INTO ` + r.ledger + ` (account_id, amount, ref) VALUES ($1, $2, $3)`
	for i := 1; i <= realStockSKUs; i++ {
		r.skus = append(r.skus, fmt.Sprintf("sku-%05d", i))
	}
	return r, nil
}

// realOrder is one realistic order, drawn at random.
type realOrder struct {
	customer int64
	sku      [realLines]string
	qty      [realLines]int32
	price    [realLines]int64
}

func newRealOrder(r *realSQL) realOrder {
	o := realOrder{customer: 1 + rand.Int64N(realCustomers)}
	for i := range realLines {
		o.sku[i] = r.skus[rand.IntN(len(r.skus))]
		o.qty[i] = 1 + rand.Int32N(3)
		o.price[i] = 100 + rand.Int64N(10_000)
	}
	return o
}

func (o *realOrder) total() int64 {
	var t int64
	for i := range realLines {
		t += int64(o.qty[i]) * o.price[i]
	}
	return t
}

// write is the realistic business transaction's body in tx, the request's
// key as the ledger's reference: the order, its two lines, the stock of
// the first line's SKU, the ledger entry.
func (o *realOrder) write(ctx context.Context, r *realSQL, tx pgx.Tx, key string) error {
	var id int64
	if err := tx.QueryRow(ctx, r.insertOrder, o.customer, o.total()).Scan(&id); err != nil {
		return err
	}
	for _, s := range []struct {
		what string
		want int64
		sql  string
		args []any
	}{
		{"order lines INSERT", realLines, r.insertLines, []any{id, o.sku[0], o.qty[0], o.price[0], o.sku[1], o.qty[1], o.price[1]}},
		{"stock UPDATE", 1, r.updateStock, []any{o.qty[0], o.sku[0]}},
		{"ledger INSERT", 1, r.insertLedger, []any{o.customer, o.total(), key}},
	} {
		tag, err := tx.Exec(ctx, s.sql, s.args...)
		if err != nil {
			return err
		}
		if tag.RowsAffected() != s.want {
			return fmt.Errorf("%w: the %s wrote %d rows, want %d", ErrUnexpected, s.what, tag.RowsAffected(), s.want)
		}
	}
	return nil
}

// realSide books what a variant on the realistic transaction committed,
// warm-up included: the keys it answered executed, the stock it took, and
// its rounds' key prefixes (which the ledger's references start with).
type realSide struct {
	v        *variant
	executed atomic.Int64
	qty      atomic.Int64
	mu       sync.Mutex
	rounds   []string
}

// done books one committed order.
func (s *realSide) done(o *realOrder) {
	s.executed.Add(1)
	s.qty.Add(int64(o.qty[0]))
}

// before notes the round's key prefix.
func (s *realSide) before(_ context.Context, r *round) error {
	s.mu.Lock()
	s.rounds = append(s.rounds, strings.TrimSuffix(r.prefix, "-"))
	s.mu.Unlock()
	return nil
}

// realisticTx is floor-realistic-tx: BEGIN, the realistic transaction's
// statements, COMMIT, with pgx and no idempotency at all.
func (f *floors) realisticTx(ctx context.Context, s *realSide, key string) (outcome, error) {
	o := newRealOrder(&f.e.real)
	if err := o.commit(ctx, f.e, key); err != nil {
		return oOther, err
	}
	s.done(&o)
	return oExecuted, nil
}

// commit runs the order in a transaction of its own on the pool: BEGIN,
// the statements, COMMIT.
func (o *realOrder) commit(ctx context.Context, e *env, key string) error {
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	if err := o.write(ctx, &e.real, tx, key); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// doRealistic runs Do on c with the realistic transaction as fn, on a key
// never seen, and expects it executed.
func doRealistic(ctx context.Context, e *env, c *claim.Claimer[pgx.Tx], s *realSide, key string) (outcome, error) {
	o := newRealOrder(&e.real)
	out, err := doWith(ctx, c, key, func(ctx context.Context, tx pgx.Tx, _ claim.Op) (durable.Result, error) {
		if err := o.write(ctx, &e.real, tx, key); err != nil {
			return durable.Result{}, err
		}
		return result, nil
	})
	if err == nil {
		s.done(&o)
	}
	return out, err
}

// claimCompleteRealistic is the workflow on the realistic transaction:
// Claim on c (a key never seen: Acquired), the transaction on its own
// (BEGIN, the statements, COMMIT), then Lease.Complete with the result.
func claimCompleteRealistic(ctx context.Context, e *env, c *claim.Claimer[pgx.Tx], s *realSide, key string) (outcome, error) {
	out, err := c.Claim(ctx, request(key))
	if err != nil {
		return oOther, err
	}
	if out.Kind != claim.Acquired || out.Lease == nil {
		return oOther, fmt.Errorf("%w: Claim of a fresh key answered %v", ErrUnexpected, out.Kind)
	}
	o := newRealOrder(&e.real)
	if err := o.commit(ctx, e, key); err != nil {
		_ = out.Lease.Release(context.WithoutCancel(ctx)) // rolled back: nothing happened
		return oOther, err
	}
	if err := out.Lease.Complete(ctx, result); err != nil {
		return oOther, err
	}
	s.done(&o)
	return oExecuted, nil
}

// The realistic variants' names, and the floors of Do's protocol
// (issue 44: it locks first) without and with Redis, which bound them.
const (
	lockFirst         = "floor-lock-first"
	lockFirstRedis    = "floor-lock-first-redis"
	realFloor         = "floor-realistic-tx"
	realLibrary       = "library-realistic"
	realNoRedis       = "library-no-redis-realistic"
	realClaimComplete = "library-claim-complete-realistic"
)

// realisticVariants are the fresh workload's variants on the realistic
// transaction, each with the side that books what it committed: Do with
// and without Redis, Claim + the transaction + Lease.Complete (with Redis),
// and the bare transaction. Their targets (issue 44) are the workload's
// extras (issue44Targets), so the table reports their cost ratios alone.
func realisticVariants(e *env, f *floors) ([]*variant, []*realSide) {
	var sides []*realSide
	mk := func(v *variant, op func(ctx context.Context, s *realSide, key string) (outcome, error)) *variant {
		s := &realSide{v: v}
		v.before = s.before
		v.op = func(ctx context.Context, r *round, i int64) (outcome, error) { return op(ctx, s, r.key(i)) }
		sides = append(sides, s)
		return v
	}
	vs := []*variant{
		mk(&variant{name: realLibrary, costs: []costTarget{{floor: realFloor}}},
			func(ctx context.Context, s *realSide, key string) (outcome, error) {
				return doRealistic(ctx, e, e.withRedis, s, key)
			}),
		mk(&variant{name: realNoRedis, costs: []costTarget{{floor: realFloor}}},
			func(ctx context.Context, s *realSide, key string) (outcome, error) {
				return doRealistic(ctx, e, e.noRedis, s, key)
			}),
		mk(&variant{name: realClaimComplete, costs: []costTarget{{floor: realFloor}, {floor: "floor-business-tx"}}},
			func(ctx context.Context, s *realSide, key string) (outcome, error) {
				return claimCompleteRealistic(ctx, e, e.withRedis, s, key)
			}),
		mk(&variant{name: realFloor, floor: true, costs: []costTarget{{floor: "floor-business-tx"}}}, f.realisticTx),
	}
	return vs, sides
}

// realBook is what the realistic variants committed, from their sides and
// from the tables.
type realBook struct {
	sides []realSideBook
	// orders and lines are the rows of sales_orders and order_lines;
	// ledger all rows of the ledger; taken the stock taken off all SKUs.
	orders, lines, ledger, taken int64
}

// realSideBook is one variant's: the keys answered executed and the stock
// they took (booked by the variant), the ledger rows under its keys and
// their distinct references (read from the table).
type realSideBook struct {
	name                  string
	executed, qty         int64
	ledgerRows, distincts int64
}

// readRealBook reads the tables after the rounds.
func readRealBook(ctx context.Context, e *env, sides []*realSide) (realBook, error) {
	var b realBook
	r := &e.real
	err := e.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+r.orders+`), (SELECT count(*) FROM `+r.lines+`),
	(SELECT count(*) FROM `+r.ledger+`), (SELECT $1::bigint * count(*) - sum(on_hand) FROM `+r.stock+`)::bigint`,
		int64(realStockStart)).Scan(&b.orders, &b.lines, &b.ledger, &b.taken)
	if err != nil {
		return b, fmt.Errorf("bench: realistic tables: %w", err)
	}
	rows, err := e.pool.Query(ctx, `SELECT split_part(ref, '-', 1), count(*), count(DISTINCT ref) FROM `+r.ledger+` GROUP BY 1`)
	if err != nil {
		return b, fmt.Errorf("bench: ledger: %w", err)
	}
	type pair struct{ n, distinct int64 }
	byRound := map[string]pair{}
	for rows.Next() {
		var round string
		var p pair
		if err := rows.Scan(&round, &p.n, &p.distinct); err != nil {
			rows.Close()
			return b, err
		}
		byRound[round] = p
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return b, err
	}
	for _, s := range sides {
		sb := realSideBook{name: s.v.name, executed: s.executed.Load(), qty: s.qty.Load()}
		s.mu.Lock()
		for _, round := range s.rounds {
			p := byRound[round]
			sb.ledgerRows += p.n
			sb.distincts += p.distinct
		}
		s.mu.Unlock()
		b.sides = append(b.sides, sb)
	}
	return b, nil
}

// checks are the realistic transaction's correctness checks: every key a
// variant answered executed has its one ledger entry (its reference, the
// key, unique), one order per executed key across the variants and
// nothing else, two lines per order, and the stock taken once per key.
func (b realBook) checks() []extra {
	var out []extra
	var executed, qty, underKeys int64
	for _, s := range b.sides {
		executed += s.executed
		qty += s.qty
		underKeys += s.ledgerRows
		out = append(out, extra{
			Name: s.name + ": ledger rows per executed key", Value: ratio(float64(s.ledgerRows), float64(s.executed)),
			Target: "== 1", Check: true,
			Failed: s.executed == 0 || s.ledgerRows != s.executed || s.distincts != s.ledgerRows,
			Note: fmt.Sprintf("%d keys answered executed (warm-up included), %d ledger rows under its keys, %d distinct references",
				s.executed, s.ledgerRows, s.distincts),
		})
	}
	return append(out,
		extra{Name: "realistic: orders per executed key", Value: ratio(float64(b.orders), float64(executed)),
			Target: "== 1", Check: true, Failed: executed == 0 || b.orders != executed || b.ledger != executed || underKeys != b.ledger,
			Note: fmt.Sprintf("%d orders and %d ledger rows (%d under the variants' keys) for %d keys answered executed by %d variants",
				b.orders, b.ledger, underKeys, executed, len(b.sides))},
		extra{Name: "realistic: order lines per order", Value: ratio(float64(b.lines), float64(b.orders)),
			Target: fmt.Sprintf("== %d", realLines), Check: true, Failed: b.orders == 0 || b.lines != realLines*b.orders,
			Note: fmt.Sprintf("%d lines, %d orders", b.lines, b.orders)},
		extra{Name: "realistic: stock taken per unit ordered", Value: ratio(float64(b.taken), float64(qty)),
			Target: "== 1", Check: true, Failed: qty == 0 || b.taken != qty,
			Note: fmt.Sprintf("the stock UPDATE once per key: %d units taken off %d SKUs, %d ordered on the first lines of the executed keys",
				b.taken, realStockSKUs, qty)},
	)
}

// issue44Targets are issue 44's targets on the fresh workload, from the
// same run: the cost of Do without and with Redis against the realistic
// transaction (library-*-realistic) and the minimal one (library,
// library-no-redis against floor-business-tx), the caller's p50 with Redis
// against without, on either transaction, and Claim + Complete against
// both floors (no target). Each missed target says what bounds it.
func issue44Targets(vs []*variant, workers int) []extra {
	byName := map[string]*variant{}
	for _, v := range vs {
		byName[v.name] = v
	}
	thr := func(name string) float64 {
		if v := byName[name]; v != nil {
			return throughput(v)
		}
		return 0
	}
	// per is a request's share of the loop, 1/throughput, in µs: what
	// adds up when statements are added to a transaction.
	per := func(name string) float64 { return ratio(1e6, thr(name)) }
	p50 := func(name string) float64 {
		if v := byName[name]; v != nil {
			return us(v.st.h.quantile(0.5))
		}
		return 0
	}
	cost := func(lib, floor string) float64 { return ratio(thr(floor), thr(lib)) }
	judged := func(x extra, atMost float64, bound func() string) extra {
		x.Unit = "×"
		x.Target = fmt.Sprintf("<= %g", atMost)
		x.Meets = boolp(x.Value > 0 && x.Value <= atMost)
		if !*x.Meets {
			x.Bound = bound()
		}
		return x
	}
	// onRealistic: a ceiling on the realistic transaction, bounded by what
	// protoFloor (the library's statements and scripts around the minimal
	// transaction) adds to floor-business-tx, added to the realistic one.
	onRealistic := func(lib, protoFloor string, atMost float64) extra {
		r := cost(lib, realFloor)
		x := extra{Name: fmt.Sprintf("issue 44: %s / %s", lib, realFloor), Value: r,
			Note: fmt.Sprintf("%.0f/s against %.0f/s; p50 %s against %s", thr(lib), thr(realFloor), fmtUs(p50(lib)), fmtUs(p50(realFloor)))}
		return judged(x, atMost, func() string {
			add := per(protoFloor) - per("floor-business-tx")
			est := ratio(per(realFloor)+add, per(realFloor))
			head := fmt.Sprintf("%s costs %.2f× %s: %s (its protocol's statements and scripts on the minimal transaction) takes %s a request more than floor-business-tx "+
				"(1/throughput, %d workers); added to %s's %s, an estimated %.2f×",
				lib, r, realFloor, protoFloor, fmtUs(add), workers, realFloor, fmtUs(per(realFloor)), est)
			if est > atMost {
				return fmt.Sprintf("%s, over the ceiling: bounded by the protocol on today's record; the library adds %.2f× on top", head, ratio(r, est))
			}
			return fmt.Sprintf("%s, within the ceiling: the library's own share misses it (%.2f× the estimate)", head, ratio(r, est))
		})
	}
	// onMinimal: a ceiling on the minimal transaction, bounded by its
	// floor, measured.
	onMinimal := func(lib, libFloor string, atMost float64) extra {
		r, fc := cost(lib, "floor-business-tx"), cost(libFloor, "floor-business-tx")
		x := extra{Name: fmt.Sprintf("issue 44: %s / floor-business-tx", lib), Value: r,
			Note: fmt.Sprintf("%.0f/s against %.0f/s; its floor %s costs %.2f×", thr(lib), thr("floor-business-tx"), libFloor, fc)}
		return judged(x, atMost, func() string {
			if fc > atMost {
				return fmt.Sprintf("%s costs %.2f× floor-business-tx: bounded by its floor, %s alone costs %.2f×, over the ceiling; the library adds %.2f× on top",
					lib, r, libFloor, fc, ratio(r, fc))
			}
			return fmt.Sprintf("%s costs %.2f× floor-business-tx: its floor %s costs %.2f×, within the ceiling; the library's own share misses it (%.2f× the floor)",
				lib, r, libFloor, fc, ratio(r, fc))
		})
	}
	// p50: the caller's p50 with Redis against without, bounded by the
	// p50 the script calls add to floor-lock-first
	// (floor-lock-first-redis), on the variant without Redis.
	p50Ratio := func(redis, noRedis string, atMost float64) extra {
		r := ratio(p50(redis), p50(noRedis))
		x := extra{Name: fmt.Sprintf("issue 44: p50, %s / %s", redis, noRedis), Value: r,
			Note: fmt.Sprintf("%s against %s; %s %s, %s %s",
				fmtUs(p50(redis)), fmtUs(p50(noRedis)), lockFirstRedis, fmtUs(p50(lockFirstRedis)), lockFirst, fmtUs(p50(lockFirst)))}
		return judged(x, atMost, func() string {
			add := p50(lockFirstRedis) - p50(lockFirst)
			est := ratio(p50(noRedis)+add, p50(noRedis))
			head := fmt.Sprintf("p50 %s is %.2f× %s's %s: the script calls make %s's p50 %s more than %s's; "+
				"added to %s's, an estimated %.2f×", fmtUs(p50(redis)), r, noRedis, fmtUs(p50(noRedis)), lockFirstRedis, fmtUs(add), lockFirst, noRedis, est)
			if est > atMost {
				return head + ", over the target: bounded by the Redis round trips of the floors"
			}
			return fmt.Sprintf("%s, within the target: the library's Redis path adds the rest (%.2f× the estimate)", head, ratio(r, est))
		})
	}
	out := []extra{
		onRealistic(realNoRedis, lockFirst, 1.3),
		onMinimal("library-no-redis", lockFirst, 1.8),
		onRealistic(realLibrary, lockFirstRedis, 1.4),
		onMinimal("library", lockFirstRedis, 2.0),
		p50Ratio(realLibrary, realNoRedis, 1.3),
		p50Ratio("library", "library-no-redis", 1.3),
	}
	for _, floor := range []string{realFloor, "floor-business-tx"} {
		out = append(out, extra{Name: fmt.Sprintf("issue 44: %s / %s", realClaimComplete, floor), Value: cost(realClaimComplete, floor), Unit: "×",
			Note: fmt.Sprintf("Claim, the transaction on its own, Lease.Complete (Redis in front): %.0f/s against %.0f/s, p50 %s against %s; no target",
				thr(realClaimComplete), thr(floor), fmtUs(p50(realClaimComplete)), fmtUs(p50(floor)))})
	}
	return out
}
