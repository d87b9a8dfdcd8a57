#!/usr/bin/env bash
# Checks that a test run leaves no process behind.
#   tools/procs.sh check    after the suites: every process that still carries this
#                           run's KILN_TEST_RUN marker in its environment (a kiln, a
#                           redis-server, a client a test started) is listed and
#                           killed, and the check fails.
# The Makefile's test and sanitize targets export KILN_TEST_RUN=<unique id> to every
# suite; processes that other work on the machine started do not carry it.
set -u
[ "${1:-}" = check ] || { echo "usage: tools/procs.sh check" >&2; exit 2; }
[ -n "${KILN_TEST_RUN:-}" ] || { echo "procs: KILN_TEST_RUN is not set" >&2; exit 2; }

marked() {
    local self=$BASHPID
    for d in /proc/[0-9]*; do
        pid=${d#/proc/}
        [ "$pid" = $$ ] || [ "$pid" = "$self" ] && continue
        [ -r "$d/environ" ] || continue
        if { tr '\0' '\n' <"$d/environ"; } 2>/dev/null | grep -qx "KILN_TEST_RUN=$KILN_TEST_RUN"; then
            # Our own shell and its parents (make, this script's callers) carry the marker too.
            case " $ANCESTORS " in *" $pid "*) continue ;; esac
            echo "$pid"
        fi
    done
}

ANCESTORS=""
p=$$
while [ "$p" -gt 1 ] 2>/dev/null; do
    ANCESTORS="$ANCESTORS $p"
    p=$(awk '{print $4}' "/proc/$p/stat" 2>/dev/null || echo 1)
done

# A process a test stopped may take a moment to exit.
for _ in $(seq 50); do
    left=$(marked)
    [ -z "$left" ] && { echo "procs: no process left behind"; exit 0; }
    sleep 0.1
done
echo "procs: the tests left these processes running:" >&2
for pid in $left; do ps -o pid=,args= -p "$pid" >&2; done
kill -9 $left 2>/dev/null
exit 1
