#!/usr/bin/env bash
# chaos/model/check.sh: verify the claim protocol model (claim.pml) and the
# workflow steps model (steps.pml) with spin.
#
# Every configuration of the real model must verify with no error and a
# complete (not depth-truncated) exhaustive search; every negative control
# must yield a counterexample, and for the property it exists for. Prints
# the state counts. Installs nothing: it needs spin and gcc on PATH.
#
#   chaos/model/check.sh                    everything (two runs at a time)
#   chaos/model/check.sh NAME...            only these runs (names as in the table)
#   chaos/model/check.sh --except NAME...   every run but these
set -euo pipefail
cd "$(dirname "$0")"
here=$PWD

for tool in spin gcc; do
	if ! command -v "$tool" >/dev/null 2>&1; then
		echo "model: $tool not found (Debian: apt-get install -y $tool)" >&2
		exit 2
	fi
done

jobs=${MODEL_JOBS:-2}
depth=${MODEL_DEPTH:-20000}
memlim=${MODEL_MEMLIM:-12000} # MB, per run (r1 needs about 3.2 GB)

# NAME  EXPECT  [MODEL] DEFINES
#   EXPECT: ok, or Pn (a counterexample to property n of that model is required)
#   MODEL: the model file, when not claim.pml (steps.pml numbers its own P1-P4)
runs='
r1-all-faults      ok  -DNW=2 -DMAXTRY=1 -DMODES=3 -DRFAULTS=1 -DCRASHES=1 -DDBFAULTS=1
r2-redis-retry     ok  -DNW=2 -DMAXTRY=2 -DT1=1 -DMODES=0 -DRFAULTS=1 -DCRASHES=0 -DDBFAULTS=0
r3-db-retry        ok  -DNW=2 -DMAXTRY=2 -DT1=1 -DMODES=3 -DRFAULTS=0 -DCRASHES=1 -DDBFAULTS=1
r4-three-workers   ok  -DNW=3 -DMAXTRY=1 -DMODES=0 -DNORENEW -DNORECON -DRFAULTS=0 -DCRASHES=0 -DDBFAULTS=0
r5-recon-proc      ok  -DNW=2 -DMAXTRY=1 -DMODES=3 -DRFAULTS=0 -DCRASHES=1 -DDBFAULTS=1 -DRECON_PROC
r6-do-claimfirst   ok  -DNOWAC -DNW=2 -DMAXTRY=1 -DMODES=2 -DRFAULTS=1 -DCRASHES=1 -DDBFAULTS=1
r7-do-redis-retry  ok  -DNW=2 -DMAXTRY=2 -DT1=1 -DMODES=3 -DRFAULTS=1 -DCRASHES=0 -DDBFAULTS=0
r8-do-two-dos      ok  -DNOWAC -DNW=2 -DMAXTRY=1 -DMODES=3 -DRFAULTS=1 -DCRASHES=0 -DDBFAULTS=0
r9-lock-db-faults  ok  -DLOCK -DNW=2 -DMAXTRY=1 -DMODES=3 -DRFAULTS=0 -DCRASHES=1 -DDBFAULTS=1
r10-lock-redis     ok  -DLOCK -DNW=2 -DMAXTRY=1 -DMODES=3 -DRFAULTS=1 -DCRASHES=0 -DDBFAULTS=0
nc1-nofence        P2  -DNC_NOFENCE -DNW=2 -DMAXTRY=1 -DMODES=0 -DRFAULTS=0 -DCRASHES=0 -DDBFAULTS=0
nc2-trustredis     P3  -DNC_TRUSTREDIS -DNW=2 -DMAXTRY=2 -DT1=1 -DMODES=0 -DRFAULTS=1 -DCRASHES=0 -DDBFAULTS=0
nc3-workerclock    P6  -DNC_WORKERCLOCK -DNW=2 -DMAXTRY=1 -DMODES=0 -DRFAULTS=0 -DCRASHES=0 -DDBFAULTS=0
nc4-noreread       P5  -DNC_NOREREAD -DNW=2 -DMAXTRY=1 -DMODES=2 -DRFAULTS=0 -DCRASHES=0 -DDBFAULTS=1
nc5-stalefloor     P3  -DSTALE=2 -DNW=2 -DMAXTRY=1 -DMODES=0 -DRFAULTS=1 -DCRASHES=0 -DDBFAULTS=0
nc6-commit-upsert  P1  -DNC_COMMITUPSERT -DNW=2 -DMAXTRY=1 -DMODES=2 -DRFAULTS=0 -DCRASHES=0 -DDBFAULTS=0
nc7-commit-nofloor P3  -DNC_COMMITNOFLOOR -DNC_COMMITP1 -DNW=2 -DMAXTRY=1 -DMODES=2 -DRFAULTS=1 -DCRASHES=0 -DDBFAULTS=0
nc8-commit-norow   P1  -DNC_COMMITNOROW -DNW=2 -DMAXTRY=1 -DMODES=2 -DRFAULTS=0 -DCRASHES=0 -DDBFAULTS=0
nc9-do-fnfirst     P7  -DNOWAC -DNC_FNFIRST -DNW=2 -DMAXTRY=1 -DMODES=3 -DRFAULTS=1 -DCRASHES=0 -DDBFAULTS=0
nc10-do-nolock     P7  -DLOCK -DNC_NOLOCK -DNW=2 -DMAXTRY=1 -DMODES=3 -DRFAULTS=0 -DCRASHES=0 -DDBFAULTS=0
nc11-claim-nolock  P7  -DLOCK -DNC_CLAIMNOLOCK -DNW=2 -DMAXTRY=1 -DMODES=3 -DRFAULTS=0 -DCRASHES=0 -DDBFAULTS=0
nc12-lock-snapshot P7  -DLOCK -DNC_LOCKSNAP -DNW=2 -DMAXTRY=1 -DMODES=3 -DRFAULTS=0 -DCRASHES=0 -DDBFAULTS=0
nc13-lock-nofloor  P3  -DLOCK -DNC_COMMITNOFLOOR -DNW=2 -DMAXTRY=1 -DMODES=3 -DRFAULTS=1 -DCRASHES=0 -DDBFAULTS=0
f1-sweep-resets    P3  -DNC_NOFLOOR -DNW=2 -DMAXTRY=2 -DT1=1 -DMODES=0 -DRFAULTS=1 -DCRASHES=0 -DDBFAULTS=0
s1-steps           ok  steps.pml -DNW=2 -DMAXTRY=2 -DNS=2 -DREPMASK=2 -DCRASHES=1 -DLOSTS=1 -DNADOPT=1
s2-three-steps     ok  steps.pml -DNW=2 -DMAXTRY=2 -DNS=3 -DREPMASK=2 -DCRASHES=1 -DLOSTS=1 -DNADOPT=1
s3-steps-faults    ok  steps.pml -DNW=2 -DMAXTRY=2 -DNS=2 -DREPMASK=2 -DCRASHES=2 -DLOSTS=1 -DNADOPT=2 -DRCOMPLETE
s4-steps-3workers  ok  steps.pml -DNW=3 -DMAXTRY=1 -DNS=2 -DREPMASK=2 -DCRASHES=1 -DLOSTS=1 -DNADOPT=1
snc1-nofence       P1  steps.pml -DNOFENCE -DNW=2 -DMAXTRY=2 -DNS=2 -DREPMASK=2 -DCRASHES=1 -DLOSTS=1 -DNADOPT=1
snc2-ignore        P2  steps.pml -DIGNORE -DNW=2 -DMAXTRY=2 -DNS=2 -DREPMASK=2 -DCRASHES=1 -DLOSTS=1 -DNADOPT=1
snc3-rerun         P3  steps.pml -DRERUN -DNW=2 -DMAXTRY=2 -DNS=2 -DREPMASK=2 -DCRASHES=1 -DLOSTS=1 -DNADOPT=1
sf1-inflight       P3  steps.pml -DINFLIGHT -DNW=2 -DMAXTRY=2 -DNS=2 -DREPMASK=2 -DCRASHES=1 -DLOSTS=1 -DNADOPT=1
sf2-release        P2  steps.pml -DRELEASE -DNW=2 -DMAXTRY=2 -DNS=2 -DREPMASK=2 -DCRASHES=1 -DLOSTS=1 -DNADOPT=1
'

