#!/usr/bin/env bash
# One benchmark session, then benchmarks/RESULTS.md:
#   1. `rqueue bench --json` against a private redis-server started here on a
#      free loopback port without persistence (stopped by its PID at the end);
#   2. the peers' benchmarks, ../shared/peers/run_all.sh, in the same session
#      (their own servers on 6390/6391, 5673, 4223; skipped with a reason when
#      those cannot be started);
#   3. benchmarks/compare.py, which writes benchmarks/RESULTS.md.
# Never touches the shared servers on 6379, 5672 or 4222.
#
# usage: benchmarks/run.sh [rqueue bench options]     (default: --full)
# env:   RQUEUE_BENCH_SKIP_PEERS=1   only rqueue's figures
#        PEERS_VENV      the peers' virtualenv (default /tmp/peers-venv; made on first use)
#        PEERS_BUDGET_S  time budget of run_all.sh in seconds (default 660)
#        PEERS_TIMEOUT_S hard limit of run_all.sh in seconds (default 840)
#        BENCH_RUN_DIR   raw results (default /tmp/rqueue-bench-<date>)
#        BENCH_OUT       the report to write (default benchmarks/RESULTS.md)
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
PY=${PY:-$ROOT/.venv/bin/python}
PEERS_DIR=${PEERS_DIR:-$(cd "$ROOT/.." && pwd)/shared/peers}
RUN=${BENCH_RUN_DIR:-/tmp/rqueue-bench-$(date +%Y%m%d-%H%M%S)}
OUT=${BENCH_OUT:-$HERE/RESULTS.md}
T_START=$(date +%s)
mkdir -p "$RUN/redis"
[ -x "$PY" ] || { echo "no $PY: python3 -m venv .venv && .venv/bin/pip install -e '.[dev]'" >&2; exit 1; }
command -v redis-server >/dev/null || { echo "missing redis-server: apt-get install -y redis-server" >&2; exit 1; }
if [ "$#" -eq 0 ]; then set -- --full; fi

# -- 1. rqueue bench against a private redis-server ----------------------------
# A free loopback port that is none of the shared servers' nor the peers' ports.
PORT=$("$PY" - <<'EOF'
import socket
reserved = {6379, 6390, 6391, 5672, 5673, 4222, 4223, 4369, 4370, 25672, 25673}
while True:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if port not in reserved:
        print(port)
        break
EOF
)
REDIS_PID=""
stop_redis() {
  if [ -n "$REDIS_PID" ] && kill -0 "$REDIS_PID" 2>/dev/null; then
    kill "$REDIS_PID"
    for _ in $(seq 1 100); do kill -0 "$REDIS_PID" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$REDIS_PID" 2>/dev/null && kill -9 "$REDIS_PID"
  fi
  REDIS_PID=""
}
trap 'stop_redis' EXIT
trap 'exit 130' INT TERM

redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --maxmemory-policy noeviction \
  --dir "$RUN/redis" --logfile "$RUN/redis.log" --daemonize no &
REDIS_PID=$!
URL="redis://127.0.0.1:$PORT/0"
"$PY" - "$URL" <<'EOF' || { echo "redis-server did not start on port $PORT (see $RUN/redis.log)" >&2; exit 1; }
import sys, time, redis
r = redis.Redis.from_url(sys.argv[1], socket_connect_timeout=0.5)
deadline = time.time() + 20
while True:
    try:
        r.ping(); break
    except redis.ConnectionError:
        if time.time() > deadline: sys.exit(1)
        time.sleep(0.1)
EOF

BENCH=("$PY" -m rqueue.cli)
# which rqueue is measured: the commit, and files changed since (other than benchmarks/)
{ git -C "$ROOT" log -1 --format='%h %s' 2>/dev/null || echo "not a git checkout"
  git -C "$ROOT" status --porcelain -- rqueue pyproject.toml 2>/dev/null | grep -v '^.. rqueue/cli/bench/' ; } > "$RUN/git.txt"
