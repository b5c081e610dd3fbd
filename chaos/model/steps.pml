/*
 * steps.pml: the oncekey workflow steps (Lease.Step, DESIGN 6.3.1) of ONE
 * operation record, checked by spin. claim.pml checks how a record is
 * claimed; this model takes the claim as one atomic statement and checks
 * what the steps add: StartStep, FinishStep, the resume after a takeover,
 * and the Reconciler settling the step an operation stopped at. See the
 * "Steps" section of README.md beside this file.
 *
 * Variants (spin -D...):
 *   NOFENCE   FinishStep without the token check (neither the record's
 *             holder, processing, nor the step's generation): P1 must fail
 *   IGNORE    a resume ignores finished steps and runs them again: P2 must
 *             fail
 *   RERUN     a step an earlier attempt started and never finished runs
 *             again though it is not Repeatable: P3 must fail
 *   INFLIGHT  the reconciler's resolver answers while a run of the step is
 *             still in flight (finding S1): P3 fails
 *   RELEASE   an attempt whose own Steps ran no fn (it only replayed) may
 *             Lease.Release, as the code allows (finding S2): the next claim
 *             starts a new life, and its steps run again with the same key
 *   RCOMPLETE the reconciler may also settle the whole operation (Complete)
 *   NOMARK    a worker whose step function failed never calls MarkUncertain
 * Bounds: NW workers (2 or 3), MAXTRY attempts each, NS steps (1 to 3),
 * REPMASK (bit i: step i is Repeatable), CRASHES worker crashes, LOSTS lost
 * replies of StartStep/FinishStep, NADOPT reconciler adoptions.
 */

#ifndef NW
#define NW 2
#endif
#ifndef MAXTRY
#define MAXTRY 2
#endif
#ifndef NS
#define NS 2
#endif
#ifndef REPMASK
#define REPMASK 2	/* step 1 Repeatable, steps 0 and 2 not */
#endif
#ifndef CRASHES
#define CRASHES 1
#endif
#ifndef LOSTS
#define LOSTS 1
#endif
#ifndef NADOPT
#define NADOPT 1
#endif
#if NS < 1 || NS > 3
#error "NS is 1 to 3"
#endif
#if NW < 1 || NW > 3
#error "NW is 1 to 3"
#endif

#define REP(i) ((REPMASK >> (i)) & 1)
#define OWNER(w, a) ((w) * MAXTRY + (a) + 1)	/* a fresh owner token per attempt */
#define RECON_ID(k) (NW * MAXTRY + (k) + 1)

/* record states (0: no record yet) */
#define PROC 1
#define UNC  2
#define DONE 3
#define REL  4	/* released (-DRELEASE): the next claim starts a new life */
/* step states */
#define S_NONE     0
#define S_STARTED  1
#define S_FINISHED 2
#define S_UNCERT   3
#define NOSTEP 255
/* replies */
#define ACQ      1	/* claim: acquired (created, or taken over) */
#define BUSY     2	/* claim: in progress under a live lease */
#define UNCERT   3	/* claim: the operation is uncertain */
#define REPLAY   4	/* claim: completed; the stored result is replayed */
#define RUN      5	/* StartStep: started under the token, fn must run */
#define REPLAYED 6	/* StartStep: finished earlier, its result returned */
#define USTEP    7	/* StartStep: ErrStepUncertain */
#define FENCED   8
#define OK       9
#define LOST     10	/* the statement applied, its reply was lost (ErrUnavailable) */

/* PROP(n, c): property Pn (README.md, "Steps") must hold; "n == n" only
 * labels the assertion in pan's report, for check.sh */
#define PROP(n, c) assert(n == n && (c))

/* the record */
byte rgen;	/* holder's generation */
byte rown;	/* holder's owner token */
byte rst;	/* 0 (no record), PROC, UNC, DONE, REL */
bool live;	/* the lease has not run out (the store's clock) */

/* step rows (3 places; those at NS and above stay S_NONE) */
byte sst[3];	/* state */
byte sgen[3];	/* generation that last started it */

