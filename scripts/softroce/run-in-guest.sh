#!/usr/bin/env bash
# Run a command inside a throw-away qemu guest that has REAL rdma-core verbs on SoftRoCE
# (rdma_rxe on a dummy netdev), and exit with the command's exit status.
#
#   scripts/softroce/run-in-guest.sh [OPTIONS] -- COMMAND [ARG]...
#
# See scripts/softroce/README.md for how it works. Run with --help for the options.
set -euo pipefail

usage() {
	cat <<'EOF'
Usage: run-in-guest.sh [OPTIONS] -- COMMAND [ARG]...

Boots Debian's 6.1 kernel under qemu (TCG) with a generated initramfs, sets up SoftRoCE
(rxe0 on dummy0, 192.168.77.1/24, MTU 4200), runs COMMAND as root in the guest with
busybox sh, powers off, and exits with COMMAND's exit status.

Options:
  --timeout SECS       hard limit for the whole guest run, boot included (default 600,
                       env SOFTROCE_TIMEOUT); a boot that prints nothing of the guest's
                       setup within SOFTROCE_BOOT_WATCH seconds (180) is killed and
                       tried again, SOFTROCE_BOOT_TRIES boots in all (2)
  --copy SRC[=DEST]    copy a host file or directory into the guest at DEST (default: the
                       same absolute path as on the host); ELF files get their shared
                       libraries (ldd) copied too. Repeatable.
  --env NAME=VALUE     set an environment variable for COMMAND. Repeatable.
  --workdir DIR        directory COMMAND starts in (default /root)
  --log FILE           write the guest console to FILE (default
                       $SOFTROCE_CACHE_DIR/logs/run-<time>-<pid>.log)
  --quiet              do not stream the guest console to stdout (it still goes to the log)
  --keep               keep the temporary initramfs build directory
  -h, --help           this text

COMMAND runs as: cd DIR && sh -c '"$@"' with your arguments quoted verbatim, so
`-- /path/to/test --flag` runs a binary and `-- sh -c 'a && b'` runs a shell snippet.
Inside the guest: SOFTROCE_DEVICE=rxe0, SOFTROCE_NETDEV=dummy0, SOFTROCE_IP=192.168.77.1,
SOFTROCE_GID_INDEX=<RoCEv2 IPv4 GID index, normally 1>. bash is available as /usr/bin/bash.

Exit status: COMMAND's status; 124 if the time limit hit; 125 if the harness or the guest
setup failed (no exit marker found). The reason is printed to stderr in every case.
EOF
}

# First line of stdin. Reads all of it: `head -n1` can SIGPIPE the writer (fatal with pipefail).
first() { awk 'NR == 1'; }
log() { printf 'softroce: %s\n' "$*" >&2; }
die() {
	printf 'softroce: error: %s\n' "$*" >&2
	exit 125
}

# ----------------------------------------------------------------------------- settings
CACHE_DIR=${SOFTROCE_CACHE_DIR:-/var/cache/rdmapool-guest}
TIMEOUT=${SOFTROCE_TIMEOUT:-600}
QEMU_ACCEL=${SOFTROCE_QEMU_ACCEL:-tcg,thread=multi}
QEMU_CPU=${SOFTROCE_QEMU_CPU:-max}
QEMU_MEM=${SOFTROCE_QEMU_MEM:-2G}
QEMU_SMP=${SOFTROCE_QEMU_SMP:-2}
KERNEL_APPEND=${SOFTROCE_KERNEL_APPEND:-}
GZIP_LEVEL=${SOFTROCE_GZIP_LEVEL:-1}
NO_INSTALL=${SOFTROCE_NO_INSTALL:-0}
GUEST_IP=192.168.77.1
GUEST_PREFIX=24
GUEST_MTU=4200

# Host packages: qemu, the guest userland (busybox, rdma-core, tools) and build tools.
HOST_PACKAGES=(qemu-system-x86 busybox-static rdma-core ibverbs-providers ibverbs-utils
	rdmacm-utils perftest iproute2 cpio kmod gzip coreutils util-linux libc-bin bash)

