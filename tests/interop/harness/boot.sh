#!/bin/bash
# Copied from shared/interop/boot.sh for smcr's interop suite (tests/interop): unchanged but for
# copying only the tools' *.py/*.sh files (a __pycache__ directory there would stop `cp`), and
# FIRST=i (default 1) to boot guests i..N only (a second guest next to a running first one),
# and a second NIC per guest (eth1 on br0, left down: a test may give it an address and rxe1).
# Boot N Debian guests (TCG by default; ACCEL=kvm is experimental, see the README) on bridge br0 inside netns "smcnet".
#   netns side (br0): 10.99.0.1/24 ; guest i: 10.99.0.(10+i)/24 (g1=10.99.0.11, g2=10.99.0.12, ...)
# Usage: ./boot.sh [N=2]     env: MEM=1024 SMP=1 ACCEL=kvm|tcg WAIT=1
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)   # harness dir: tools/ are copied into the guests from here
BASE=${KVM_BASE:-$HOME/.cache/smcr-interop}          # data dir: img/ (build-image.sh), run/, share/
N=${1:-2}
FIRST=${FIRST:-1}
MEM=${MEM:-1024}
SMP=${SMP:-1}
NS=smcnet
IMG=$BASE/img
RUN=$BASE/run
mkdir -p "$RUN"
KVER=${KVER:-6.12}          # 6.12 (bookworm-backports, SMC-R over rxe works) or 6.1 (bookworm; rxe lacks cur_qp_state fix)
KERNEL=$IMG/vmlinuz-$KVER
INITRD=$IMG/initrd.img-$KVER
for f in "$IMG/base.ext4" "$KERNEL" "$INITRD"; do
  [ -e "$f" ] || { echo "missing $f: run build-image.sh first (same KVM_BASE=$BASE)" >&2; exit 1; }
done
# NOTE: this host's /dev/kvm is kvm_pvm (Pagetable-based VM, nested inside Firecracker): a stock kernel
# only runs there via instruction emulation (minutes, then "KVM internal error" at cmpxchg16b), so TCG is the default.
ACCEL=${ACCEL:-tcg}
if [ "$ACCEL" = kvm ] && [ -w /dev/kvm ]; then
  ACC="-enable-kvm -cpu host,-arch-capabilities"
  # PVH entry (uncompressed vmlinux) avoids the real-mode/decompressor path
  [ -n "${PVH_VMLINUX:-}" ] && KERNEL=$PVH_VMLINUX
else
  ACC="-accel tcg,thread=multi -cpu max"; ACCEL=tcg
fi

# --- network namespace + bridge (idempotent) ---
if ! ip netns list | grep -qw "$NS"; then
  ip netns add "$NS"
fi
ip -n "$NS" link set lo up
if ! ip -n "$NS" link show br0 >/dev/null 2>&1; then
  ip -n "$NS" link add br0 type bridge
  ip -n "$NS" link set br0 type bridge stp_state 0 forward_delay 0
  ip -n "$NS" addr add 10.99.0.1/24 dev br0
  ip -n "$NS" link set br0 up
fi

t0=$(date +%s.%N)
for i in $(seq "$FIRST" "$N"); do
  name=g$i
  tap=tap$i
  share=$BASE/share/$name
  mkdir -p "$share/cmd" "$share/out" "$share/tools"
  cp -f "$HERE"/tools/*.py "$HERE"/tools/*.sh "$share/tools/"
  rm -f "$share/out/READY" "$share/cmd"/* 2>/dev/null || true
  for t in "$tap" "${tap}b"; do   # ${tap}b: the guest's eth1, unconfigured unless a test
    if ! ip -n "$NS" link show "$t" >/dev/null 2>&1; then   # gives it a second RNIC
      ip -n "$NS" tuntap add "$t" mode tap
      ip -n "$NS" link set "$t" master br0
      ip -n "$NS" link set "$t" up
    fi
  done
  disk=$RUN/$name.qcow2
  rm -f "$disk"
  qemu-img create -q -f qcow2 -F raw -b "$IMG/base.ext4" "$disk"
  mac=$(printf '52:54:00:99:00:%02x' $((0x10+i)))
  rm -f "$RUN/$name.console" "$RUN/$name.pid"
  ip netns exec "$NS" qemu-system-x86_64 $ACC -m "$MEM" -smp "$SMP" \
    -name "$name" -machine q35 \
    -kernel "$KERNEL" -initrd "$INITRD" \
    -append "console=ttyS0,115200 root=/dev/vda rw net.ifnames=0 loglevel=4 guestip=10.99.0.$((10+i))/24 guestname=$name systemd.hostname=$name" \
    -drive file="$disk",if=virtio,format=qcow2,cache=unsafe \
    -netdev tap,id=n0,ifname="$tap",script=no,downscript=no \
    -device virtio-net-pci,netdev=n0,mac="$mac" \
    -netdev tap,id=n1,ifname="${tap}b",script=no,downscript=no \
    -device virtio-net-pci,netdev=n1,mac="$(printf '52:54:00:99:01:%02x' $((0x10+i)))" \
    -virtfs local,path="$share",mount_tag=hostshare,security_model=none,id=fs0 \
    -device virtio-rng-pci \
    -display none -serial file:"$RUN/$name.console" \
    -monitor unix:"$RUN/$name.mon",server,nowait \
    -pidfile "$RUN/$name.pid" -daemonize
  echo "$name started (pid $(cat "$RUN/$name.pid"), accel=$ACCEL, kernel=$(basename $(readlink -f $KERNEL)), ip 10.99.0.$((10+i)))"
done

if [ "${WAIT:-1}" = 1 ]; then
  for i in $(seq "$FIRST" "$N"); do
    for t in $(seq 1 1200); do
      [ -e "$BASE/share/g$i/out/READY" ] && break
      sleep 0.25
    done
    if [ -e "$BASE/share/g$i/out/READY" ]; then
      echo "g$i ready after $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')s (guest uptime: $(awk '{print $3}' "$BASE/share/g$i/out/READY")s)"
    else
      echo "g$i NOT ready (see $RUN/g$i.console)"; exit 1
    fi
  done
fi
