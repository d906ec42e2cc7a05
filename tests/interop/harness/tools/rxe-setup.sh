#!/bin/bash
# Guest side: create rxe0 on eth0 and wait until its IPv4-mapped RoCEv2 GID is in the table.
# (The RDMA part of shared/interop's smc-setup.sh; the SMC pnet/UEID part is not needed here.)
set -e
modprobe rdma_rxe
rdma link show rxe0 >/dev/null 2>&1 || rdma link add rxe0 type rxe netdev eth0
for _ in $(seq 1 100); do
  grep -qs ffff:0a63 /sys/class/infiniband/rxe0/ports/1/gids/* && break
  sleep 0.1
done
rdma link
uname -r
grep -H . /sys/class/infiniband/rxe0/ports/1/gids/[0-3] /sys/class/infiniband/rxe0/ports/1/gid_attrs/types/[0-3] 2>/dev/null || true
python3 -c 'import pyverbs; print("pyverbs ok")'