# Kernel modules to load in this order (dependencies are resolved and loaded first).
# crc32_generic is needed by rdma_rxe (via the crypto API) but modinfo does not list it.
GUEST_MODULES=(dummy crc32_generic rdma_rxe ib_uverbs rdma_ucm)
read -r -a extra_modules <<<"${SOFTROCE_EXTRA_MODULES:-}"
GUEST_MODULES+=("${extra_modules[@]}")

# Binaries put into the guest (with their libraries).
GUEST_BINARIES=(
	/usr/bin/ip /usr/bin/rdma /usr/bin/bash
	/usr/bin/ibv_devinfo /usr/bin/ibv_devices /usr/bin/ibv_rc_pingpong /usr/bin/ibv_ud_pingpong
	/usr/bin/ibv_srq_pingpong /usr/bin/ibv_uc_pingpong /usr/bin/ibv_xsrq_pingpong
	/usr/bin/ibv_asyncwatch
	/usr/bin/rping /usr/bin/ucmatose /usr/bin/udaddy /usr/bin/rdma_server /usr/bin/rdma_client
	/usr/bin/rdma_xserver /usr/bin/rdma_xclient /usr/bin/rstream /usr/bin/riostream
	/usr/bin/cmtime /usr/bin/mckey /usr/bin/rcopy /usr/bin/udpong
)

# ----------------------------------------------------------------------------- arguments
COPIES=()
ENVS=()
WORKDIR=/root
LOG_FILE=
QUIET=0
KEEP=0
while (($#)); do
	case $1 in
	--timeout)
		(($# >= 2)) || die "--timeout needs a value"
		TIMEOUT=$2
		shift 2
		;;
	--timeout=*)
		TIMEOUT=${1#*=}
		shift
		;;
	--copy)
		(($# >= 2)) || die "--copy needs a value"
		COPIES+=("$2")
		shift 2
		;;
	--copy=*)
		COPIES+=("${1#*=}")
		shift
		;;
	--env)
		(($# >= 2)) || die "--env needs a value"
		ENVS+=("$2")
		shift 2
		;;
	--env=*)
		ENVS+=("${1#*=}")
		shift
		;;
	--workdir)
		(($# >= 2)) || die "--workdir needs a value"
		WORKDIR=$2
		shift 2
		;;
	--log)
		(($# >= 2)) || die "--log needs a value"
		LOG_FILE=$2
		shift 2
		;;
	--quiet)
		QUIET=1
		shift
		;;
	--keep)
		KEEP=1
		shift
		;;
	-h | --help)
		usage
		exit 0
		;;
	--)
		shift
		break
		;;
	*)
		usage >&2
		die "unknown option or missing '--' before the command: $1"
		;;
	esac
