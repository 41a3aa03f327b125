# Sourced by install_deps.sh, main_job.sh and test_all.sh: run a setup phase with its output in a
# log file and one line on the terminal ("phase ... ok (12 s)"); on failure, the log's last lines
# and the exit status. WEFT_VERBOSE=1 (or install_deps.sh -v) shows everything instead.
: "${WEFT_LOG:=${TMPDIR:-/tmp}/weft-setup.log}"
export WEFT_LOG
phase() {
  local what=$1; shift
  if [ "${WEFT_VERBOSE:-0}" = 1 ]; then
    echo "== $what"
    "$@"
    return
  fi
  local t0=$SECONDS rc=0
  printf '%s ... ' "$what"
  { echo "== [$(date +%T)] $what: $*"; } >>"$WEFT_LOG"
  "$@" >>"$WEFT_LOG" 2>&1 </dev/null || rc=$?
  if [ $rc -eq 0 ]; then
    echo "ok ($((SECONDS - t0)) s)"
  else
    echo "FAILED (exit $rc); the last lines of $WEFT_LOG:"
    tail -n 30 "$WEFT_LOG" | sed 's/^/  | /'
    return $rc
  fi
}
