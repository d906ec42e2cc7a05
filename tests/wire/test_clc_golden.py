"""Golden vectors for the CLC codecs: spec §9a/§9b and the Linux 6.12 capture.

Every message is decoded to the field values the spec digest (and the capture's
``.decoded.txt``) lists, and re-encoded byte for byte.
"""

from __future__ import annotations

import ipaddress

import pytest
from scapy.layers.inet import TCP
from scapy.utils import rdpcap

from smcr.wire.clc import (
    ClcAccept,
    ClcConfirm,
    ClcDecline,
    ClcProposal,
    ClcReader,
    ClcType,
    FirstContactExt,
    IbMtu,
    Ipv6Prefix,
    SmcType,
    V2Extension,
    decode_clc,
    make_eid,
    make_hostname,
)
from smcr.wire.decline import DeclineCode
from tests.support import LINUX_PCAP

PCAP = LINUX_PCAP

EID = make_eid("SMC-KVM-TEST")
SERVER_PEER_ID = bytes.fromhex("0842525400990012")
CLIENT_PEER_ID = bytes.fromhex("c3eb525400990011")
SERVER_GID = bytes(10) + b"\xff\xff" + bytes([10, 99, 0, 12])  # ::ffff:10.99.0.12
CLIENT_GID = bytes(10) + b"\xff\xff" + bytes([10, 99, 0, 11])  # ::ffff:10.99.0.11
SERVER_MAC = bytes.fromhex("525400990012")
CLIENT_MAC = bytes.fromhex("525400990011")
SERVER_VADDR = 0xFF45874B42770000
CLIENT_VADDR = 0xFF378CBA83530000

# spec §9b, frame 8: the first connection's Accept (160 bytes)
ACCEPT_9B = bytes.fromhex(
    """
    e2 d4 c3 d9 02 00 a0 28 08 42 52 54 00 99 00 12
    00 00 00 00 00 00 00 00 00 00 ff ff 0a 63 00 0c
    52 54 00 99 00 12 00 00 11 00 00 03 a4 01 00 00
    00 01 23 00 ff 45 87 4b 42 77 00 00 00 3c 74 bc
    53 4d 43 2d 4b 56 4d 2d 54 45 53 54 20 20 20 20
    20 20 20 20 20 20 20 20 20 20 20 20 20 20 20 20
    00 00 00 00 00 00 00 00 80 21 00 00 67 32 20 20
    20 20 20 20 20 20 20 20 20 20 20 20 20 20 20 20
    20 20 20 20 20 20 20 20 20 20 20 20 ff 02 00 01
    00 00 00 00 00 00 00 00 00 00 00 00 e2 d4 c3 d9
    """
)

LINUX_FCE = FirstContactExt(
    v2_direct=True,
    os_type=2,
    release=1,
    hostname=make_hostname("g2"),
    max_conns=255,
    max_links=2,
    feature_mask=0x0001,
    vendor_options=0,
)

EXPECTED_PROPOSAL = ClcProposal(
    version=2,
    typev1=SmcType.N,
    typev2=SmcType.R,
    v2_extension=V2Extension(
        release=1,
        seid=False,
        roce_gid=CLIENT_GID,
        max_conns=255,
        max_links=2,
        feature_mask=0x0001,
        user_eids=(EID,),
    ),
)


def accept(token: int, first_contact: bool) -> ClcAccept:
    return ClcAccept(
        version=2,
        first_contact=first_contact,
        peer_id=SERVER_PEER_ID,
        gid=SERVER_GID,
        mac=SERVER_MAC,
        qpn=0x11,
        rmb_rkey=0x3A4,
        rmbe_idx=1,
        rmbe_alert_token=token,
        rmbe_size=2,
        qp_mtu=IbMtu.MTU_1024,
        rmb_vaddr=SERVER_VADDR,
        psn=3962044,
        eid=EID,
        fce=LINUX_FCE if first_contact else None,
    )