done
(($# > 0)) || {
	usage >&2
	die "no COMMAND given (put it after --)"
}
if ! [[ $TIMEOUT =~ ^[0-9]+$ ]] || ((TIMEOUT == 0)); then
	die "--timeout must be a positive integer: $TIMEOUT"
fi
for e in "${ENVS[@]}"; do
	[[ $e =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die "--env wants NAME=VALUE: $e"
done

START_TS=$(date +%s)
elapsed() { echo $(($(date +%s) - START_TS)); }

# ----------------------------------------------------------------------------- host setup
APT_UPDATED=0
apt_update_once() {
	((APT_UPDATED)) && return 0
	log "apt-get update"
	apt-get -o DPkg::Lock::Timeout=300 update -q >&2 || die "apt-get update failed"
	APT_UPDATED=1
}

ensure_host_packages() {
	local missing=() p
	for p in "${HOST_PACKAGES[@]}"; do
		if [[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true) != "install ok installed" ]]; then
			missing+=("$p")
		fi
	done
	((${#missing[@]})) || return 0
	[[ $NO_INSTALL == 1 ]] && die "missing host packages (SOFTROCE_NO_INSTALL=1): ${missing[*]}"
	((EUID == 0)) || die "missing host packages and not root: ${missing[*]}"
	apt_update_once
	log "installing: ${missing[*]}"
	DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -q \
		--no-install-recommends "${missing[@]}" >&2 || die "apt-get install failed"
}

# Sets KPKG and KVERSION: the versioned kernel package behind linux-image-amd64 (or
# SOFTROCE_KERNEL_PKG) and its candidate version; empty when the apt lists do not know them.
resolve_kernel_package() {
	KPKG=${SOFTROCE_KERNEL_PKG:-}
	if [[ -z $KPKG ]]; then
		KPKG=$(apt-cache depends linux-image-amd64 2>/dev/null |
			sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*-amd64\)$/\1/p' | first)
	fi
	KVERSION=
	if [[ -n $KPKG ]]; then
		KVERSION=$(apt-cache show --no-all-versions "$KPKG" 2>/dev/null | sed -n 's/^Version: //p' | first)
	fi
}

# fetch_kernel DIR: apt-get download $KPKG=$KVERSION (not installed on the host), extract it
# with dpkg-deb -x into DIR, and generate modules.dep there.
fetch_kernel() {
	local dir=$1 dl deb kv
	log "fetching $KPKG $KVERSION (apt-get download + dpkg-deb -x; not installed on the host)"
	dl=$(mktemp -d "$CACHE_DIR/dl.XXXXXX")
	if ! (cd "$dl" && apt-get -q -o APT::Sandbox::User=root download "$KPKG=$KVERSION" >&2); then
		rm -rf "$dl"
		return 1
	fi
	deb=$(find "$dl" -maxdepth 1 -name '*.deb' | first)
	[[ -n $deb ]] || die "apt-get download produced no .deb"
	# (errexit is off in here when called from a condition: check each step.)
	rm -rf "$dir.tmp"
	mkdir -p "$dir.tmp" || die "cannot create $dir.tmp"
	dpkg-deb -x "$deb" "$dir.tmp" || die "dpkg-deb -x $deb failed"
	rm -rf "$dl"
	# The package ships no modules.dep (its postinst runs depmod): make one.
	kv=$(find "$dir.tmp/lib/modules" -mindepth 1 -maxdepth 1 -printf '%f\n' | first)
	[[ -n $kv ]] || die "no lib/modules in $KPKG"
	depmod -b "$dir.tmp" "$kv" || die "depmod failed"
	touch "$dir.tmp/.complete" || die "cannot write in $dir.tmp"
	rm -rf "$dir"
	mv "$dir.tmp" "$dir" || die "cannot move $dir.tmp to $dir"
	# Drop other extracted kernels (~400 MB each).
	find "$CACHE_DIR/kernel" -mindepth 1 -maxdepth 1 -type d ! -path "$dir" -exec rm -rf {} +
}

# Sets KDIR (the extracted kernel package), KVER and VMLINUZ.
ensure_kernel() {
	resolve_kernel_package
	if [[ -z $KVERSION ]]; then
		apt_update_once
		resolve_kernel_package
	fi
	if [[ -n $KVERSION ]]; then
		KDIR=$CACHE_DIR/kernel/${KPKG}_$KVERSION
		if [[ ! -e $KDIR/.complete ]] && ! fetch_kernel "$KDIR"; then
			# Stale apt lists name a version the archive no longer has: update and retry.
			((APT_UPDATED)) && die "apt-get download $KPKG=$KVERSION failed"
			apt_update_once
			resolve_kernel_package
			[[ -n $KVERSION ]] || die "kernel package ${KPKG:-behind linux-image-amd64} not found after apt-get update"
			KDIR=$CACHE_DIR/kernel/${KPKG}_$KVERSION
			[[ -e $KDIR/.complete ]] || fetch_kernel "$KDIR" || die "apt-get download $KPKG=$KVERSION failed"
		fi
	else
		# Apt knows no such package (e.g. no network): use a cached kernel if there is one.
		KDIR=$(find "$CACHE_DIR/kernel" -mindepth 2 -maxdepth 2 -name .complete -path "*/${KPKG:-linux-image-}*" \
			-printf '%h\n' 2>/dev/null | sort -V | tail -n1)
		[[ -n $KDIR ]] || die "cannot resolve the kernel package ${KPKG:-behind linux-image-amd64}"
		log "warning: apt does not know ${KPKG:-linux-image-amd64}; using cached $KDIR"
	fi
	KVER=$(find "$KDIR/lib/modules" -mindepth 1 -maxdepth 1 -printf '%f\n' | first)
	VMLINUZ=$KDIR/boot/vmlinuz-$KVER
	[[ -f $VMLINUZ ]] || die "no kernel image at $VMLINUZ"
}

mkdir -p "$CACHE_DIR/kernel" "$CACHE_DIR/logs" || die "cannot create cache dir $CACHE_DIR"
find "$CACHE_DIR/logs" -type f -name '*.log' -mtime +7 -delete 2>/dev/null || true
exec {setup_lock}>"$CACHE_DIR/.setup.lock"
flock "$setup_lock"
ensure_host_packages
ensure_kernel
flock -u "$setup_lock"
exec {setup_lock}>&-
log "kernel $KVER from $KDIR ($(elapsed) s)"

# ----------------------------------------------------------------------------- initramfs
WORK=$(mktemp -d "${TMPDIR:-/tmp}/softroce.XXXXXX")
# shellcheck disable=SC2317 # invoked by the EXIT trap
cleanup() {
	if ((KEEP)); then
		log "kept build directory $WORK"
	else
		rm -rf "$WORK"
	fi
}
trap cleanup EXIT
ROOT=$WORK/root
mkdir -p "$ROOT"

# Mirror the host's merged-/usr symlinks so paths reported by ldd work unchanged.
for d in bin sbin lib lib32 lib64 libx32; do
	if [[ -L /$d ]]; then
		ln -s "$(readlink "/$d")" "$ROOT/$d"
		mkdir -p "$ROOT/$(readlink -f "/$d")"
	fi
done
mkdir -p "$ROOT"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,tmp,run,root,mnt,var/tmp}
chmod 1777 "$ROOT/tmp" "$ROOT/var/tmp"

declare -A ADDED=()
# add_file SRC [DEST]: copy SRC (dereferenced) to DEST inside the guest root.
add_file() {
	local src=$1 dest=${2:-$1}
	[[ -n ${ADDED[$dest]:-} ]] && return 0
	ADDED[$dest]=1
	mkdir -p "$ROOT$(dirname "$dest")"
	rm -f "$ROOT$dest"
	cp -L --preserve=mode "$src" "$ROOT$dest"
}
is_elf() { [[ $(head -c4 "$1" 2>/dev/null | od -An -c | tr -d ' ') == '177ELF' ]]; }
# add_libs FILE: copy FILE's shared libraries (and the dynamic loader) to the same paths.
add_libs() {
	local out lib
	out=$(ldd "$1" 2>/dev/null) || return 0 # static or not a dynamic ELF
	while read -r lib; do
		[[ -n $lib ]] && add_file "$lib"
	done < <(awk '/=> \// {print $3} /^[ \t]*\// {print $1}' <<<"$out")
	if grep -q 'not found' <<<"$out"; then
		log "warning: unresolved libraries for $1:"
		grep 'not found' <<<"$out" >&2
	fi
}
add_bin() {
	add_file "$1" "${2:-$1}"
	if is_elf "$1"; then add_libs "$1"; fi
}

# rdma-core: libraries, only the rxe provider and its config; libgcc_s (dlopened by glibc).
for f in "${GUEST_BINARIES[@]}"; do add_bin "$f"; done
while read -r f; do
	[[ -f $f ]] && add_bin "$f"
done < <(dpkg -L perftest | grep '^/usr/bin/.')
MULTIARCH=$(dirname "$(ldd /usr/bin/ibv_devinfo | awk '/libibverbs.so.1/ {print $3}')")
for l in libibverbs.so.1 librdmacm.so.1; do add_bin "$MULTIARCH/$l"; done
RXE_PROVIDER=$(find "$MULTIARCH/libibverbs" -name 'librxe-rdmav*.so' | first)
[[ -n $RXE_PROVIDER ]] || die "rxe provider (librxe-rdmav*.so) not found; is ibverbs-providers installed?"
add_bin "$RXE_PROVIDER"
add_file /etc/libibverbs.d/rxe.driver
LIBGCC=$(ldconfig -p | awk '/libgcc_s.so.1 \(libc6,x86-64\)/ && !p {p = $NF} END {print p}')
[[ -n $LIBGCC ]] || die "libgcc_s.so.1 not found"
add_bin "$LIBGCC"

# User files.
for c in "${COPIES[@]}"; do
	src=${c%%=*}
	dest=$src
	[[ $c == *=* ]] && dest=${c#*=}
	[[ -e $src ]] || die "--copy: no such file: $src"
	[[ $dest == /* ]] || dest=$(realpath -m "$dest")
	if [[ -d $src ]]; then
		mkdir -p "$ROOT$dest"
		cp -a "$src/." "$ROOT$dest/"
		while IFS= read -r -d '' f; do
			if is_elf "$f"; then add_libs "$f"; fi
		done < <(find "$src" -type f -print0)
	else
		add_bin "$src" "$dest"
	fi
done

# busybox: applet links only where no real binary was put.
BUSYBOX=$(command -v busybox) || die "busybox not found"
if ! is_elf "$BUSYBOX" || ldd "$BUSYBOX" >/dev/null 2>&1; then
	die "$BUSYBOX is not a static binary (install busybox-static)"
fi
rm -f "$ROOT/bin/busybox"
cp -L "$BUSYBOX" "$ROOT/bin/busybox"
while read -r applet; do
	[[ -z $applet || $applet == bin/busybox ]] && continue
	if [[ ! -e $ROOT/$applet && ! -L $ROOT/$applet ]]; then
		mkdir -p "$ROOT/$(dirname "$applet")"
		ln -s /bin/busybox "$ROOT/$applet"
	fi
done < <("$BUSYBOX" --list-full)

# Kernel modules in load order, dependencies first.
MODDIR=lib/modules/$KVER
: >"$WORK/modules.list"
for m in "${GUEST_MODULES[@]}"; do
	deps=$(modprobe -C /dev/null -d "$KDIR" -S "$KVER" --show-depends "$m") ||
		die "module $m not found in $KDIR"
	while read -r kind path _; do
		[[ $kind == insmod ]] || continue
		rel=${path#"$KDIR"/}
		grep -qxF "/$rel" "$WORK/modules.list" && continue
		mkdir -p "$ROOT/$(dirname "$rel")"
		cp "$path" "$ROOT/$rel"
		echo "/$rel" >>"$WORK/modules.list"
	done <<<"$deps"
done
cp "$KDIR/$MODDIR/modules.order" "$KDIR/$MODDIR/modules.builtin" "$ROOT/$MODDIR/" 2>/dev/null || true
depmod -b "$ROOT" "$KVER" 2>/dev/null || true
mkdir -p "$ROOT/etc/softroce"
cp "$WORK/modules.list" "$ROOT/etc/softroce/modules"

# /etc bits.
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$ROOT/etc/passwd"
printf 'root:x:0:\n' >"$ROOT/etc/group"
printf '127.0.0.1 localhost\n%s softroce-guest\n' "$GUEST_IP" >"$ROOT/etc/hosts"
printf 'passwd: files\ngroup: files\nhosts: files\n' >"$ROOT/etc/nsswitch.conf"
printf '%s\n' "$MULTIARCH" "/usr/lib/x86_64-linux-gnu" "/lib/x86_64-linux-gnu" "/usr/local/lib" >"$ROOT/etc/ld.so.conf"
ldconfig -r "$ROOT" 2>/dev/null || log "warning: ldconfig -r failed (libraries still load from default paths)"

# The command, quoted verbatim, and its environment.
sq() { printf "'%s'" "${1//\'/\'\\\'\'}"; }
{
	sep=
	for a in "$@"; do
		printf '%s' "$sep"
		sq "$a"
		sep=' '
	done
	printf '\n'
} >"$ROOT/etc/softroce/cmd"
{
	printf 'SOFTROCE_IP=%s\nSOFTROCE_PREFIX=%s\nSOFTROCE_MTU=%s\n' "$GUEST_IP" "$GUEST_PREFIX" "$GUEST_MTU"
	printf 'SOFTROCE_WORKDIR=%s\n' "$(sq "$WORKDIR")"
} >"$ROOT/etc/softroce/config"
: >"$ROOT/etc/softroce/env"
for e in "${ENVS[@]}"; do
	printf 'export %s=%s\n' "${e%%=*}" "$(sq "${e#*=}")" >>"$ROOT/etc/softroce/env"
done

cat >"$ROOT/init" <<'INIT'
#!/bin/sh
# Generated by scripts/softroce/run-in-guest.sh: set up SoftRoCE, run the command, power off.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root TERM=dumb
. /etc/softroce/config

fail() {
	echo "@@GUEST-SETUP-FAILED: $*"
	echo "@@GUEST-EXIT 125"
	sync
	poweroff -f
	echo o >/proc/sysrq-trigger
	sleep 60
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null || true
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /run
hostname softroce-guest

while read -r ko; do
	[ -n "$ko" ] || continue
	insmod "$ko" || fail "insmod $ko"
done </etc/softroce/modules

# Debian's static busybox sh runs its own applet for a bare `ip`: call iproute2 by path.
IP=/usr/bin/ip
$IP link set lo up || fail "lo up"
[ -e /sys/class/net/dummy0 ] || $IP link add dummy0 type dummy || fail "ip link add dummy0"
$IP link set dummy0 mtu "$SOFTROCE_MTU" || fail "mtu"
$IP addr add "$SOFTROCE_IP/$SOFTROCE_PREFIX" dev dummy0 || fail "ip addr add"
$IP link set dummy0 up || fail "dummy0 up"
/usr/bin/rdma link add rxe0 type rxe netdev dummy0 || fail "rdma link add rxe0"

# Wait for the IPv4-mapped RoCEv2 GID (::ffff:a.b.c.d) to show up and note its index.
want=$(echo "$SOFTROCE_IP" | awk -F. '{printf "0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x", $1, $2, $3, $4}')
gid_index=
i=0
while [ $i -lt 100 ]; do
	for g in /sys/class/infiniband/rxe0/ports/1/gids/*; do
		[ -r "$g" ] || continue
		if [ "$(cat "$g" 2>/dev/null)" = "$want" ]; then
			gid_index=${g##*/}
			break 2
		fi
	done
	i=$((i + 1))
	sleep 0.1
done
[ -n "$gid_index" ] || fail "no RoCEv2 GID for $SOFTROCE_IP on rxe0"
[ -c /dev/infiniband/uverbs0 ] || fail "/dev/infiniband/uverbs0 missing"

export SOFTROCE_DEVICE=rxe0 SOFTROCE_NETDEV=dummy0 SOFTROCE_IP SOFTROCE_GID_INDEX=$gid_index
. /etc/softroce/env
echo # SeaBIOS leaves the console mid-line
echo "softroce-guest: rxe0 on dummy0 $SOFTROCE_IP/$SOFTROCE_PREFIX mtu $SOFTROCE_MTU, gid index $gid_index, up $(cut -d' ' -f1 /proc/uptime) s"

mkdir -p "$SOFTROCE_WORKDIR"
cd "$SOFTROCE_WORKDIR" || fail "cd $SOFTROCE_WORKDIR"
sh /etc/softroce/cmd </dev/null
rc=$?
cd /
sync
printf '\n@@GUEST-EXIT %d\n' "$rc"
poweroff -f
echo o >/proc/sysrq-trigger
sleep 60
INIT
chmod 755 "$ROOT/init"

INITRD=$WORK/initrd.gz
(cd "$ROOT" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet -R 0:0) |
	gzip "-$GZIP_LEVEL" >"$INITRD"
log "initramfs $(du -h "$INITRD" | cut -f1) built ($(elapsed) s)"

# ----------------------------------------------------------------------------- qemu
if [[ -z $LOG_FILE ]]; then
	LOG_FILE=$CACHE_DIR/logs/run-$(date +%Y%m%d-%H%M%S)-$$.log
	ln -sfn "$(basename "$LOG_FILE")" "$CACHE_DIR/logs/last.log"
fi
mkdir -p "$(dirname "$LOG_FILE")"
: >"$LOG_FILE"

# One guest at a time on this machine (2 cores); waiting does not count against --timeout.
exec {run_lock}>"$CACHE_DIR/.qemu.lock"
if ! flock -n "$run_lock"; then
	log "another guest is running; waiting for it"
	flock "$run_lock"
fi

QEMU=(qemu-system-x86_64 -accel "$QEMU_ACCEL" -cpu "$QEMU_CPU" -m "$QEMU_MEM" -smp "$QEMU_SMP"
	-nic none -nographic -no-reboot
	-kernel "$VMLINUZ" -initrd "$INITRD"
	-append "console=ttyS0 quiet panic=-1${KERNEL_APPEND:+ $KERNEL_APPEND}")
# Drop CRs and terminal control sequences (SeaBIOS clears the screen), unbuffered.
clean_console() { sed -u -e 's/\r//g' -e 's/\x1b\[[0-9;?]*[A-Za-z]//g' -e 's/\x1b[c()][0-9A-B]\{0,1\}//g'; }
# A boot watchdog: qemu under TCG has been seen (rarely) to hang right after SeaBIOS with
# no console output at all, until the whole --timeout ran out; an immediate second boot
# went through in seconds. So a guest that has not printed its setup line within
# BOOT_WATCH seconds is killed and booted once more (BOOT_TRIES boots in all).
BOOT_WATCH=${SOFTROCE_BOOT_WATCH:-180}
BOOT_TRIES=${SOFTROCE_BOOT_TRIES:-2}
PID_FILE=$(mktemp)
# Runs the guest once; its status is qemu's (124 or 137 at the time limit), or 200 when
# the watchdog killed a boot that hung.
boot_once() {
	: >"$LOG_FILE"
	: >"$PID_FILE"
	(
		if ((QUIET)); then
			timeout --kill-after=10 "$TIMEOUT" "${QEMU[@]}" -pidfile "$PID_FILE" </dev/null 2>&1 |
				clean_console >"$LOG_FILE"
		else
			timeout --kill-after=10 "$TIMEOUT" "${QEMU[@]}" -pidfile "$PID_FILE" </dev/null 2>&1 |
				clean_console | tee "$LOG_FILE"
		fi
		exit "${PIPESTATUS[0]}"
	) 2>/dev/null & # (bash's own "Killed" report of a boot the watchdog ended)
	local runner=$! waited=0
	while kill -0 "$runner" 2>/dev/null; do
		if grep -q '^softroce-guest: ' "$LOG_FILE" 2>/dev/null || grep -q '^@@GUEST' "$LOG_FILE" 2>/dev/null; then
			break
		fi
		if ((waited >= BOOT_WATCH)); then
			log "the guest printed nothing of its setup in ${BOOT_WATCH}s: killing this boot"
			[[ -s $PID_FILE ]] && kill -9 "$(cat "$PID_FILE")" 2>/dev/null
			wait "$runner" 2>/dev/null
			return 200
		fi
		sleep 1
		waited=$((waited + 1))
	done
	wait "$runner"
}
log "booting guest (timeout ${TIMEOUT}s, boot watchdog ${BOOT_WATCH}s, log $LOG_FILE)"
QEMU_START=$(date +%s)
set +e
for ((try = 1; ; try++)); do
	boot_once
	qrc=$?
	((qrc == 200 && try < BOOT_TRIES)) || break
	cp "$LOG_FILE" "$LOG_FILE.hung-$try"
	log "booting again (try $((try + 1)) of $BOOT_TRIES; the hung boot's console: $LOG_FILE.hung-$try)"
done
rm -f "$PID_FILE"
if ((qrc == 200)); then
	flock -u "$run_lock"
	log "TIMEOUT: the guest hung at boot $BOOT_TRIES times (console log: $LOG_FILE)"
	exit 124
fi
if ((!QUIET)); then
	# The console's last line ("reboot: Power down") has no newline.
	[[ -s $LOG_FILE && -n $(tail -c1 "$LOG_FILE") ]] && echo
fi
set -e
flock -u "$run_lock"
QEMU_SECS=$(($(date +%s) - QEMU_START))

if ((qrc == 124 || qrc == 137)); then
	log "TIMEOUT: the guest did not finish within ${TIMEOUT}s (console log: $LOG_FILE)"
	exit 124
fi
if setup_err=$(grep -m1 '^@@GUEST-SETUP-FAILED' "$LOG_FILE"); then
	log "guest setup failed: ${setup_err#@@GUEST-SETUP-FAILED: } (console log: $LOG_FILE)"
	exit 125
fi
marker=$(grep -E '^@@GUEST-EXIT [0-9]+$' "$LOG_FILE" | tail -n1 || true)
if [[ -z $marker ]]; then
	log "no '@@GUEST-EXIT' marker in the console output (qemu exit $qrc; console log: $LOG_FILE)"
	exit 125
fi
rc=${marker#@@GUEST-EXIT }
log "guest command exited $rc (guest ${QEMU_SECS} s, total $(elapsed) s; log $LOG_FILE)"
exit "$rc"
