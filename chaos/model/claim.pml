/*
 * claim.pml: the oncekey claim protocol for ONE idempotency key, checked by
 * spin. See README.md beside this file for what each step maps to in the Go
 * code, what is abstracted away, and the counterexamples behind each rule.
 *
 * Time is relative: every deadline is kept as "ticks remaining" and one clock
 * tick lowers them all (saturating at 0, which means expired). Only the
 * stores read those counters to decide a lease; a worker keeps its own
 * conservative deadline (wdl), counted from when it SENT the request.
 *
 * Variants (spin -D...):
 *   NC_NOFENCE      completion without the owner/generation check
 *   NC_TRUSTREDIS   the claim trusts Redis's generation instead of GREATEST
 *   NC_WORKERCLOCK  lease decisions on the worker's (skewed) clock
 *   NC_NOREREAD     an ambiguous COMMIT is taken as applied, not re-read
 *   NC_NOFLOOR      finding F1, the old rule: no clock floor on a record the
 *                   claim creates or restarts, and Sweep without the margin
 *                   (a swept row's generation is handed out again)
 *   STALE=2         a claim's clock reading may be older than the bound
 *                   (SWEEPMARGIN - LAG) when it inserts: the same reuse
 * Claimer.Do's first path (one of three; the default is the write at commit):
 *   (neither)       the write at commit (WAC, the WithWriteAtCommit opt-in):
 *                   fn, then the finished record inserted with the COMMIT,
 *                   no lock; a row (or the floor) sends it to the claim path
 *   LOCK            lock first, Do's default on durable/postgres: BEGIN, the
 *                   key's advisory lock, a check that no record exists, fn,
 *                   the finished record inserted with the COMMIT; a record
 *                   sends it to the claim path. Every claim takes the lock.
 *   NOWAC           claim first only: claim, effect and completion in one
 *                   transaction holding the row lock (Do on durable/sqlite;
 *                   the claim path is every variant's fallback)
 *   NC_FNFIRST      (with NOWAC) Do runs fn before its claim, as a write at
 *                   commit does, then claims: P7 must fail
 *   NC_NOLOCK       (with LOCK) Do does not take the key's lock: BEGIN, the
 *                   check, fn, insert at commit: P7 must fail
 *   NC_CLAIMNOLOCK  (with LOCK) the workflow's Claim (autocommit) does not
 *                   take the key's lock: P7 must fail
 *   NC_LOCKSNAP     (with LOCK) Do's check is in the lock's statement: its
 *                   snapshot predates the lock wait: P7 must fail
 *   NC_COMMITUPSERT write at commit: the insert does not fail on an existing
 *                   row (ON CONFLICT DO NOTHING): the effect commits anyway
 *   NC_COMMITNOROW  write at commit: a generation below the floor inserts
 *                   no row, and the COMMIT after it commits the effect
 *   NC_COMMITNOFLOOR write at commit: no floor check at the insert; with
 *                   LOCK: no floor check at BEGIN (the insert has none)
 *   NC_COMMITP1     write at commit: without Redis the proposal is 1, not
 *                   the client's clock
 * Bounds: NW workers, MAXTRY attempts each, NADOPT reconciler adoptions,
 * RFAULTS Redis faults, CRASHES worker crashes, DBFAULTS ambiguous commits
 * (T0, T1, T2: attempts of worker 0, 1, 2 when they differ).
 */

#ifndef NW
#define NW 2
#endif
#ifndef MAXTRY
#define MAXTRY 2
#endif
/* attempts per worker (each at most MAXTRY) */
#ifndef T0
#define T0 MAXTRY
#endif
#ifndef T1
#define T1 MAXTRY
#endif
#ifndef T2
#define T2 MAXTRY
#endif
#define TRIES(w) (w == 0 -> T0 : (w == 1 -> T1 : T2))
#ifndef NADOPT
#define NADOPT 1
#endif
#ifndef RFAULTS
#define RFAULTS 1
#endif
#ifndef CRASHES
#define CRASHES 1
#endif
#ifndef DBFAULTS
#define DBFAULTS 1
#endif

#ifndef LEASE
#define LEASE  1	/* lease length, in ticks */
#endif
#define MARGIN 1	/* a worker starts only with at least this much lease left */
#ifndef RETAIN
#define RETAIN 2	/* retention, in ticks */
#endif
/* MODES: which workers may run an attempt as Claimer.Do;
 * bit w set: worker w chooses per attempt; clear: always Claim + Lease */
#ifndef MODES
#define MODES 2
#endif
#define SKEW   1	/* worker clock error, +-, used by NC_WORKERCLOCK only */
/* Claimer.Do's first path: the write at commit (WAC, WithWriteAtCommit)
 * unless NOWAC (claim first only) or LOCK (lock first) is given */
#if !defined(NOWAC) && !defined(LOCK)
#define WAC 1
#endif
#if defined(NOWAC) && defined(LOCK)
#error "NOWAC and LOCK exclude each other"
#endif
#if defined(NC_FNFIRST) && !defined(NOWAC)
#error "NC_FNFIRST needs NOWAC"
#endif
#if (defined(NC_NOLOCK) || defined(NC_CLAIMNOLOCK) || defined(NC_LOCKSNAP)) && !defined(LOCK)
#error "NC_NOLOCK, NC_CLAIMNOLOCK and NC_LOCKSNAP need LOCK"
#endif

/*
 * The database clock (clock_timestamp() in ms in the code), in abstract
 * units, apart from the lease ticks: only its value when a claim or a Sweep
 * reads it matters, so it starts at CLK0 and jumps forward by CLKJUMP, at
 * any moment, at most CLKJUMPS times. It never steps back (the assumption).
 * Redis's clock is taken to be the same one; a Redis proposal is untrusted
 * anyway.
 *   LAG          a record the claim creates or restarts gets a generation
 *                of at least clk - LAG (60000 ms)
 *   RLAG         claim.lua proposes clk - RLAG (59000 ms: LAG less one
 *                unit, so the database keeps Redis's proposal), at least 1
 *   SWEEPMARGIN  Sweep deletes a row only if gen < clk - SWEEPMARGIN
 *                (120000 ms)
 *   STALE        a claim statement read the clock when it started and may
 *                insert up to STALE units later (it waited for the row
 *                lock; lock_timeout bounds that). Safe while
 *                SWEEPMARGIN >= LAG + STALE.
 */
#define LAG 1
#define RLAG (LAG - 1)
#define SWEEPMARGIN 2
#ifndef STALE
#define STALE 1
#endif
#define CLK0 (LAG + 2)	/* the clock floor starts positive */
#ifndef CLKJUMP
#define CLKJUMP (SWEEPMARGIN + 1)	/* one jump can make a young row sweepable */
#endif
#ifndef CLKJUMPS
#define CLKJUMPS 1
#endif
#define CLKMAX (CLK0 + CLKJUMPS * CLKJUMP)
#if STALE > 2
#error "STALE > 2: extend pick_floor"
#endif
#define SUB0(a, b) ((a) > (b) -> (a) - (b) : 0)	/* a - b, or 0 below it */
/* Do's proposal when Redis did not answer: the client's clock (taken to be
 * the database's) less atCommitLag, at least 1 */