def confirm(token: int, first_contact: bool) -> ClcConfirm:
    fce = FirstContactExt(hostname=make_hostname("g1"))
    return ClcConfirm(
        version=2,
        first_contact=first_contact,
        peer_id=CLIENT_PEER_ID,
        gid=CLIENT_GID,
        mac=CLIENT_MAC,
        qpn=0x11,
        rmb_rkey=0x3AF,
        rmbe_idx=1,
        rmbe_alert_token=token,
        rmbe_size=2,
        qp_mtu=IbMtu.MTU_1024,
        rmb_vaddr=CLIENT_VADDR,
        psn=0x2A4B50,
        eid=EID,
        fce=fce if first_contact else None,
        gid_list=(CLIENT_GID,) if first_contact else (),
    )


# -- spec §9b ---------------------------------------------------------------


def test_spec_9b_accept_fields() -> None:
    msg = ClcAccept.decode(ACCEPT_9B)
    assert msg == accept(token=1, first_contact=True)
    assert msg.length == 160
    assert msg.rmbe_size_bytes == 64 * 1024
    assert IbMtu(msg.qp_mtu).size == 1024
    assert msg.psn == 3962044
    assert msg.fce is not None and msg.fce.hostname.rstrip() == b"g2"


def test_spec_9b_accept_reencodes() -> None:
    assert ClcAccept.decode(ACCEPT_9B).encode() == ACCEPT_9B
    assert accept(token=1, first_contact=True).encode() == ACCEPT_9B
    assert decode_clc(ACCEPT_9B) == accept(token=1, first_contact=True)


# -- spec §9a leading bytes ---------------------------------------------------

IPV4 = ipaddress.IPv4Address("10.99.0.0")


@pytest.mark.parametrize(
    ("msg", "lead", "length"),
    [
        (
            ClcProposal.rfc_v1(CLIENT_PEER_ID, CLIENT_GID, CLIENT_MAC, outgoing_subnet=IPV4),
            "e2d4c3d9 01 0034 10",
            52,
        ),
        (
            ClcProposal.smcr_v1(CLIENT_PEER_ID, CLIENT_GID, CLIENT_MAC, outgoing_subnet=IPV4),
            "e2d4c3d9 01 005c 28",
            92,
        ),
        (
            ClcProposal.smcr_v2(CLIENT_GID, (EID,)),
            "e2d4c3d9 01 009c 22",
            156,
        ),
        (
            ClcAccept(
                version=1, first_contact=True, peer_id=SERVER_PEER_ID, gid=SERVER_GID,
                mac=SERVER_MAC, qpn=1, rmb_rkey=2, rmbe_alert_token=3, rmbe_size=2,
                qp_mtu=3, rmb_vaddr=4, psn=5,
            ),
            "e2d4c3d9 02 0044 18",
            68,
        ),
        (
            ClcConfirm(
                version=1, first_contact=False, peer_id=CLIENT_PEER_ID, gid=CLIENT_GID,
                mac=CLIENT_MAC, qpn=1, rmb_rkey=2, rmbe_alert_token=3, rmbe_size=2,
                qp_mtu=3, rmb_vaddr=4, psn=5,
            ),
            "e2d4c3d9 03 0044 10",
            68,
        ),
        (accept(token=1, first_contact=True), "e2d4c3d9 02 00a0 28", 160),
        (
            ClcDecline.linux(DeclineCode.SYNCERR, CLIENT_PEER_ID, version=1),
            "e2d4c3d9 04 001c 18" + CLIENT_PEER_ID.hex() + "04000000",
            28,
        ),
    ],
)  # fmt: skip
def test_spec_9a_leading_bytes(
    msg: ClcProposal | ClcAccept | ClcConfirm | ClcDecline, lead: str, length: int
) -> None:
    wire = msg.encode()
    assert wire.startswith(bytes.fromhex(lead))
    assert len(wire) == length == msg.length
    assert decode_clc(wire) == msg


