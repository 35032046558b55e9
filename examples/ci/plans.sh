#!/usr/bin/env bash
# A CI recipe: keep committed plans fresh.
#   examples/ci/plans.sh check   fail (exit 4) when a committed plan no longer
#                                fits its model or topology, or when a search
#                                with the plan's own settings finds a plan
#                                more than 2% faster
#   examples/ci/plans.sh regen   regenerate every plan (then commit them)
# The list of (model, topology, plan) is examples/ci/plans.txt; SOAPC names
# the soapc binary (default build/bin/soapc). Searches use a proposal budget,
# so a regenerated plan is byte-identical on any machine: `git diff
# --exit-code examples/plans` after `regen` is the strictest check.
set -euo pipefail
cd "$(dirname "$0")/../.."
soapc=${SOAPC:-build/bin/soapc}
mode=${1:-check}
status=0
while read -r model topo plan; do
  [[ -z "$model" || "$model" == \#* ]] && continue
  case "$mode" in
    regen)
      "$soapc" "$model" --topology "$topo" --search mcmc --budget 4000 \
        --seed 0 -o "$plan" >/dev/null
      echo "regenerated $plan" ;;
    check)
      if "$soapc" check "$plan" --research --tolerance 2%; then :; else
        rc=$?
        echo "plans.sh: $plan is stale (exit $rc)" >&2
        status=$rc
      fi ;;
    *)
      echo "usage: $0 check|regen" >&2
      exit 2 ;;
  esac
done < examples/ci/plans.txt
exit "$status"