#ifdef NC_COMMITP1
#define CLIENT_P 1
#else
#define CLIENT_P (SUB0(clk, RLAG) > 1 -> SUB0(clk, RLAG) : 1)
#endif

#ifdef NORESTART
#define RESTARTS 0	/* retention never passes (expires_at far away) */
#else
#define RESTARTS 1
#endif

#define MAXEP  (NW + NADOPT + 2)	/* operations (epochs) one key can see */
#define RECON_ID(k) (1 + NW * MAXTRY + (k))

/* record states; DONE stands for completed AND failed: Complete and Fail are
 * one statement with a different state value, and every rule treats them
 * alike (state IN ('completed', 'failed')). */
#define PROC 1
#define DONE 2
#define UNC  3

/* claim outcomes */
#define ACQ    1
#define REPLAY 2
#define BUSY   3	/* Redis: live lease of another owner; durable: in progress */
#define UNCERT 4

#define PENDING 255	/* lockby: a commit in flight that no worker waits for */

typedef Row {
	bool ex;	/* the row exists */
	byte st;	/* PROC, DONE, UNC */
	byte gen;	/* generation */
	byte own;	/* owner_token; 0 is NULL */
	byte lrem;	/* lease_expires_at, as ticks left; 0: expired or NULL */
	byte xrem;	/* expires_at (retention), as ticks left */
	byte res;	/* the stored result: the id of the owner that produced it */
	byte ep	/* ghost: which logical operation (epoch) the row holds */
};

/*
 * The durable store. While a transaction holds the row lock (locked),
 * "row" is that transaction's uncommitted version and "pre" the committed
 * one, which is what plain reads see (MVCC). Writers wait for the lock.
 */
Row row;
Row pre;
bool locked;
byte lockby;	/* w+1: worker w's open transaction; PENDING: commit in flight */
/*
 * The key's advisory lock (pg_advisory_xact_lock), apart from the row: held
 * by a transaction until it ends (commit, rollback, lost connection). Every
 * claim statement takes it first: Store.Claim in autocommit (one atomic
 * step here: it waits while the lock is held), and the claim inside a Do
 * transaction, which then holds it to its end. A lock-first Do (LOCK) takes
 * it in its BEGIN while no record exists. w+1: worker w's open transaction;
 * PENDING: its COMMIT in flight, which holds it until it lands or rolls back.
 */
byte klock;

#define COPYROW(d, s) d.ex = s.ex; d.st = s.st; d.gen = s.gen; d.own = s.own; \
	d.lrem = s.lrem; d.xrem = s.xrem; d.res = s.res; d.ep = s.ep
#define CLEARROW(d) d.ex = 0; d.st = 0; d.gen = 0; d.own = 0; d.lrem = 0; \
	d.xrem = 0; d.res = 0; d.ep = 0
/* what a plain read (Store.Get) sees */
#define SEEN(f) (locked -> pre.f : row.f)

/* Redis: the record's ONE string key (layout v2), which holds a lease, a
 * cached result, or nothing; never both (ONEKEY). No generation counter. */
typedef Rds {
	byte lown;	/* lease owner; 0: no lease */
	byte lgen;	/* lease generation */
	byte lrem;	/* lease PX TTL, as ticks left */
	bool cval;	/* a result is cached */
	byte cres;	/* the cached result */
	byte cep	/* ghost: the operation it belongs to */
};
Rds rd;
/* the one-key invariant, asserted after every script: a lease and a cached
 * result never coexist (an assert, not a property: the layout ensures it) */
#define ONEKEY assert(rd.lown == 0 || !rd.cval)

byte clk = CLK0;	/* the database clock (see LAG above) */
byte fl;	/* scratch: the floor of the claim being run (0 outside it) */

/* XNO...=1 switches one kind of Redis fault off (to measure what each costs) */
#ifndef XNOFLUSH
#define XNOFLUSH 0
#endif
#ifndef XNOJUMP
#define XNOJUMP 0
#endif
#ifndef XNODOWN
#define XNODOWN 0
#endif
#ifndef XNORERUN
#define XNORERUN 0
#endif
#ifndef XNOCALLFAIL
#define XNOCALLFAIL 0
#endif
/* fault budgets */
byte rf = RFAULTS;
byte cr = CRASHES;
byte dbf = DBFAULTS;
#define faults_on 1	/* faults are possible at every step (no "calm" phase) */

/* per worker */
bool crash[NW];		/* a crash is due: the worker's next step is the crash */
bool working[NW];	/* past the start-of-work check, lease believed held */
byte wdl[NW];		/* the worker's own deadline, ticks left */
byte rtmp[NW];		/* the deadline a Renew in flight will give */
bool waiting[NW];	/* backing off until the next tick */
byte rerun[NW];		/* a claim.lua run of this owner still queued in Redis */
bool final[NW];		/* the worker's client got a final answer */
byte off[NW];		/* clock offset + SKEW (NC_WORKERCLOCK only) */
byte nfinal;

/* ghosts for the properties */
byte effects[MAXEP];	/* P1: business effects committed, per operation */
byte infn[NW];		/* P7: the owner token whose fn the worker's Do runs, its
			 * transaction open; 0: none */
byte ack[MAXEP];	/* P5: the result a client was told, per operation */
byte last_gen;		/* P3 */
bool gone;		/* P3: the row was deleted since last_gen */
bool dn;		/* P4: the row's operation completed with ... */
byte dn_gen;
byte dn_own;
byte dn_res;
byte dn_ep;
bool ever;		/* a row was ever committed */
byte last_ep;		/* the operation of the last committed row */

#define AHEAD(w)  (off[w] > SKEW -> off[w] - SKEW : 0)
#define BEHIND(w) (off[w] < SKEW -> SKEW - off[w] : 0)
/* NC_WORKERCLOCK: the deadline from the record's lease_expires_at, read on my clock */
#define WDL_FROM_DB(w) (row.lrem + BEHIND(w) > AHEAD(w) -> row.lrem + BEHIND(w) - AHEAD(w) : 0)

#ifdef NC_WORKERCLOCK
/* the claim compares lease_expires_at with the claiming worker's clock */
#define EXPIRED(w) (row.lrem <= AHEAD(w))
#else
#define EXPIRED(w) (row.lrem == 0)
#endif

#ifdef NC_TRUSTREDIS
#define NEWGEN(p) row.gen = (p > 0 -> p : row.gen + 1)
#else
/* generation = GREATEST(proposed, old.generation + 1) */
#define NEWGEN(p) row.gen = (p > row.gen + 1 -> p : row.gen + 1)
#endif