echo "== rqueue bench against a private redis-server on 127.0.0.1:$PORT ($*); raw results in $RUN"
# stdout (the JSON) to a file, stderr (the progress) to the terminal and a log
"${BENCH[@]}" --url "$URL" bench --json "$@" 2>&1 > "$RUN/rqueue.json" | tee "$RUN/rqueue-progress.log" >&2
RQ_RC=${PIPESTATUS[0]}
redis-server --version > "$RUN/redis-version.txt" 2>&1
stop_redis
T_RQ=$(( $(date +%s) - T_START ))
echo "== rqueue bench took ${T_RQ} s (rc=$RQ_RC)"

# -- 2. the peers, same session --------------------------------------------------
PEERS_STATUS="$RUN/peers-status.txt"
peers_ports_busy() {
  "$PY" - <<'EOF'
import socket, sys
busy = []
for port in (6390, 6391, 5673, 4223, 4370, 25673):
    with socket.socket() as s:
        s.settimeout(0.3)
        if s.connect_ex(("127.0.0.1", port)) == 0:
            busy.append(str(port))
print(" ".join(busy))
EOF
}
if [ "${RQUEUE_BENCH_SKIP_PEERS:-0}" = 1 ]; then
  echo "not run: RQUEUE_BENCH_SKIP_PEERS=1" > "$PEERS_STATUS"
elif [ ! -f "$PEERS_DIR/run_all.sh" ]; then
  echo "not run: $PEERS_DIR/run_all.sh not found" > "$PEERS_STATUS"
else
  missing=""
  for b in redis-server redis-benchmark rabbitmq-server nats-server; do
    command -v "$b" >/dev/null || missing="$missing $b"
  done
  busy=$(peers_ports_busy)
  if [ -n "$missing" ]; then
    echo "not run: the peers' servers cannot be started, missing:$missing" > "$PEERS_STATUS"
  elif [ -n "$busy" ]; then
    echo "not run: the peers' ports are in use ($busy): another run_all.sh may be running" > "$PEERS_STATUS"
  else
    export PEERS_RUN="$RUN/peers" PEERS_BUDGET_S=${PEERS_BUDGET_S:-660}
    LIMIT=${PEERS_TIMEOUT_S:-840}
    echo "== peers: $PEERS_DIR/run_all.sh (budget ${PEERS_BUDGET_S} s, hard limit ${LIMIT} s); log in $RUN/peers.log"
    t0=$(date +%s)
    timeout -k 30 "$LIMIT" bash "$PEERS_DIR/run_all.sh" 2>&1 | tee "$RUN/peers.log"
    rc=${PIPESTATUS[0]}
    took=$(( $(date +%s) - t0 ))
    if [ "$rc" -eq 0 ]; then
      echo "ran: run_all.sh finished in ${took} s" > "$PEERS_STATUS"
    elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
      echo "cut short: run_all.sh hit the ${LIMIT} s limit after ${took} s (rc=$rc); figures up to then are used" > "$PEERS_STATUS"
    else
      echo "failed: run_all.sh exited rc=$rc after ${took} s (see $RUN/peers.log); figures up to then are used" > "$PEERS_STATUS"
    fi
  fi
fi
echo "== peers: $(cat "$PEERS_STATUS")"

# -- 3. the report ----------------------------------------------------------------
"$PY" "$HERE/compare.py" --rqueue "$RUN/rqueue.json" --peers-dir "$PEERS_DIR" --peers-run "$RUN/peers" \
  --peers-status "$PEERS_STATUS" --started "$T_START" --rqueue-seconds "$T_RQ" --git-info "$RUN/git.txt" \
  --command "benchmarks/run.sh $*" --out "$OUT"
CMP_RC=$?
echo "== total $(( $(date +%s) - T_START )) s; report: $OUT; raw results: $RUN"
[ "$RQ_RC" -eq 0 ] && [ "$CMP_RC" -eq 0 ]
