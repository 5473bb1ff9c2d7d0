# Sourced by the device scripts (through device_env.sh, or directly where a run carries no Ray bundle):
# the time boxes of a run that must end before the device call's limit, and the banner each step logs.
# The caller sets DEADLINE (epoch seconds) before it calls left or cap.
left() { echo $(( DEADLINE - $(date +%s) )); }
# The smaller of $1 seconds and what is left, but at least 5: a step that starts late still starts, logs
# and is killed, rather than being skipped without a line.
cap() { local l; l=$(left); [ "$l" -lt "$1" ] && echo $(( l > 5 ? l : 5 )) || echo "$1"; }
step() { printf '\n=== [%s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