def test_spec_9a_proposal_offsets() -> None:
    rfc = ClcProposal.rfc_v1(CLIENT_PEER_ID, CLIENT_GID, CLIENT_MAC, outgoing_subnet=IPV4)
    assert rfc.encode()[38:40] == b"\x00\x00"
    linux_v1 = ClcProposal.smcr_v1(CLIENT_PEER_ID, CLIENT_GID, CLIENT_MAC, outgoing_subnet=IPV4)
    assert linux_v1.encode()[38:40] == b"\x00\x28"
    v2 = ClcProposal.smcr_v2(CLIENT_GID, (EID,)).encode()
    assert v2[8:40] == bytes(32)
    assert v2[50:52] == b"\x00\x1c"


@pytest.mark.parametrize("k", range(9))
def test_spec_2_3_5_sizes(k: int) -> None:
    eids = tuple(make_eid(f"EID{i}") for i in range(k))
    assert len(ClcProposal.smcr_v2(CLIENT_GID, eids).encode()) == 124 + 32 * k
    v6 = tuple(Ipv6Prefix(ipaddress.IPv6Address(f"2001:db8:{i}::"), 64) for i in range(min(k, 8)))
    rfc = ClcProposal.rfc_v1(CLIENT_PEER_ID, CLIENT_GID, CLIENT_MAC, ipv6_prefixes=v6)
    assert len(rfc.encode()) == 52 + 17 * len(v6)
    linux = ClcProposal.smcr_v1(CLIENT_PEER_ID, CLIENT_GID, CLIENT_MAC, ipv6_prefixes=v6)
    assert len(linux.encode()) == 92 + 17 * len(v6)


# -- the Linux 6.12 capture -----------------------------------------------------


def _capture_clc() -> dict[int, bytes]:
    """Frame number -> TCP payload of every CLC message in the capture."""
    out: dict[int, bytes] = {}
    for number, pkt in enumerate(rdpcap(str(PCAP)), 1):
        if TCP in pkt:
            payload = bytes(pkt[TCP].payload)
            if payload.startswith(b"\xe2\xd4\xc3\xd9"):
                out[number] = payload
    return out


@pytest.fixture(scope="module")
def capture() -> dict[int, bytes]:
    return _capture_clc()


EXPECTED = {
    6: (156, EXPECTED_PROPOSAL),
    8: (160, accept(token=1, first_contact=True)),
    10: (180, confirm(token=1, first_contact=True)),
    378: (156, EXPECTED_PROPOSAL),
    384: (108, accept(token=2, first_contact=False)),
    390: (108, confirm(token=2, first_contact=False)),
}


def test_capture_has_the_six_clc_messages(capture: dict[int, bytes]) -> None:
    assert sorted(capture) == sorted(EXPECTED)


@pytest.mark.parametrize("frame", sorted(EXPECTED))
def test_capture_message(capture: dict[int, bytes], frame: int) -> None:
    wire = capture[frame]
    length, expected = EXPECTED[frame]
    assert len(wire) == length
    msg = decode_clc(wire)
    assert msg == expected
    assert msg.encode() == wire
    assert type(msg).decode(wire) == expected


def test_capture_proposal_is_what_smcr_v2_builds(capture: dict[int, bytes]) -> None:
    assert ClcProposal.smcr_v2(CLIENT_GID, (EID,)).encode() == capture[6] == capture[378]


def test_capture_confirm_gid_list(capture: dict[int, bytes]) -> None:
    msg = ClcConfirm.decode(capture[10])
    assert msg.gid_list == (CLIENT_GID,)
    assert capture[10][156:160] == b"\x01\x00\x00\x00"
    assert msg.fce is not None and msg.fce.hostname.rstrip() == b"g1"


def test_capture_stream_through_reader(capture: dict[int, bytes]) -> None:
    """Each direction's CLC bytes, fed in odd pieces, come out as the same messages."""
    client_to_server = capture[6] + capture[10]
    reader = ClcReader()
    got = []
    for i in range(0, len(client_to_server), 7):
        reader.feed(client_to_server[i : i + 7])
        while (msg := reader.next_message()) is not None:
            got.append(msg)
    assert got == [EXPECTED[6][1], EXPECTED[10][1]]
    assert reader.trailing_data == b""
    server = ClcReader()
    server.feed(capture[8] + b"app data")
    assert server.next_message(expect=ClcType.ACCEPT) == EXPECTED[8][1]
    assert server.trailing_data == b"app data"
