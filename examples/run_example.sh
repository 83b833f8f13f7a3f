#!/usr/bin/env bash
# `handofflock run`: hold a lock around any command, like flock(1) for a fleet.
#
#   examples/run_example.sh [URL]        # default: a lock file under $TMPDIR
#
# Two jobs share one lock. The first runs; the second waits as the single
# waiter. `run` sends the first job SIGUSR1 (--signal), the job saves its step
# and exits, `run` hands the lock over, and the second job resumes from that
# step. A job that ignored the signal would be killed after --grace seconds.
set -euo pipefail

URL="${1:-${TMPDIR:-/tmp}/handofflock-examples/run.lock.json}"
HANDOFFLOCK="${HANDOFFLOCK:-handofflock}"          # the console script
WORK="$(mktemp -d "${TMPDIR:-/tmp}/handofflock-run-example.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
export STEP_FILE="$WORK/step" STEPS="${STEPS:-60}" HOLDS="$WORK/holds"

# The job: resume from $STEP_FILE, count to $STEPS, save the step on SIGUSR1 and stop.
# handofflock run gives it HANDOFFLOCK_TOKEN, the fencing token of this hold.
JOB='
name=$1
step=$(cat "$STEP_FILE" 2>/dev/null || echo 0)
echo "$name: token $HANDOFFLOCK_TOKEN, starting at step $step"
stop=0
trap "stop=1" USR1
touch "$HOLDS"  # ready to be asked
while [ "$step" -lt "$STEPS" ] && [ "$stop" -eq 0 ]; do
  sleep 0.05
  step=$((step + 1))
done
echo "$step" > "$STEP_FILE"
echo "$name: saved step $step ($([ "$stop" -eq 1 ] && echo "asked to yield" || echo "done"))"
'

"$HANDOFFLOCK" run "$URL" --signal USR1 --grace 10 --poll-interval 0.5 --min-hold 0 -- bash -c "$JOB" job first &  # yields at once, for the demo
first=$!
# The second asks once the first holds the lock (on a busy machine starting the first takes a while).
for _ in $(seq 300); do [ -e "$HOLDS" ] && break; sleep 0.1; done
"$HANDOFFLOCK" run "$URL" --signal USR1 --grace 10 --poll-interval 0.5 -- bash -c "$JOB" job second
wait "$first"
echo "both jobs done; final step $(cat "$STEP_FILE") of $STEPS"