/* ghosts for the properties */
byte eff[3];	/* applied effects of step i downstream (a Repeatable step's deduplicated by its key) */
bool fin[3];	/* step i was recorded finished (per key: a new life keeps it) */
byte inrun[NW];	/* i + 1: worker w's fn of step i is in flight (its effect may still land) */

/* faults */
bool crash[NW];
byte cr = CRASHES;
byte lost = LOSTS;

#define HOLDS(g, me) (rgen == (g) && rown == (me))
#define UNF(j) (sst[j] == S_STARTED || sst[j] == S_UNCERT)
#define NUNF (UNF(0) + UNF(1) + UNF(2))
#define NUNC ((sst[0] == S_UNCERT) + (sst[1] == S_UNCERT) + (sst[2] == S_UNCERT))
#define SFIN(j) ((j) >= NS || sst[j] == S_FINISHED)
#define ALLFIN (SFIN(0) && SFIN(1) && SFIN(2))

/* P4 (the second half), after every write: an uncertain record has exactly
 * one unfinished step, which Record.Step names (the uncertain one, or the
 * one started when its worker marked the record uncertain itself), and an
 * uncertain step is never left under a processing record */
#define CHECK4 PROP(4, (rst != UNC || NUNF == 1) && (NUNC == 0 || rst != PROC))

#if NW == 1
#define INFL(i) (inrun[0] == (i) + 1)
#elif NW == 2
#define INFL(i) (inrun[0] == (i) + 1 || inrun[1] == (i) + 1)
#else
#define INFL(i) (inrun[0] == (i) + 1 || inrun[1] == (i) + 1 || inrun[2] == (i) + 1)
#endif

/* the effect of worker w's run of step i lands downstream, with the
 * step's key: storeapi.StepKey, the operation id and the name, the same in
 * every attempt (and every life), so the key is the step's index here */
inline effect(w, i) {
	inrun[w] == i + 1;
	if
	:: REP(i) && eff[i] > 0 -> skip	/* a duplicate of the key: deduplicated */
	:: else ->
		eff[i]++;
		PROP(3, eff[i] <= 1);	/* P3: at most once */
		PROP(2, !fin[i])	/* P2: never after it was recorded finished */
	fi;
	inrun[w] = 0;
	printf("w%d: effect of step %d lands (applied %d)\n", w, i, eff[i])
}

/* Store.Claim as one statement (claim.pml checks it) */
inline claim(me, g, r) {
	if
	:: rst == 0 -> rgen = 1; rown = me; rst = PROC; live = 1; g = 1; r = ACQ
	:: rst == PROC && !live ->	/* takeover: same life, its steps count */
		rgen++; rown = me; live = 1; g = rgen; r = ACQ
	:: rst == PROC && live -> r = BUSY
	:: rst == UNC -> r = UNCERT
	:: rst == DONE -> r = REPLAY
#ifdef RELEASE
	:: rst == REL ->	/* a new life: the old life's step rows no longer count */
		rgen++; rown = me; rst = PROC; live = 1; g = rgen;
		for (r : 0 .. NS - 1) { sst[r] = S_NONE; sgen[r] = 0 };
		r = ACQ
#endif
	fi
}

/* P2, when StartStep says run, before it writes: a finished step never
 * runs again */
#define RUNS(i) PROP(2, !fin[i])

/* StartStep: one transaction that locks the record held by the token,
 * processing (stepHolderSQL), then reads and writes step i */