#ifdef NC_NOFENCE
#define FENCED(me, g) (row.ex)
#else
#define FENCED(me, g) (row.ex && row.own == me && row.gen == g)
#endif

/* PROP(n, c): property Pn (README.md) must hold; "n == n" only labels the
 * assertion in pan's report, so check.sh can tell which property failed */
#define PROP(n, c) assert(n == n && (c))

/* P7, while worker f's Do runs fn (infn[f] its owner token): the committed
 * record is not something that answers the key for another owner, neither
 * finished within its retention nor processing under a live lease */
#define FNFREE(f) (infn[f] == 0 || row.own == infn[f] || \
	!((row.st == DONE && row.xrem > 0) || (row.st == PROC && row.own != 0 && row.lrem > 0)))
#if NW > 2
#define FNFREE_ALL (FNFREE(0) && FNFREE(1) && FNFREE(2))
#elif NW > 1
#define FNFREE_ALL (FNFREE(0) && FNFREE(1))
#else
#define FNFREE_ALL FNFREE(0)
#endif

/*
 * committed: called on every durable change once it is committed; checks
 * P3 (generation never decreases), P4 (a completed record never changes),
 * P5 (the stored result is the one every client was told) and P7 (no
 * record answers the key for another owner while a Do runs fn).
 */
inline committed() {
	if
	:: row.ex ->
		assert(row.ep < MAXEP);
		PROP(7, FNFREE_ALL);
		/* P3: never lower; and a row created after a Sweep never reuses
		 * the deleted row's generation */
		PROP(3, row.gen >= last_gen && (!gone || row.gen > last_gen));
		last_gen = row.gen; gone = 0;
		if
		:: dn && row.ep == dn_ep ->	/* P4 */
			PROP(4, row.st == DONE && row.gen == dn_gen &&
				row.own == dn_own && row.res == dn_res)
		:: else ->
			if
			:: row.st == DONE ->
				dn = 1; dn_gen = row.gen; dn_own = row.own;
				dn_res = row.res; dn_ep = row.ep
			:: else -> dn = 0; dn_gen = 0; dn_own = 0; dn_res = 0; dn_ep = 0
			fi
		fi;
		if
		:: row.st == DONE -> PROP(5, ack[row.ep] == 0 || ack[row.ep] == row.res)	/* P5 */
		:: else
		fi;
		ever = 1;
		last_ep = row.ep
	:: else ->
		dn = 0; dn_gen = 0; dn_own = 0; dn_res = 0; dn_ep = 0;
		gone = 1	/* last_gen stays: P3 holds across deletion */
	fi
}

/* acked: a client was told "success, result r" for operation e (P5). */
inline acked(a_e, a_r) {
	PROP(5, ack[a_e] == 0 || ack[a_e] == a_r);
	ack[a_e] = a_r
}

/* trail printing (spin -t); pan ignores printf */
#define SHOWROW printf("      row: exists=%d state=%d gen=%d owner=%d lease=%d retain=%d result=%d op=%d | redis: lease=%d/gen %d cached=%d | clock %d\n", \
	row.ex, row.st, row.gen, row.own, row.lrem, row.xrem, row.res, row.ep, rd.lown, rd.lgen, rd.cval, clk)
inline say(o) {
	if
	:: o == ACQ -> printf("acquired")
	:: o == REPLAY -> printf("replay")
	:: o == BUSY -> printf("in progress")
	:: o == UNCERT -> printf("uncertain")
	:: else -> printf("-")
	fi
}

/* ---------------- Redis scripts (each runs atomically) ---------------- */

/* the cache may hold a result only while its durable record is retained:
 * the code bounds the cache TTL by the record's remaining retention */
#define CACHE_OK(c) (c.cval && row.ex && c.cep == row.ep && row.xrem > 0)

/* claim.lua */
inline claim_lua(c_me, c_out, c_p, c_cr_, c_ce_) {
	if
	:: rd.cval -> c_out = REPLAY; c_cr_ = rd.cres; c_ce_ = rd.cep
	:: !rd.cval && rd.lown == c_me -> c_out = ACQ; c_p = rd.lgen	/* re-run: same generation */
	:: !rd.cval && rd.lown != 0 && rd.lown != c_me -> c_out = BUSY
	:: !rd.cval && rd.lown == 0 ->
		/* the key is absent: propose max(1, clock - RLAG), no counter
		 * (Redis's clock only jumps with the database's here, so two
		 * fresh claims between jumps propose the same generation: the
		 * store picks old + 1 and a syncgen follows) */
		c_p = (SUB0(clk, RLAG) > 1 -> SUB0(clk, RLAG) : 1);
		rd.lown = c_me; rd.lgen = c_p; rd.lrem = LEASE;
		c_out = ACQ
	fi;
	ONEKEY
}

/* syncgen.lua: rewrite the lease's generation if the lease is mine */
inline syncgen_lua(s_me, s_g) {
	if
	:: rd.lown == s_me -> rd.lgen = s_g
	:: else
	fi;
	ONEKEY
}

/* complete.lua: a lease of another owner with a higher generation means
 * this completion is stale: nothing is written. Otherwise, when the record
 * is still retained (ttl > 0), the result is cached and REPLACES any lease
 * in the key (this owner's, or another's of an older or equal generation);
 * with ttl = 0 nothing is cached and only this owner's lease is dropped. */
inline complete_lua(k_me, k_g, k_r, k_e) {
	if
	:: rd.lown != 0 && rd.lown != k_me && rd.lgen > k_g -> skip
	:: else ->
		if
		:: row.ex && row.ep == k_e && row.xrem > 0 ->
			rd.cval = 1; rd.cres = k_r; rd.cep = k_e;
			rd.lown = 0; rd.lgen = 0; rd.lrem = 0
		:: else ->
			if
			:: k_me != 0 && rd.lown == k_me -> rd.lown = 0; rd.lgen = 0; rd.lrem = 0
			:: else
			fi
		fi
	fi;
	ONEKEY
}

/* release.lua */
inline release_lua(r_me) {
	if
	:: rd.lown == r_me -> rd.lown = 0; rd.lgen = 0; rd.lrem = 0
	:: else
	fi;
	ONEKEY
}

/* renew.lua */
inline renew_lua(n_me) {
	if
	:: rd.lown == n_me -> rd.lrem = LEASE
	:: else
	fi;
	ONEKEY
}

/* a Redis write call that may fail (Redis down, reply lost): then skipped */
#define REDIS_MAY_FAIL (faults_on && rf > 0)

/* ---------------- the durable store ---------------- */

/* pick_floor: the clock floor of a claim statement, clock - LAG at the
 * statement's start, which is up to STALE units before it writes */
