#!/bin/bash
# Copied unchanged from shared/interop/teardown.sh for smcr's interop suite (tests/interop).
# Stop all guests started by boot.sh (by their pidfiles), remove taps/bridge/netns and overlays.
BASE=${KVM_BASE:-$HOME/.cache/smcr-interop}; RUN=$BASE/run; NS=smcnet
for pf in "$RUN"/g*.pid; do
  [ -e "$pf" ] || continue
  pid=$(cat "$pf")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
  fi
  rm -f "$pf"
done
# capture processes started by capture helpers (pidfiles under run/)
for pf in "$RUN"/*.cap.pid; do [ -e "$pf" ] && { kill "$(cat "$pf")" 2>/dev/null; rm -f "$pf"; }; done
if [ "${KEEPNET:-0}" != 1 ] && ip netns list | grep -qw "$NS"; then
  ip netns del "$NS"
fi
rm -f "$RUN"/g*.qcow2 "$RUN"/g*.mon
# stale READY markers would make run-in-guest.sh think a stopped guest is still up
rm -f "$BASE"/share/g*/out/READY
echo "teardown done"
