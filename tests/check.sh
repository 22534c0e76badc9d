# Bookkeeping of the shell tests (sourced by tests/hosts/hosts_test.sh, tests/xnode/lib.sh):
# one "PASS: ..." or "FAIL: ..." line per check, and the counts for the final "N passed, N failed".
PASSED=0
FAILED=0
pass() { PASSED=$((PASSED + 1)); echo "PASS: $*"; }
failed() { FAILED=$((FAILED + 1)); echo "FAIL: $*"; }
check() {  # check "description" command...
  local what=$1; shift
  if "$@"; then pass "$what"; else failed "$what"; fi
}