inline pick_floor() {
	if
	:: fl = SUB0(clk, LAG)
#if STALE >= 1
	:: fl = SUB0(clk, LAG + 1)
#endif
#if STALE >= 2
	:: fl = SUB0(clk, LAG + 2)
#endif
	fi
}

#ifdef NC_NOFLOOR
#define FLOORED(x) (x)
#define SWEEPABLE_GEN 1
#else
/* GREATEST(x, the claim's clock floor) */
#define FLOORED(x) ((x) > fl -> (x) : fl)
/* Sweep: generation < clock - SWEEPMARGIN */
#define SWEEPABLE_GEN (row.gen + SWEEPMARGIN < clk)
#endif

/*
 * db_claim: Store.Claim / Store.ClaimTx, ONE atomic statement:
 * INSERT ... ON CONFLICT DO UPDATE ... WHERE (a) takeover | (b) released |
 * (c) restart after retention; otherwise classify. The model has one
 * fingerprint, so the fingerprint conditions always hold. A record the
 * claim creates or restarts (insert, (b), (c)) gets at least the clock
 * floor; a takeover (a) does not.
 */
inline db_claim(d_me, d_p, d_w, d_out, d_g, d_e, d_r) {
	pick_floor();
	if
	:: !row.ex ->
		row.ex = 1; row.st = PROC; row.gen = FLOORED((d_p > 1 -> d_p : 1)); row.own = d_me;
		row.lrem = LEASE; row.xrem = RETAIN; row.res = 0;
		row.ep = (ever -> last_ep + 1 : 0);
		d_out = ACQ
	:: row.ex && row.st == PROC && row.own != 0 && EXPIRED(d_w) ->	/* (a) */
		NEWGEN(d_p); row.own = d_me; row.lrem = LEASE; row.xrem = RETAIN;
		d_out = ACQ
	:: row.ex && row.st == PROC && row.own == 0 ->	/* (b) */
		NEWGEN(d_p); row.gen = FLOORED(row.gen);
		row.own = d_me; row.lrem = LEASE; row.xrem = RETAIN;
		d_out = ACQ
	:: row.ex && row.st == DONE && row.xrem == 0 && RESTARTS ->	/* (c) a new operation */
		NEWGEN(d_p); row.gen = FLOORED(row.gen);
		row.own = d_me; row.lrem = LEASE; row.xrem = RETAIN;
		row.st = PROC; row.res = 0; row.ep = row.ep + 1;
		d_out = ACQ
	:: else ->
		if
		:: row.st == DONE -> d_out = REPLAY; d_r = row.res
		:: row.st == UNC -> d_out = UNCERT
		:: else -> d_out = BUSY
		fi
	fi;
	d_g = row.gen;
	d_e = row.ep;
	fl = 0
}

/* stage_complete: the fenced UPDATE of Store.Complete / CompleteTx:
 * WHERE pk AND owner AND generation AND state IN (processing, uncertain).
 * The change is staged under the row lock; the commit decides. */
inline stage_complete(f_me, f_g, f_ok) {
	if
	:: FENCED(f_me, f_g) && (row.st == PROC || row.st == UNC) ->
		printf("   Store.Complete(owner %d, gen %d) accepted; the row's token is (owner %d, gen %d)\n", f_me, f_g, row.own, row.gen);
		PROP(2, row.own == f_me && row.gen == f_g);	/* P2: no stale writer */
		row.st = DONE; row.res = f_me; row.lrem = 0;
		f_ok = 1
	:: else -> f_ok = 0
	fi
}

/* KUNLOCK(t): transaction t (w+1, or PENDING) ends: it gives back the key's
 * lock if it holds it */
#define KUNLOCK(t) if :: klock != 0 && klock == (t) -> klock = 0 :: else fi

/* commit_apply: the staged change of the lock holder becomes durable. */
inline commit_apply() {
	d_step {
		effects[row.ep]++;
		PROP(1, effects[row.ep] <= 1);	/* P1: at most one business effect */
		KUNLOCK(lockby);
		locked = 0; lockby = 0;
		CLEARROW(pre);
		committed()
	}
}

inline commit_abort() {
	d_step {
		COPYROW(row, pre);
		KUNLOCK(lockby);
		locked = 0; lockby = 0;
		CLEARROW(pre)
	}
}

/* commit: send the COMMIT; its outcome may be ambiguous to the sender. */
inline commit(m_ok) {
	if
	:: commit_apply(); m_ok = 1; printf("   COMMIT ok\n")
	:: faults_on && dbf > 0 -> dbf--; commit_apply(); m_ok = 0;	/* applied, ack lost */
		printf("   COMMIT applied, acknowledgement lost\n")
	:: faults_on && dbf > 0 -> dbf--; commit_abort(); m_ok = 0;	/* cut before it applied */
		printf("   COMMIT failed before it applied (error)\n")
	:: faults_on && dbf > 0 -> dbf--;	/* still in flight, holding its locks */
		if
		:: klock != 0 && klock == lockby -> klock = PENDING
		:: else
		fi;
		lockby = PENDING; m_ok = 0;
		printf("   COMMIT still in flight (error for the sender)\n")
	fi
}

/* reread: after an ambiguous commit, the store (or Do) reads the row:
 * completed under my owner AND generation with my result means success. */
inline reread(q_me, q_g, q_ok) {
#ifdef NC_NOREREAD
	q_ok = 1
#else
	d_step {
		q_ok = (SEEN(ex) && SEEN(st) == DONE && SEEN(own) == q_me &&
			SEEN(gen) == q_g && SEEN(res) == q_me)
	}
#endif
}

/* start_work: Claimer.Claim's (and Do's) start-of-work check, atomic with
 * its decision: a worker starts only with at least MARGIN of its own
 * deadline left (b_go). P6: when it starts, it holds a live lease in the
 * durable store, and no other worker believes (by its own deadline) that it
 * holds one. A pause right after the check is not prevented by any lease;
 * fencing (P1, P2) covers what follows. */
/*
 * fn_runs: worker f_w's Do (owner f_me) runs fn. P7: fn runs at most once
 * per record life, never for a key something else answers: no other Do
 * runs fn for the key at the same time, and the committed record is
 * neither finished within its retention (a replay answers) nor processing
 * under another owner's live lease (in progress). Checked here when fn
 * starts, and by committed() (FNFREE) on every committed change until fn's
 * transaction ends. A run whose transaction rolls back leaves nothing, and
 * the retry may run fn again.
 */
inline fn_runs(f_w, f_me) {
	for (i : 0 .. NW - 1) {
		PROP(7, i == f_w || !infn[i])
	};
	i = 0;
	PROP(7, !(SEEN(ex) && SEEN(st) == DONE && SEEN(xrem) > 0));
	PROP(7, !(SEEN(ex) && SEEN(st) == PROC && SEEN(own) != 0 && SEEN(own) != f_me && SEEN(lrem) > 0));
	infn[f_w] = f_me
}