except=
if [ "${1:-}" = --except ]; then
	except=1
	shift
fi
want=" $* "
work=$(mktemp -d "${TMPDIR:-/tmp}/model.XXXXXX")
trap 'rm -rf "$work"' EXIT

# verify NAME EXPECT [MODEL] DEFINES...: one spin run; writes $work/NAME/result
verify() {
	local name=$1 expect=$2 model=claim.pml
	shift 2
	if [[ ${1:-} == *.pml ]]; then
		model=$1
		shift
	fi
	local dir=$work/$name
	mkdir -p "$dir"
	cp "$here/$model" "$dir/"
	(
		cd "$dir"
		spin -a "$@" "$model" >spin.log 2>&1 || { echo "FAIL spin -a: $(tail -n 3 spin.log)"; exit 0; }
		gcc -O2 -DSAFETY -DCOLLAPSE -DMEMLIM="$memlim" -o pan pan.c >gcc.log 2>&1 ||
			{ echo "FAIL gcc: $(tail -n 3 gcc.log)"; exit 0; }
		./pan -m"$depth" >pan.log 2>&1 || true
		local errors states depthr secs prop verdict
		errors=$(sed -n 's/.*errors: \([0-9]*\).*/\1/p' pan.log | tail -n 1)
		states=$(sed -n 's/^ *\([0-9.e+]*\) states, stored.*/\1/p' pan.log | tail -n 1)
		depthr=$(sed -n 's/.*depth reached \([0-9]*\).*/\1/p' pan.log | tail -n 1)
		secs=$(sed -n 's/^pan: elapsed time \([0-9.e+]*\) seconds.*/\1/p' pan.log | tail -n 1)
		prop=$(sed -n 's/.*assertion violated ((\([0-9]\)==\1).*/P\1/p' pan.log | head -n 1)
		if [ -z "$errors" ]; then
			verdict="FAIL no result: $(tail -n 2 pan.log | tr '\n' ' ')"
		elif grep -q 'max search depth too small' pan.log && [ "$expect" = ok ]; then
			verdict="FAIL search truncated at depth $depth (raise MODEL_DEPTH)"
		elif grep -qi 'out of memory\|memory limit' pan.log; then
			verdict="FAIL out of memory (MODEL_MEMLIM=$memlim)"
		elif [ "$expect" = ok ]; then
			if [ "$errors" = 0 ]; then verdict="ok   no errors"; else
				verdict="FAIL $errors error(s): $(grep -m1 'violated\|invalid end\|error' pan.log)"; fi
		else
			if [ "$errors" != 0 ] && [ "$prop" = "$expect" ]; then
				verdict="ok   counterexample to $prop, as required"
			elif [ "$errors" != 0 ]; then
				verdict="FAIL counterexample to ${prop:-another check}, not $expect: $(grep -m1 'violated\|invalid end' pan.log)"
			else
				verdict="FAIL no counterexample: the negative control passed"
			fi
		fi
		printf '%s states=%s depth=%s seconds=%s\n' "$verdict" "${states:-?}" "${depthr:-?}" "${secs:-?}"
	) >"$dir/result"
}

names=()
while read -r name expect defs; do
	[ -n "$name" ] || continue
	if [ -n "$except" ]; then
		[[ $want != *" $name "* ]] || continue
	elif [ "$want" != "  " ] && [[ $want != *" $name "* ]]; then
		continue
	fi
	names+=("$name")
	# shellcheck disable=SC2086 # the defines are words on purpose
	verify "$name" "$expect" $defs &
	while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
done <<<"$runs"
wait

if [ ${#names[@]} -eq 0 ]; then
	echo "model: no run named: $*" >&2
	exit 2
fi

status=0
printf '%-18s %s\n' run result
for name in "${names[@]}"; do
	line=$(cat "$work/$name/result" 2>/dev/null || echo "FAIL no result")
	printf '%-18s %s\n' "$name" "$line"
	case $line in FAIL*) status=1 ;; esac
done
if [ $status -ne 0 ]; then
	echo "model: FAILED" >&2
else
	echo "model: ok"
fi
exit $status
