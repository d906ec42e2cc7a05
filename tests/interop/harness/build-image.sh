#!/bin/bash
# Copied unchanged from shared/interop/build-image.sh for smcr's interop suite (tests/interop).
# Build a small Debian 12 (bookworm) guest image with rdma_rxe + smc kernel modules.
# Output in $KVM_BASE (default ~/.cache/smcr-interop): rootfs/, img/base.ext4 (raw ext4),
#   img/vmlinuz-<kver>, img/initrd.img-<kver> (+ short links vmlinuz-6.1 / -6.12 etc.)
# Usage: ./build-image.sh            (full build)
#        ./build-image.sh --reimage  (only re-run guest config + mkfs from existing rootfs)
set -euo pipefail
BASE=${KVM_BASE:-$HOME/.cache/smcr-interop}
ROOT=$BASE/rootfs
IMG=$BASE/img
MIRROR=${MIRROR:-http://deb.debian.org/debian}
IMGSIZE=${IMGSIZE:-1600M}
mkdir -p "$IMG"

PKGS="linux-image-amd64 initramfs-tools kmod udev systemd-sysv dbus
iproute2 iputils-ping procps ethtool netbase
rdma-core ibverbs-providers ibverbs-utils rdmacm-utils infiniband-diags perftest
python3 python3-pyverbs tcpdump less"

cleanup_mounts() {
  for m in dev/pts dev proc sys; do
    mountpoint -q "$ROOT/$m" && umount -l "$ROOT/$m" || true
  done
}
trap cleanup_mounts EXIT

t0=$(date +%s)
if [ "${1:-}" != "--reimage" ]; then
  if [ ! -x "$ROOT/bin/bash" ]; then
    rm -rf "$ROOT"
    debootstrap --variant=minbase bookworm "$ROOT" "$MIRROR"
  fi
  t1=$(date +%s); echo "debootstrap: $((t1-t0))s"
  # do not start services inside the chroot
  printf '#!/bin/sh\nexit 101\n' > "$ROOT/usr/sbin/policy-rc.d"; chmod +x "$ROOT/usr/sbin/policy-rc.d"
  cat > "$ROOT/etc/apt/sources.list" <<EOF
deb $MIRROR bookworm main
deb $MIRROR bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
deb $MIRROR bookworm-backports main
EOF
  mount -t proc proc "$ROOT/proc"; mount -t sysfs sys "$ROOT/sys"
  mount --bind /dev "$ROOT/dev"; mount --bind /dev/pts "$ROOT/dev/pts"
  chroot "$ROOT" apt-get update
  DEBIAN_FRONTEND=noninteractive chroot "$ROOT" apt-get install -y --no-install-recommends $PKGS
  # second kernel: bookworm-backports 6.12 (6.1's rdma_rxe lacks "Set queue pair cur_qp_state when
  # being queried", so SMC-R link setup fails with -ENOLINK on 6.1; 6.12 has the fix)
  if [ "${BPO_KERNEL:-1}" = 1 ]; then
    DEBIAN_FRONTEND=noninteractive chroot "$ROOT" apt-get install -y --no-install-recommends -t bookworm-backports linux-image-amd64
  fi
  chroot "$ROOT" apt-get clean
  cleanup_mounts
  rm -f "$ROOT/usr/sbin/policy-rc.d"
  t2=$(date +%s); echo "package install: $((t2-t1))s"
fi

# ---------------- guest configuration ----------------
echo smcguest > "$ROOT/etc/hostname"
echo "127.0.0.1 localhost smcguest" > "$ROOT/etc/hosts"
echo "/dev/vda / ext4 rw,relatime 0 1" > "$ROOT/etc/fstab"
chroot "$ROOT" sh -c 'echo root:root | chpasswd'
# autologin root on the serial console (debug convenience)
mkdir -p "$ROOT/etc/systemd/system/serial-getty@ttyS0.service.d"
cat > "$ROOT/etc/systemd/system/serial-getty@ttyS0.service.d/autologin.conf" <<'EOF'
[Service]
ExecStart=
ExecStart=-/sbin/agetty --autologin root --keep-baud 115200,57600,38400,9600 %I $TERM
EOF
# modules loaded at boot
printf 'rdma_rxe\nsmc\nsmc_diag\n9p\n9pnet_virtio\n' > "$ROOT/etc/modules-load.d/smc.conf"
# trim boot: mask things not needed
for u in systemd-timesyncd.service apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer man-db.timer; do
  ln -sf /dev/null "$ROOT/etc/systemd/system/$u"
done

# guest agent: mounts 9p share "hostshare" at /mnt/host, configures net from
# kernel cmdline (guestip=, guestname=), then runs every /mnt/host/cmd/*.sh once,
# writing <name>.out (stdout+stderr) and <name>.rc into /mnt/host/out/.
cat > "$ROOT/usr/local/sbin/guest-agent" <<'EOF'
#!/bin/bash
mkdir -p /mnt/host
for i in $(seq 1 50); do
  mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,cache=none hostshare /mnt/host && break
  sleep 0.2
done
ip=$(sed -n 's/.*guestip=\([^ ]*\).*/\1/p' /proc/cmdline)
name=$(sed -n 's/.*guestname=\([^ ]*\).*/\1/p' /proc/cmdline)
[ -n "$name" ] && hostname "$name"
ip link set lo up
if [ -n "$ip" ]; then
  ip addr add "$ip" dev eth0
  ip link set eth0 up
fi
mkdir -p /mnt/host/cmd /mnt/host/out
echo "$(date +%s.%N) up $(cat /proc/uptime)" > /mnt/host/out/READY
while true; do
  for f in /mnt/host/cmd/*.sh; do
    [ -e "$f" ] || continue
    b=$(basename "$f" .sh)
    mv "$f" "/mnt/host/cmd/$b.running" 2>/dev/null || continue
    ( cd /root; bash "/mnt/host/cmd/$b.running" > "/mnt/host/out/$b.out" 2>&1; echo $? > "/mnt/host/out/$b.rc.tmp"; mv "/mnt/host/out/$b.rc.tmp" "/mnt/host/out/$b.rc"; rm -f "/mnt/host/cmd/$b.running" ) &
  done
  sleep 0.2
done
EOF
chmod +x "$ROOT/usr/local/sbin/guest-agent"
cat > "$ROOT/etc/systemd/system/guest-agent.service" <<'EOF'
[Unit]
Description=host command agent over 9p
After=systemd-modules-load.service
[Service]
ExecStart=/usr/local/sbin/guest-agent
Restart=always
[Install]
WantedBy=multi-user.target
EOF
ln -sf /etc/systemd/system/guest-agent.service "$ROOT/etc/systemd/system/multi-user.target.wants/guest-agent.service"

# slim down: docs, man pages, locales, unneeded module trees (keeps image < 2 GB with two kernels)
rm -rf "$ROOT"/usr/share/doc/* "$ROOT"/usr/share/man/* "$ROOT"/usr/share/locale/* "$ROOT"/var/cache/apt/*.bin
for kv in $(ls "$ROOT/lib/modules"); do
  for d in drivers/gpu drivers/media drivers/net/wireless drivers/staging drivers/iio drivers/bluetooth sound \
           drivers/net/ethernet/mellanox drivers/net/ethernet/intel drivers/net/ethernet/broadcom drivers/hid \
           drivers/input/touchscreen drivers/usb/gadget drivers/net/can drivers/isdn drivers/comedi; do
    rm -rf "$ROOT/lib/modules/$kv/kernel/$d"
  done
  chroot "$ROOT" depmod -a "$kv"
done
# kernels + initrds for -kernel/-initrd boot: img/vmlinuz-<kver>, img/initrd.img-<kver>, short links -6.1 / -6.12
rm -f "$IMG"/vmlinuz* "$IMG"/initrd.img*
for kv in $(ls "$ROOT/lib/modules"); do
  cp "$ROOT/boot/vmlinuz-$kv" "$IMG/vmlinuz-$kv"
  cp "$ROOT/boot/initrd.img-$kv" "$IMG/initrd.img-$kv"
  short=$(echo "$kv" | cut -d. -f1,2)
  ln -sf "vmlinuz-$kv" "$IMG/vmlinuz-$short"; ln -sf "initrd.img-$kv" "$IMG/initrd.img-$short"
done
ls "$ROOT/lib/modules"
find "$ROOT/lib/modules" -name 'rdma_rxe.ko*' -o -name 'smc.ko*' -o -name 'smc_diag.ko*'

# ext4 image without loop mounts
rm -f "$IMG/base.ext4"
t3=$(date +%s)
mkfs.ext4 -q -F -L smcroot -d "$ROOT" "$IMG/base.ext4" "$IMGSIZE"
t4=$(date +%s); echo "mkfs.ext4 -d: $((t4-t3))s; total $((t4-t0))s"
du -sh "$ROOT"; ls -lsh "$IMG"