inline start_work(b_w, b_me, b_go) {
	if
	:: wdl[b_w] < MARGIN -> b_go = 0
	:: else ->
		PROP(6, row.ex && row.own == b_me && row.lrem > 0);
		for (i : 0 .. NW - 1) {
			PROP(6, i == b_w || !(working[i] && wdl[i] > 0))
		};
		i = 0;
		working[b_w] = 1;
		b_go = 1
	fi
}

/* ---------------- processes ---------------- */

inline wait_tick(t_w) {
	waiting[t_w] = 1;
	!waiting[t_w]
}

inline backoff(o_w) {
	wait_tick(o_w)
}


/* a Redis call after a durable step: it runs, or fails and is skipped */
#define REDIS_CALL(stmt) if :: stmt :: REDIS_MAY_FAIL && !XNOCALLFAIL -> rf-- fi

/* Store.Release: processing -> processing with owner and lease NULL */
inline db_release(l_me, l_g) {
	if
	:: row.ex && row.own == l_me && row.gen == l_g && row.st == PROC ->
		row.own = 0; row.lrem = 0; committed()
	:: else
	fi
}

/*
 * Worker: one client's logical request, retried (MAXTRY attempts, each
 * with a fresh owner token) until it gets a final answer. An attempt is
 * Claimer.Claim followed by Lease.Renew / Complete / Release /
 * MarkUncertain, or Claimer.Do: first the write at commit (WAC: effect and
 * finished record inserted in the COMMIT, the transaction as the lease) or
 * the lock first (LOCK: the key's lock and a check that no record exists,
 * then the same), then, when a row exists or the generation is below the
 * floor, the claim path (claim, effect and completion in one transaction
 * holding the row lock and the key's lock). A crash may cut an attempt at
 * any step.
 */