inline start_step(w, me, g, i, r) {
	if
	:: !(HOLDS(g, me) && rst == PROC) -> r = FENCED
	:: else ->
		if
		:: sst[i] == S_NONE ->
			PROP(1, HOLDS(g, me) && rst == PROC);
			RUNS(i); sst[i] = S_STARTED; sgen[i] = g; r = RUN
		:: sst[i] == S_FINISHED ->
#ifdef IGNORE
			RUNS(i); sst[i] = S_STARTED; sgen[i] = g; r = RUN
#else
			r = REPLAYED
#endif
		:: sst[i] == S_STARTED && sgen[i] == g -> RUNS(i); r = RUN	/* its reply was lost: fn has not run */
		:: sst[i] == S_STARTED && sgen[i] != g && REP(i) ->
			PROP(1, HOLDS(g, me) && rst == PROC);
			RUNS(i); sgen[i] = g; r = RUN	/* stepRestartSQL: again, same key */
#ifdef RERUN
		:: sst[i] == S_STARTED && sgen[i] != g && !REP(i) ->
			RUNS(i); sgen[i] = g; r = RUN
#endif
		:: else ->	/* started by an earlier attempt, not Repeatable (or uncertain) */
			PROP(1, HOLDS(g, me) && rst == PROC);
			sst[i] = S_UNCERT; rst = UNC; live = 0; r = USTEP
		fi
	fi;
	CHECK4;
	if
	:: r != FENCED && lost > 0 -> lost--; r = LOST
	:: skip
	fi;
	if
	:: r == RUN -> inrun[w] = i + 1
	:: else
	fi;
	printf("w%d o%d: StartStep(%d) gen %d -> %d\n", w, me, i, g, r)
}

/* FinishStep: one statement (stepFinishSQL) that matches the record held
 * by the token, processing, and the step started under its generation; when
 * it matches nothing, a read: finished under this generation (a repeat) is
 * success, anything else ErrFenced */
inline finish_step(w, me, g, i, r) {
	if
#ifdef NOFENCE
	:: sst[i] == S_STARTED ->
#else
	:: HOLDS(g, me) && rst == PROC && sst[i] == S_STARTED && sgen[i] == g ->
#endif
		PROP(1, HOLDS(g, me) && rst == PROC);	/* P1: never a stale owner */
		sst[i] = S_FINISHED; fin[i] = 1; r = OK;
		CHECK4
	:: else ->
		if
		:: sst[i] == S_FINISHED && sgen[i] == g -> r = OK
		:: else -> r = FENCED
		fi
	fi;
	if
	:: r == OK && lost > 0 -> lost--; r = LOST
	:: skip
	fi;
	printf("w%d o%d: FinishStep(%d) gen %d -> %d\n", w, me, i, g, r)
}

proctype Worker(byte w) {
	byte a;	/* attempts made */
	byte me;	/* this attempt's owner token */
	byte g;	/* and generation */
	byte i;	/* the step it is at */
	byte r;
	bool done;
	bool ran;	/* a Step's fn ran in this attempt (Lease.started) */
	do
	:: !done && a < MAXTRY ->
		{
			atomic {
				me = OWNER(w, a); a++;
				claim(me, g, r);
				printf("w%d o%d: Store.Claim -> %d gen %d\n", w, me, r, g)
			};
			if
			:: r == REPLAY -> done = 1; goto next
			:: r == BUSY || r == UNCERT -> goto next
			:: r == ACQ
			fi;
			i = 0;
steps:
			if
			:: i == NS ->	/* Lease.Complete, fenced */
				atomic {
					if
					:: HOLDS(g, me) && rst == PROC ->
						PROP(4, ALLFIN);	/* P4: only after every step finished */
						rst = DONE; live = 0; done = 1
					:: else
					fi;
					printf("w%d o%d: Complete -> %d\n", w, me, done)
				};
				goto next
#ifdef RELEASE
			:: !ran ->	/* Lease.Release: refused only after a fn of THIS attempt */
				atomic {
					if
					:: HOLDS(g, me) && rst == PROC ->
						rst = REL; rown = 0; live = 0;
						printf("w%d o%d: Release (no fn ran in this attempt)\n", w, me)
					:: else
					fi
				};
				goto next
#endif
			:: i < NS
			fi;
start:
			atomic { start_step(w, me, g, i, r) };
			if
			:: r == LOST -> goto start	/* ErrUnavailable: Step is called again */
			:: r == REPLAYED -> i++; goto steps
			:: r == FENCED || r == USTEP -> goto next
			:: r == RUN
			fi;
#ifdef RELEASE
			ran = 1;
#endif
			/* fn(ctx, key) */
			if
			:: atomic { effect(w, i) };
				if
				:: skip	/* fn returns the result */
				:: goto failed	/* fn returns an error after its effect */
				fi
			:: d_step { inrun[w] = 0 }; goto failed	/* fn fails, no effect */
			fi;
finish:
			atomic { finish_step(w, me, g, i, r) };
			if
			:: r == LOST -> goto finish	/* Step is called again: records, no run */
			:: r == OK -> i++; goto steps
			:: r == FENCED -> goto next
			fi;
failed:			/* Step returned fn's error: the step stays started */
			if
#ifndef NOMARK
			:: atomic {	/* Lease.MarkUncertain, fenced */
					HOLDS(g, me) && rst == PROC;
					rst = UNC; live = 0;
					CHECK4;
					printf("w%d o%d: MarkUncertain\n", w, me)
				}
#endif
			:: skip	/* or the attempt just ends: a resume decides */
			fi;
next:
			skip
		} unless {
			d_step {
				crash[w];
				crash[w] = 0; inrun[w] = 0;	/* a crash: fn's call never lands */
				printf("w%d o%d: crashes\n", w, me)
			}
		};
		d_step { me = 0; g = 0; i = 0; r = 0; ran = 0 }
	:: else -> break
	od
}

