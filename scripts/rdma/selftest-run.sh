#!/bin/bash
# Guest-side self-test of scripts/rdma (runs as /mnt/host/run.sh):
#   d=$(mktemp -d) && cp scripts/rdma/selftest-run.sh "$d/run.sh" && scripts/rdma/run-in-guest.sh "$d"
# (a) one RoCE v2 GID per IPv4 address and active_mtu 4096, (b) ib_send_bw RC
# between the GIDs of 10.0.2.16 (server) and 10.0.2.17 (client), (c)
# ibv_ud_pingpong UD with 4096-byte messages between two other GIDs.
set -u
fail=0
echo "== env: GYRE_VERBS_DEVICE=$GYRE_VERBS_DEVICE GYRE_VERBS_NETDEV=$GYRE_VERBS_NETDEV GYRE_RXE_GIDS=$GYRE_RXE_GIDS ulimit -l=$(ulimit -l) cwd=$(pwd)"
echo "== mounts"; grep -E ' (/tmp|/dev/shm|/mnt/host) ' /proc/mounts
echo "== ip addr"; ip -4 addr show dev "$GYRE_VERBS_NETDEV"; ip link show dev "$GYRE_VERBS_NETDEV" | head -1
echo "== (a) GID table from sysfs"
P=/sys/class/infiniband/rxe0/ports/1
declare -A IDX
# (only the non-zero entries of the 1024: a cat per entry takes ~30 s under TCG)
for f in $(grep -Lx 0000:0000:0000:0000:0000:0000:0000:0000 $P/gids/* | sed 's|.*/||' | sort -n); do
  g=$(cat $P/gids/$f)
  t=$(cat $P/gid_attrs/types/$f 2>/dev/null); nd=$(cat $P/gid_attrs/ndevs/$f 2>/dev/null)
  ip=""
  case $g in 0000:0000:0000:0000:0000:ffff:*)
    h=${g#0000:0000:0000:0000:0000:ffff:}; h=${h/:/}
    ip=$(printf '%d.%d.%d.%d' 0x${h:0:2} 0x${h:2:2} 0x${h:4:2} 0x${h:6:2});;
  esac
  echo "GID[$f] $g type='$t' ndev=$nd ${ip:+ipv4=$ip}"
  if [ -n "$ip" ] && [ "$t" = "RoCE v2" ]; then
    [ -n "${IDX[$ip]:-}" ] && { echo "DUPLICATE RoCE v2 GID for $ip"; fail=1; }
    IDX[$ip]=$f
  fi
done
for a in 10.0.2.15 10.0.2.16 10.0.2.17 10.0.2.18; do
  if [ -n "${IDX[$a]:-}" ]; then echo "RESULT gid: $a -> index ${IDX[$a]} (RoCE v2)"; else echo "RESULT gid: $a MISSING"; fail=1; fi
done
mtu=$(ibv_devinfo -d rxe0 | sed -n 's/^[[:space:]]*active_mtu:[[:space:]]*\([0-9]*\).*/\1/p')
echo "RESULT active_mtu: $mtu"
[ "$mtu" = 4096 ] || fail=1

echo "== (b) ib_send_bw RC: server on GID ${IDX[10.0.2.16]} (10.0.2.16), client on GID ${IDX[10.0.2.17]} (10.0.2.17)"
timeout 120 ib_send_bw -d rxe0 -x ${IDX[10.0.2.16]} -F --report_gbits -s 65536 -n 1000 -p 18515 > /tmp/bw-server.txt 2>&1 &
sp=$!
sleep 2
timeout 120 ib_send_bw -d rxe0 -x ${IDX[10.0.2.17]} -F --report_gbits -s 65536 -n 1000 -p 18515 10.0.2.16 > /tmp/bw-client.txt 2>&1
crc=$?; wait $sp; src=$?
echo "-- server (rc=$src)"; cat /tmp/bw-server.txt
echo "-- client (rc=$crc)"; cat /tmp/bw-client.txt
echo "RESULT ib_send_bw: server rc=$src client rc=$crc"
[ $src -eq 0 ] && [ $crc -eq 0 ] || fail=1

echo "== (c) ibv_ud_pingpong UD"
ud() { # size server_idx client_idx port
  timeout 60 ibv_ud_pingpong -d rxe0 -g $2 -s $1 -n 500 -p $4 > /tmp/ud-server.txt 2>&1 &
  local sp=$!; sleep 1
  timeout 60 ibv_ud_pingpong -d rxe0 -g $3 -s $1 -n 500 -p $4 10.0.2.15 > /tmp/ud-client.txt 2>&1
  local crc=$?; wait $sp; local src=$?
  echo "-- size $1 server(GID $2) rc=$src:"; cat /tmp/ud-server.txt
  echo "-- size $1 client(GID $3) rc=$crc:"; cat /tmp/ud-client.txt
  echo "RESULT ibv_ud_pingpong -s $1 server GID $2 client GID $3: server rc=$src client rc=$crc"
  [ $src -eq 0 ] && [ $crc -eq 0 ]
}
port=18600
if ! ud 4096 ${IDX[10.0.2.15]} ${IDX[10.0.2.18]} $port; then
  fail=1
  for s in 4095 4088 4056 4000 3072 2048 1024; do
    port=$((port + 1))
    if ud $s ${IDX[10.0.2.15]} ${IDX[10.0.2.18]} $port; then echo "RESULT largest UD size that works (of those tried): $s"; break; fi
  done
fi
echo "RESULT overall fail=$fail"
exit $fail