proctype Worker(byte w) {
	byte a;		/* attempts made */
	byte me;	/* this attempt's owner token */
	byte p;		/* the generation Redis proposed; 0: none */
	byte out;
	byte g;		/* the token's generation */
	byte e;		/* the operation the claim saw */
	byte r;
	byte i;
	bool used;	/* Redis answered the claim */
	bool ok;
	bool amb;	/* the commit's outcome is unknown to me */
	bool dom;	/* this attempt is Claimer.Do */
#ifdef NC_LOCKSNAP
	bool snap;	/* the lock-first check's snapshot */
#endif

#ifdef NC_WORKERCLOCK
	if
	:: off[w] = 0
	:: off[w] = SKEW
	:: off[w] = 2 * SKEW
	fi;
#else
	off[w] = SKEW;
#endif
end_retry:
	do
	:: final[w] -> break
	:: !final[w] && a < TRIES(w) ->
		{
			/* Claimer.Claim / Do: the lease counts from the send;
			 * then Scripts.Claim (claim.lua) */
			atomic {
				me = 1 + w * MAXTRY + a;
				a++;
				if
				:: dom = 0
				:: (MODES >> w) & 1 -> dom = 1
				fi;
				wdl[w] = LEASE;
				if
				:: claim_lua(me, out, p, r, e); used = 1;
					printf("w%d o%d: claim.lua -> ", w, me); say(out); printf(" gen %d\n", p)
				:: REDIS_MAY_FAIL && !XNODOWN -> rf--; used = 0; p = 0;	/* down: breaker open */
					printf("w%d o%d: Redis down, straight to the store\n", w, me)
				:: REDIS_MAY_FAIL && !XNORERUN -> rf--;	/* go-redis retried: one more run queued */
					claim_lua(me, out, p, r, e); used = 1; rerun[w] = me;
					printf("w%d o%d: claim.lua (a re-run queued) -> ", w, me); say(out); printf(" gen %d\n", p)
				:: REDIS_MAY_FAIL && !XNORERUN -> rf--;	/* reply lost; one more run queued */
					claim_lua(me, out, p, r, e); used = 0; p = 0; rerun[w] = me;
					printf("w%d o%d: claim.lua ran, reply lost (a re-run queued)\n", w, me)
				fi;
				if
				:: used && out == REPLAY ->
					acked(e, r); final[w] = 1; nfinal++;
					printf("w%d o%d: client told: replay from Redis, result %d (op %d)\n", w, me, r, e);
					goto next
				:: used && out == BUSY -> goto busy
				:: else -> out = 0; e = 0; r = 0
				fi;
#ifdef NC_FNFIRST
				if
				:: dom -> fn_runs(w, me);
					printf("w%d o%d: fn runs before the claim\n", w, me)
				:: else
				fi;
#endif
#ifdef WAC
				/* Do: write at commit first; with Redis's generation
				 * when it acquired, else after a plain read */
				if
				:: dom && used -> g = p; goto atcommit
				:: dom && !used -> goto readfirst
				:: else
				fi
#endif
#ifdef LOCK
				/* Do: lock first; with Redis's generation when it
				 * acquired, else the client clock's proposal, after a
				 * plain read or not (doOnce: c.guess.recorded()) */
				if
				:: dom && used -> g = p; goto lockfirst
				:: dom && !used -> g = CLIENT_P; goto lockfirst
				:: dom && !used -> goto readfirst
				:: else
				fi
#endif
			};

			/* Store.Claim (autocommit) or Store.ClaimTx (inside Do),
			 * the key's lock first: a Do's transaction keeps it */
oldpath:
			atomic {
#ifdef NC_CLAIMNOLOCK
				!locked && (!dom || klock == 0);	/* Claim skips the lock */
#else
				!locked && klock == 0;
#endif
				if
				:: dom -> COPYROW(pre, row); locked = 1; lockby = w + 1; klock = w + 1
				:: else
				fi;
				db_claim(me, p, w, out, g, e, r);
				printf("w%d o%d: Store.Claim (in a Do tx: %d, proposed %d) -> ", w, me, dom, p); say(out); printf(" gen %d\n", g); SHOWROW;
				if
				:: !dom -> committed()
				:: else
				fi;
				if
				:: out == ACQ ->
					if
					:: !dom && used && g != p -> REDIS_CALL(syncgen_lua(me, g))
					:: else
					fi;
#ifdef NC_WORKERCLOCK
					wdl[w] = WDL_FROM_DB(w);
#endif
					start_work(w, me, ok);
					printf("w%d o%d: starts work: %d (own deadline %d)\n", w, me, ok, wdl[w]);
					if
					:: !ok ->	/* ErrLeaseExpired */
						if
						:: dom -> COPYROW(row, pre); locked = 0; lockby = 0; CLEARROW(pre); klock = 0
						:: else -> db_release(me, g);	/* Lease.Release */
							printf("w%d o%d: Store.Release\n", w, me)
						fi;
						if
						:: used -> release_lua(me)
						:: else
						fi;
						goto busy
					:: else
					fi
				:: else ->
					if
					:: dom -> CLEARROW(pre); locked = 0; lockby = 0; klock = 0	/* nothing written */
					:: else
					fi;
					if
					:: out == REPLAY ->
						acked(e, r); final[w] = 1; nfinal++;
						printf("w%d o%d: client told: replay, result %d (op %d)\n", w, me, r, e);
						/* refill the cache (complete.lua), dropping my lease */
						i = (used -> me : 0);
						REDIS_CALL(complete_lua(i, 0, r, e));
						i = 0;
						goto next
					:: else ->	/* in progress, or uncertain */
						if
						:: used -> release_lua(me)
						:: else
						fi;
						goto busy
					fi
				fi
			};

			if
			:: dom ->
				/* the business write and CompleteTx in the claim's
				 * transaction, then COMMIT */
				atomic {
#ifndef NC_FNFIRST
					fn_runs(w, me);	/* P7 */
#endif
					stage_complete(me, g, ok);
					assert(ok);	/* my own transaction holds the row */
					printf("w%d o%d: business write + CompleteTx in the tx\n", w, me);
					working[w] = 0;
					commit(ok);
					infn[w] = 0;
					amb = !ok
				}
			:: !dom ->
#ifndef NORENEW
				/* the work; meanwhile the lease may be renewed once */
				if
				:: skip
				:: rtmp[w] = LEASE;	/* Lease.Renew: the deadline counts from here */
					atomic {
						!locked;
						if
						:: row.ex && row.own == me && row.gen == g && row.st == PROC ->
							row.lrem = LEASE; committed();
							printf("w%d o%d: Store.Renew ok\n", w, me);
#ifdef NC_WORKERCLOCK
							wdl[w] = WDL_FROM_DB(w);
#else
							wdl[w] = rtmp[w];
#endif
							rtmp[w] = 0;
							for (i : 0 .. NW - 1) {	/* P6, again, if I believe I hold it */
								PROP(6, wdl[w] == 0 || i == w || !(working[i] && wdl[i] > 0))
							};
							i = 0;
							if
							:: used -> renew_lua(me)
							:: else
							fi
						:: else ->	/* ErrFenced: KeepAlive cancels the work */
							rtmp[w] = 0; working[w] = 0;
							goto busy
						fi
					}
				fi;
#endif
				if
				:: atomic {	/* Lease.Complete -> Store.Complete */
						!locked;
						COPYROW(pre, row);
						stage_complete(me, g, ok);
						working[w] = 0;
						if
						:: ok -> locked = 1; lockby = w + 1;
							commit(ok); amb = !ok
						:: else -> CLEARROW(pre);	/* ErrFenced */
							printf("w%d o%d: Store.Complete(gen %d) -> ErrFenced\n", w, me, g)
						fi
					}
				:: atomic {	/* transient failure before any effect: Lease.Release */
						!locked;
						db_release(me, g);
						printf("w%d o%d: Store.Release\n", w, me);
						working[w] = 0;
						if
						:: used -> release_lua(me)
						:: else
						fi;
						goto busy
					}
				:: atomic {	/* outcome unknown: Lease.MarkUncertain */
						!locked;
						if
						:: row.ex && row.own == me && row.gen == g && row.st == PROC ->
							row.st = UNC; row.lrem = 0; committed();
							printf("w%d o%d: Store.MarkUncertain\n", w, me)
						:: else
						fi;
						working[w] = 0;
						if
						:: used -> release_lua(me)
						:: else
						fi;
						goto busy
					}
				fi
			fi;

settle:
			if
			:: amb -> reread(me, g, ok);	/* the ambiguity re-read */
				printf("w%d o%d: re-read after the ambiguous commit -> success: %d\n", w, me, ok); SHOWROW
			:: else
			fi;
			atomic {
				if
				:: ok ->
					acked(e, me); final[w] = 1; nfinal++;
					printf("w%d o%d: client told: success, result %d (op %d)\n", w, me, me, e);
					if
					:: dom && used && g != p -> REDIS_CALL(syncgen_lua(me, g))
					:: else
					fi;
					/* complete.lua: cache the result, drop my lease */
					if
					:: used -> REDIS_CALL(complete_lua(me, g, me, e))
					:: else
					fi
				:: else	/* an error for the client, who retries */
				fi;
				goto next
			};
#if defined(WAC) || defined(LOCK)
			/*
			 * Do, write at commit (durable/postgres InsertAtCommit) or
			 * lock first (LOCK). Redis did not answer: a plain read of the
			 * committed row first, its own statement outside any
			 * transaction. No row: the generation is the client clock's
			 * proposal. Finished and retained: replay it. Any other row:
			 * the claim (old path).
			 */
readfirst:
			atomic {
				if
				:: !SEEN(ex) ->
					g = CLIENT_P;
#ifdef LOCK
					printf("w%d o%d: Store.Get -> no row; lock first, proposed %d\n", w, me, g);
					goto lockfirst
#else
					printf("w%d o%d: Store.Get -> no row; write at commit, proposed %d\n", w, me, g)
#endif
				:: SEEN(ex) && SEEN(st) == DONE && SEEN(xrem) > 0 ->
					e = SEEN(ep); r = SEEN(res);
					acked(e, r); final[w] = 1; nfinal++;
					printf("w%d o%d: Store.Get -> finished; client told: replay, result %d (op %d)\n", w, me, r, e);
					REDIS_CALL(complete_lua(0, 0, r, e));	/* refill */
					goto next
				:: else ->
					printf("w%d o%d: Store.Get -> a row (state %d); claim it\n", w, me, SEEN(st));
					goto oldpath
				fi
			};
#endif
#ifdef WAC
			/*
			 * BEGIN (no lock) and the business write, staged: invisible and
			 * nothing in the model's state until the COMMIT. The worker may
			 * pause here (any number of ticks) or crash (a rollback: no
			 * trace). Then INSERT (finished) + COMMIT in one round trip.
			 * The insert waits for a transaction that holds or inserts the
			 * row (!locked); it fails on a row (unique violation) and on a
			 * generation below the clock floor (division by zero), and the
			 * whole transaction rolls back: then the claim, old path.
			 */
atcommit:
			atomic {
				!locked;
				if
				:: row.ex ->
#ifdef NC_COMMITUPSERT
					/* ON CONFLICT DO NOTHING: the row stays someone
					 * else's; the COMMIT commits the business write */
					printf("w%d o%d: INSERT (gen %d) does nothing on the row; COMMIT commits the business write\n", w, me, g);
					e = row.ep;
					effects[e]++;
					PROP(1, effects[e] <= 1);	/* P1 */
					ok = 1; amb = 0;
					goto settle
#else
					printf("w%d o%d: INSERT at commit (gen %d) -> the row exists: rolled back; claim it\n", w, me, g);
					g = 0;
					goto oldpath
#endif
				:: else ->
					pick_floor();
					if
#ifndef NC_COMMITNOFLOOR
					:: g < fl ->
#ifdef NC_COMMITNOROW
						/* the floor as a WHERE that inserts no row: the
						 * COMMIT commits the business write alone */
						printf("w%d o%d: INSERT at commit (gen %d < floor %d) inserts no row; COMMIT commits the business write\n", w, me, g, fl);
						fl = 0;
						e = (ever -> last_ep + 1 : 0);
						assert(e < MAXEP);
						effects[e]++;
						PROP(1, effects[e] <= 1);	/* P1 */
						ok = 1; amb = 0;
						goto settle
#else
						printf("w%d o%d: INSERT at commit (gen %d < floor %d) -> refused: rolled back; claim it\n", w, me, g, fl);
						fl = 0; g = 0;
						goto oldpath
#endif
#endif
					:: else ->
						fl = 0;
						/* pre is the committed version: no row */
						row.ex = 1; row.st = DONE; row.gen = g; row.own = me;
						row.lrem = 0; row.xrem = RETAIN; row.res = me;
						row.ep = (ever -> last_ep + 1 : 0);
						e = row.ep;
						locked = 1; lockby = w + 1;
						printf("w%d o%d: business write + INSERT at commit (gen %d, finished)\n", w, me, g);
						commit(ok);
						amb = !ok;
						SHOWROW;
						goto settle
					fi
				fi
			};
#endif
#ifdef LOCK
#ifdef NC_LOCKSNAP
#define LOCKCHECK snap	/* what the check sees: the snapshot before the wait */
#define SAYLOCK printf("w%d o%d: key lock; check on the snapshot: ", w, me)
#elif defined(NC_NOLOCK)
#define LOCKCHECK SEEN(ex)
#define SAYLOCK printf("w%d o%d: BEGIN, check (no key lock): ", w, me)
#else
#define LOCKCHECK SEEN(ex)	/* a statement after the lock: committed state */
#define SAYLOCK printf("w%d o%d: BEGIN, key lock, check: ", w, me)
#endif
#ifdef NC_COMMITNOFLOOR
#define BELOWFLOOR 0	/* no floor check at BEGIN */
#else
#define BELOWFLOOR (g < fl)
#endif
			/*
			 * Do, lock first (Claimer.doLocked: durable/postgres
			 * InsertAtCommit with LockFirst). In the BEGIN's round trip:
			 * the key's lock (waits while a transaction holds it), then,
			 * in a statement of its own, a check that sees the committed
			 * state and reads the clock: a record of the key exists (any
			 * state), or the generation is below the clock floor -> rolled
			 * back, fn does not run (ErrExists); otherwise fn runs. (The
			 * floor is read as a claim's, up to STALE old: conservative,
			 * as nothing waits after this reading.)
			 */
lockfirst:
#ifdef NC_LOCKSNAP
			/* the check in the lock's statement: its snapshot is taken
			 * when the statement starts, before the lock wait */
			atomic {
				snap = SEEN(ex);
				printf("w%d o%d: BEGIN; key lock + check in one statement, its snapshot taken (record: %d)\n", w, me, snap)
			};
#endif
			atomic {
#ifndef NC_NOLOCK
				klock == 0;	/* pg_advisory_xact_lock waits */
				klock = w + 1;
#endif
				pick_floor();
				if
				:: LOCKCHECK || BELOWFLOOR ->
					SAYLOCK; printf("a record exists (%d) or gen %d < floor %d: rolled back, fn not run\n", LOCKCHECK, g, fl);
					fl = 0; KUNLOCK(w + 1);
					goto lockread
				:: else ->
					fl = 0;
					fn_runs(w, me);	/* P7 */
					SAYLOCK; printf("no record; fn runs (gen %d)\n", g)
				fi
			};
			/*
			 * fn's business write, staged: invisible until the COMMIT. The
			 * worker may pause here (holding the key's lock) or crash (a
			 * rollback: the lock is given back). Then INSERT (finished) +
			 * COMMIT in one round trip, as the write at commit's but
			 * without its floor check (done at BEGIN): it fails on a row
			 * (unique violation: only without the lock, in the NC_
			 * variants), and everything rolls back (ErrNotInserted).
			 */
			atomic {
				!locked;
				if
				:: row.ex ->
					KUNLOCK(w + 1); infn[w] = 0;
					printf("w%d o%d: INSERT at commit (gen %d) -> the row exists: rolled back\n", w, me, g);
					goto lockread
				:: else ->
					/* pre is the committed version: no row */
					row.ex = 1; row.st = DONE; row.gen = g; row.own = me;
					row.lrem = 0; row.xrem = RETAIN; row.res = me;
					row.ep = (ever -> last_ep + 1 : 0);
					e = row.ep;
					locked = 1; lockby = w + 1;
					printf("w%d o%d: fn's business write + INSERT at commit (gen %d, finished)\n", w, me, g);
					commit(ok);	/* gives the key's lock back (or keeps it in flight) */
					infn[w] = 0;
					amb = !ok;
					SHOWROW;
					goto settle
				fi
			};
			/*
			 * fn did not run, or rolled back: one plain read (readFirst).
			 * Finished and retained: replay it (and refill Redis). No row,
			 * or any other row: the claim (old path).
			 */
lockread:
			atomic {
				if
				:: SEEN(ex) && SEEN(st) == DONE && SEEN(xrem) > 0 ->
					e = SEEN(ep); r = SEEN(res);
					acked(e, r); final[w] = 1; nfinal++;
					printf("w%d o%d: Store.Get -> finished; client told: replay, result %d (op %d)\n", w, me, r, e);
					i = (used -> me : 0);
					REDIS_CALL(complete_lua(i, 0, r, e));
					i = 0;
					goto next
				:: else ->
					g = 0;
					printf("w%d o%d: Store.Get -> no finished row; claim it\n", w, me);
					goto oldpath
				fi
			};
#endif
busy:
			wait_tick(w);
next:
			skip
		} unless {
			d_step {
				crash[w];
				crash[w] = 0;
				if
				:: locked && lockby == w + 1 ->	/* connection gone: rolled back */
					COPYROW(row, pre); locked = 0; lockby = 0; CLEARROW(pre)
				:: else
				fi;
				KUNLOCK(w + 1);	/* and the key's lock given back */
				working[w] = 0; waiting[w] = 0; wdl[w] = 0; rtmp[w] = 0; infn[w] = 0
			}
		};
		d_step {
			p = 0; used = 0; out = 0; g = 0; e = 0; r = 0; ok = 0; amb = 0; dom = 0;
			me = 0; working[w] = 0; wdl[w] = 0; rtmp[w] = 0; waiting[w] = 0; infn[w] = 0
		}
	:: !final[w] && a >= TRIES(w) -> break	/* the client gives up */
	od;
	skip;	/* (a break may not jump into a d_step) */
	d_step { crash[w] = 0; off[w] = 0 }
}

