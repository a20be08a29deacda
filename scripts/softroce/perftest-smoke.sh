#!/usr/bin/env bash
# Smoke test of real rdma-core verbs on SoftRoCE: boots one guest with run-in-guest.sh and
# runs `ibv_devinfo -v`, then perftest pairs (server in the background, client to the
# dummy0 address) on rxe0: ib_write_bw 64 KiB, ib_write_lat 8 B, ib_read_lat 8 B.
# Prints their results and a summary; exits non-zero if anything failed.
#
#   scripts/softroce/perftest-smoke.sh [--timeout SECS] [--bw-iters N]
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TIMEOUT=${SOFTROCE_TIMEOUT:-600}
BW_ITERS=2000
while (($#)); do
	case $1 in
	--timeout)
		TIMEOUT=$2
		shift 2
		;;
	--bw-iters)
		BW_ITERS=$2
		shift 2
		;;
	-h | --help)
		sed -n '2,7p' "$0"
		exit 0
		;;
	*)
		echo "perftest-smoke: unknown argument: $1" >&2
		exit 2
		;;
	esac
done

# Runs in the guest under busybox sh. SOFTROCE_* come from the harness's /init.
# shellcheck disable=SC2016 # expanded in the guest, not here
GUEST_SCRIPT='
set -u
DEV=$SOFTROCE_DEVICE
GID=$SOFTROCE_GID_INDEX
IP=$SOFTROCE_IP
failed=0

step() { echo; echo "===== $*"; }

# wait_listen PORT PID: until a TCP socket listens on PORT (or PID died / 60 s passed).
wait_listen() {
	hex=$(printf ":%04X " "$1")
	n=0
	while [ $n -lt 300 ]; do
		if cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk "\$4 == \"0A\"" | grep -q "$hex"; then
			return 0
		fi
		kill -0 "$2" 2>/dev/null || return 1
		sleep 0.2
		n=$((n + 1))
	done
	return 1
}

# pair NAME PORT ARGS...: NAME server in the background, NAME client to $IP.
pair() {
	name=$1 port=$2
	shift 2
	step "$name $* (server + client on $DEV, gid index $GID, port $port)"
	echo "command: $name -d $DEV -x $GID -F -p $port $* [$IP]"
	timeout 180 "$name" -d "$DEV" -x "$GID" -F -p "$port" "$@" >"/tmp/$name.server" 2>&1 &
	spid=$!
	if ! wait_listen "$port" "$spid"; then
		echo "FAIL: $name server did not start listening"
		cat "/tmp/$name.server"
		kill "$spid" 2>/dev/null
		failed=$((failed + 1))
		return
	fi
	t0=$(cut -d" " -f1 /proc/uptime)
	timeout 180 "$name" -d "$DEV" -x "$GID" -F -p "$port" "$@" "$IP" >"/tmp/$name.client" 2>&1
	crc=$?
	wait "$spid"
	src=$?
	t1=$(cut -d" " -f1 /proc/uptime)
	cat "/tmp/$name.client"
	if [ $crc -ne 0 ] || [ $src -ne 0 ]; then
		echo "--- server output:"
		cat "/tmp/$name.server"
		echo "FAIL: $name client exit $crc, server exit $src"
		failed=$((failed + 1))
		return
	fi
	# The results row: first line of the client output that starts with two numbers.
	row=$(grep -E "^ *[0-9]+ +[0-9]+ " "/tmp/$name.client" | head -n1 | tr -s " \t" "  ")
	if [ -z "$row" ]; then
		echo "FAIL: $name printed no results row"
		failed=$((failed + 1))
		return
	fi
	echo "@@RESULT $name$row (pair took $(awk "BEGIN {print $t1 - $t0}") s)"
}

step "ibv_devinfo -v"
if ! ibv_devinfo -v -d "$DEV"; then echo "FAIL: ibv_devinfo"; failed=$((failed + 1)); fi
step "rdma link / GID table"
/usr/bin/rdma link show
for g in /sys/class/infiniband/$DEV/ports/1/gids/[0-3]; do
	i=${g##*/}
	echo "gid $i $(cat "$g") $(cat /sys/class/infiniband/$DEV/ports/1/gid_attrs/types/$i 2>/dev/null)"
done

pair ib_write_bw 18515 -s 65536 -n "$BW_ITERS"
pair ib_write_lat 18516 -s 8
pair ib_read_lat 18517 -s 8

step "done: $failed failure(s)"
[ $failed -eq 0 ]
'

LOG_DIR=${SOFTROCE_CACHE_DIR:-/var/cache/rdmapool-guest}/logs
mkdir -p "$LOG_DIR"
LOG=$LOG_DIR/perftest-smoke-$(date +%Y%m%d-%H%M%S)-$$.log
start=$(date +%s)
set +e
"$HERE/run-in-guest.sh" --timeout "$TIMEOUT" --log "$LOG" --env "BW_ITERS=$BW_ITERS" \
	-- sh -c "$GUEST_SCRIPT"
rc=$?
set -e
secs=$(($(date +%s) - start))

echo
echo "perftest-smoke summary (${secs} s wall clock, guest exit $rc, log $LOG):"
if grep -q '^@@RESULT ' "$LOG"; then
	grep '^@@RESULT ' "$LOG" | while read -r _ name bytes iters rest; do
		case $name in
		*_bw)
			# bytes iterations BW-peak BW-average[MB/s] MsgRate[Mpps]
			read -r peak avg rate _ <<<"$rest"
			printf '  %-13s %6s B x %-5s  BW average %s MB/s (peak %s MB/s, %s Mpps)\n' \
				"$name" "$bytes" "$iters" "$avg" "$peak" "$rate"
			;;
		*_lat)
			# bytes iterations t_min t_max t_typical t_avg t_stdev p99 p99.9
			read -r tmin tmax ttyp tavg _ p99 _ <<<"$rest"
			printf '  %-13s %6s B x %-5s  typical %s us (min %s, avg %s, max %s, p99 %s us)\n' \
				"$name" "$bytes" "$iters" "$ttyp" "$tmin" "$tavg" "$tmax" "$p99"
			;;
		esac
	done
else
	echo "  no results"
fi
if ((rc == 0)); then
	echo "perftest-smoke: PASS"
else
	echo "perftest-smoke: FAIL (exit $rc)" >&2
fi
exit "$rc"