/* Reconciler.RunOnce for one uncertain record: Store.Adopt, Steps (the
 * step it stopped at: currentStep), the resolver's truth from downstream,
 * and Store.SettleStep (finished when the effect happened, else the row
 * deleted; then processing, its lease run out) */
proctype Reconciler() {
	byte k;
	byte me;
	byte g;
	byte i;
	byte j;
	byte u;
end_rec:
	do
	:: atomic {
			k < NADOPT && rst == UNC && !live;
			me = RECON_ID(k); k++;
			rgen++; rown = me; live = 1; g = rgen;
			/* currentStep: the uncertain one, else the last started */
			i = NOSTEP; u = NOSTEP;
			for (j : 0 .. NS - 1) {
				if
				:: sst[j] == S_UNCERT -> u = j
				:: sst[j] == S_STARTED -> i = j
				:: else
				fi
			};
			if
			:: u != NOSTEP -> i = u
			:: else
			fi;
			j = 0; u = 0;
			printf("reconciler o%d: Adopt -> gen %d, stopped at step %d\n", me, g, i)
		};
		if
		:: i != NOSTEP ->
			atomic {
#ifndef INFLIGHT
				/* the resolver's answer holds only once no run of the step
				 * can still land: it waits (StepNotHappened must be final) */
				!INFL(i);
#endif
				if
				:: HOLDS(g, me) && (rst == PROC || rst == UNC) && UNF(i) ->
					PROP(1, HOLDS(g, me));
					if
					:: eff[i] >= 1 -> sst[i] = S_FINISHED; fin[i] = 1	/* StepHappened */
					:: else -> sst[i] = S_NONE; sgen[i] = 0	/* StepNotHappened */
					fi;
					rst = PROC; live = 0;	/* back to the work, lease run out */
					CHECK4;
					printf("reconciler o%d: SettleStep(%d, happened %d)\n", me, i, eff[i] >= 1)
				:: else
				fi
			}
#ifdef RCOMPLETE
		:: atomic {	/* Resolved: the whole operation settled */
				HOLDS(g, me) && (rst == PROC || rst == UNC) ->
				rst = DONE; live = 0;
				printf("reconciler o%d: Complete\n", me)
			}
#endif
		:: skip	/* unresolved: left uncertain */
		fi;
		d_step { me = 0; g = 0; i = 0 }
	:: k >= NADOPT -> break
	od
}

/* the environment: the lease runs out (any number of ticks), a worker
 * crashes at its next step */
proctype Env() {
end_env:
	do
	:: d_step { live && rst != DONE; live = 0; printf("-- the lease runs out\n") }
	:: d_step { cr > 0 && !crash[0]; cr--; crash[0] = 1 }
#if NW > 1
	:: d_step { cr > 0 && !crash[1]; cr--; crash[1] = 1 }
#endif
#if NW > 2
	:: d_step { cr > 0 && !crash[2]; cr--; crash[2] = 1 }
#endif
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
		run Reconciler()
	}
}