/* Reconciler.Run: adopts stuck rows (Store.Adopt) and finishes them under
 * its own token with what the downstream system says happened. */
#ifdef RECON_PROC
#define ADOPTABLE (row.ex && ((row.st == UNC && row.lrem == 0) || \
	(row.st == PROC && row.own != 0 && row.lrem == 0)))
#else
/* by default the reconciler adopts only uncertain rows: adopting an expired
 * processing row is the worker's takeover again, with proposed 0 (checked
 * with -DRECON_PROC) */
#define ADOPTABLE (row.ex && row.st == UNC && row.lrem == 0)
#endif

proctype Reconciler() {
	byte k;
	byte me;
	byte g;
	bool ok;
end_rec:
	do
	:: k < NADOPT ->
		atomic {	/* Store.Adopt, waiting until a row needs it */
			!locked && ADOPTABLE;
			me = RECON_ID(k);
			k++;
			row.gen = row.gen + 1;	/* GREATEST(0, old + 1) */
			row.own = me; row.lrem = LEASE; g = row.gen;
			committed();
			printf("reconciler o%d: Store.Adopt -> gen %d\n", me, g)
		};
		if
		:: /* the outcome is known: Store.Complete under my token */
			d_step {
				!locked;
				stage_complete(me, g, ok);
				printf("reconciler o%d: Store.Complete -> %d\n", me, ok);
				if
				:: ok ->
					effects[row.ep]++;
					PROP(1, effects[row.ep] <= 1);	/* P1 */
					committed()
				:: else
				fi;
				me = 0; g = 0; ok = 0
			}
		:: d_step { faults_on; me = 0; g = 0 }	/* unknown yet: left for a later pass */
		fi
	:: k >= NADOPT -> break
	od
}

