#!/usr/bin/env bash
# smcr set-up on a fresh Debian machine, then the main job.  A user of smcr only needs
# `pip install .` (README); this is the set-up for the tools, the tests and the interop
# guests.
#
# Installs the system packages smcr and its tests use (tshark to check our
# messages against Wireshark, iproute2 and nftables for the network-namespace
# tests; qemu-system-x86, qemu-utils, debootstrap and tcpdump for the rxe
# interop suite, tests/interop, which builds and boots a Debian guest; git for the
# packaging tests), creates the virtual environment .venv with smcr (editable) and
# its pinned test tools (the docs build's included), compiles the data path (smcr.nativebuild: gcc and Python's headers, which
# python3 on Debian brings with python3-dev), and runs `smcr demo`.  Safe to run
# again: it skips what is there.
# Set SMCR_NO_DEMO=1 to stop after the set-up.
set -euo pipefail
cd "$(dirname "$0")"

need=()
command -v tshark >/dev/null || need+=(tshark)
command -v ip >/dev/null || need+=(iproute2)
command -v nft >/dev/null || need+=(nftables)
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
command -v qemu-img >/dev/null || need+=(qemu-utils)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v tcpdump >/dev/null || need+=(tcpdump)
command -v git >/dev/null || need+=(git)  # tests/packaging: a clean copy of the checkout
python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
# the compiled data path (smcr.nativebuild): a C compiler and Python's headers
command -v gcc >/dev/null || need+=(gcc)
python3 -c 'import os, sysconfig; assert os.path.exists(sysconfig.get_path("include") + "/Python.h")' \
    2>/dev/null || need+=(python3-dev)
if ((${#need[@]})); then
    if [ "$(id -u)" != 0 ]; then
        echo "install.sh: need root to install: ${need[*]}" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    # tshark asks whether non-root users may capture; answer no, quietly.
    echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${need[@]}"
fi

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
# Reinstall only when the project's metadata or build changed since the last install.
# An editable install: the checkout's sources run (a user's `pip install .` compiles
# into the wheel instead; README, "Install").
stamp=.venv/.smcr-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ setup.py -nt "$stamp" ]; then
    .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
    touch "$stamp"
fi

# The compiled hot path of the checkout (docs/development.md, "Compiled data path"): mypyc
# (from the pinned mypy) compiles the data-path modules into src/smcr/_native; only when
# the sources changed since the last build (about 40 s).  Without a C compiler or
# Python's headers it says so and smcr runs as pure Python, as with SMCR_PURE_PYTHON=1.
.venv/bin/python -m smcr.nativebuild --if-stale ||
    echo "install.sh: not compiled (see above); smcr runs as pure Python" >&2

# Discovery: the SMC TCP option in SYN/SYN-ACK, by a BPF program that root attaches
# once per boot for every process of the host (README, "Discovery").
if [ "$(id -u)" = 0 ]; then
    .venv/bin/smcr enable || echo "install.sh: TCP-option discovery is off (see above);" \
        "smcr sockets use a peer list (SMCR_PEERS) or plain TCP" >&2
else
    echo "install.sh: not root: run '.venv/bin/smcr enable' as root for TCP-option discovery" >&2
fi

if [ "${SMCR_NO_DEMO:-0}" != 1 ]; then
    .venv/bin/smcr demo
fi
