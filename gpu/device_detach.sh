#!/usr/bin/env bash
# A harness call longer than one 10-minute device command, in two commands: `start` launches gpu/device.sh in a
# session of its own (setsid: the device tool ends a command's other processes when it returns, but not those) and
# waits up to WAIT_S seconds; `collect` waits for it up to WAIT_S again and copies the evidence into $OUT. The machine
# is given back 30 s after a call returns: make the `collect` call at once, or everything is lost.
#   bash gpu/device_detach.sh start SCENARIOS [gpu/device.sh options]       (WAIT_S=560 by default)
#   bash gpu/device_detach.sh collect
set -u
verb=${1:?usage: gpu/device_detach.sh start SCENARIOS [options] | collect}; shift
home=${DETACH_HOME:-/tmp/detached}; wait_s=${WAIT_S:-560}
case $verb in
  start)
    rm -rf "$home"; mkdir -p "$home/out"
    OUT=$home/out DETACH_HOME=$home setsid nohup bash -c 'bash gpu/device.sh "$@"; echo $? > "$DETACH_HOME/rc"' device.sh "$@" \
      > "$home/log" 2>&1 < /dev/null &
    echo $! > "$home/pid" ;;
  collect) [[ -f $home/pid ]] || { echo "gpu/device_detach.sh: nothing was started on this machine"; exit 6; } ;;
  *) echo "gpu/device_detach.sh: start or collect, not $verb"; exit 2 ;;
esac
pid=$(cat "$home/pid"); waited=0
while kill -0 "$pid" 2>/dev/null && ((waited < wait_s)); do sleep 5; waited=$((waited + 5)); done
tail -40 "$home/log"
if kill -0 "$pid" 2>/dev/null; then
  echo "gpu/device_detach.sh: still running after ${waited} s; call collect now"
  cp "$home/log" "${OUT:-/tmp}/detached.log" 2>/dev/null
  exit 0
fi
cp "$home/out/harness.tar.gz" "${OUT:?}/" && echo "gpu/device_detach.sh: done (device.sh exit $(cat "$home/rc" 2>/dev/null))"
exit "$(cat "$home/rc" 2>/dev/null || echo 1)"