/* one clock tick: every deadline comes one tick closer */
inline tick() {
	d_step {
		if
		:: row.lrem > 0 -> row.lrem--
		:: else
		fi;
		if
		:: row.xrem > 0 -> row.xrem--
		:: else
		fi;
		if
		:: pre.lrem > 0 -> pre.lrem--
		:: else
		fi;
		if
		:: pre.xrem > 0 -> pre.xrem--
		:: else
		fi;
		if
		:: rd.lrem > 0 -> rd.lrem--;
			if
			:: rd.lrem == 0 -> rd.lown = 0; rd.lgen = 0
			:: else
			fi
		:: else
		fi;
		/* the cache TTL never outlives the record's retention */
		if
		:: rd.cval && !CACHE_OK(rd) -> rd.cval = 0; rd.cres = 0; rd.cep = 0
		:: else
		fi;
		for (j : 0 .. NW - 1) {
			if
			:: wdl[j] > 0 -> wdl[j]--
			:: else
			fi;
			if
			:: rtmp[j] > 0 -> rtmp[j]--
			:: else
			fi;
			waiting[j] = 0
		};
		j = 0
	}
}

proctype Env() {
	byte j;
end_env:
	do
	:: atomic { tick(); printf("-- tick\n") }
	/* Redis loses everything (restart, empty). This is also the failover
	 * to a replica that missed the latest writes: the lease or cached
	 * result written since is gone. Before layout v2 that fault also set
	 * the generation counter back, a fault of its own; with no counter and
	 * one key it leaves the key absent, which is this one, so it is folded
	 * in here. (A replica that brings back an OLDER value of the key is
	 * not modelled.) */
	:: d_step {
			faults_on && rf > 0 && !XNOFLUSH;
			rf--;
			rd.lown = 0; rd.lgen = 0; rd.lrem = 0;
			rd.cval = 0; rd.cres = 0; rd.cep = 0;
			printf("!! Redis restarts empty (or fails over to a lagging replica)\n")
		}
	/* Redis's clock jumps: the lease expires early */
	:: d_step {
			faults_on && rf > 0 && rd.lown != 0 && !XNOJUMP; rf--; rd.lown = 0; rd.lgen = 0; rd.lrem = 0;
			printf("!! Redis clock jump: lease gone\n") }
	/* a queued claim.lua of an earlier request runs now, or never */
	:: d_step {
			rerun[0] != 0; printf("!! queued claim.lua of owner %d runs\n", rerun[0]);
			claim_lua(rerun[0], j, j, j, j); j = 0; rerun[0] = 0 }
	:: d_step { rerun[0] != 0; rerun[0] = 0 }
#if NW > 1
	:: d_step {
			rerun[1] != 0; printf("!! queued claim.lua of owner %d runs\n", rerun[1]);
			claim_lua(rerun[1], j, j, j, j); j = 0; rerun[1] = 0 }
	:: d_step { rerun[1] != 0; rerun[1] = 0 }
#endif
#if NW > 2
	:: d_step {
			rerun[2] != 0; printf("!! queued claim.lua of owner %d runs\n", rerun[2]);
			claim_lua(rerun[2], j, j, j, j); j = 0; rerun[2] = 0 }
	:: d_step { rerun[2] != 0; rerun[2] = 0 }
#endif
	/* a worker crashes at its next step */
	:: d_step {
			faults_on && cr > 0 && !final[0]; cr--; crash[0] = 1;
			printf("!! worker 0 crashes\n") }
#if NW > 1
	:: d_step {
			faults_on && cr > 0 && !final[1]; cr--; crash[1] = 1;
			printf("!! worker 1 crashes\n") }
#endif
#if NW > 2
	:: d_step {
			faults_on && cr > 0 && !final[2]; cr--; crash[2] = 1;
			printf("!! worker 2 crashes\n") }
#endif
	/* a commit nobody waits for any more lands, or not */
	:: atomic { locked && lockby == PENDING; commit_apply(); printf("   the in-flight COMMIT lands\n"); SHOWROW }
	:: atomic { locked && lockby == PENDING; commit_abort(); printf("   the in-flight COMMIT is rolled back\n") }
	/* the database clock moves forward */
	:: d_step { clk < CLKMAX; clk = clk + CLKJUMP; printf("-- database clock %d\n", clk) }
	/* Store.Sweep: finished or released rows past retention whose
	 * generation is below the sweep margin, skipping locked */
	:: d_step {
			RESTARTS && !locked && row.ex && row.xrem == 0 && SWEEPABLE_GEN &&
			(row.st == DONE || (row.st == PROC && row.own == 0));
			CLEARROW(row);
			committed();
			printf("Store.Sweep deletes the row\n")
		}
	od
}


init {
	atomic {
		byte w;
		for (w : 0 .. NW - 1) {
			run Worker(w)
		};
		w = 0;
		run Env();
#ifndef NORECON
		run Reconciler();
#endif
	}
}
