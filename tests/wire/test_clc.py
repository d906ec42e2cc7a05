"""CLC codecs: round trips, strict validation, the stream reader, the fuzz invariant."""

from __future__ import annotations

import dataclasses
import ipaddress
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from smcr.wire.clc import (
    CLC_MAX_LENGTH,
    CONFIRM_MAX_GIDS,
    EYECATCHER_SMCD,
    EYECATCHER_SMCR,
    ClcAccept,
    ClcConfirm,
    ClcDecline,
    ClcHeader,
    ClcMessage,
    ClcProposal,
    ClcReader,
    ClcType,
    FirstContactExt,
    IbMtu,
    IpPrefixArea,
    Ipv6Prefix,
    SmcdGidChid,
    SmcdV2Extension,
    SmcType,
    V2Extension,
    compress_bufsize,
    decode_clc,
    make_eid,
    make_hostname,
    uncompress_bufsize,
)
from smcr.wire.decline import DeclineCode
from smcr.wire.errors import WireError
from tests.support import FUZZ_EXAMPLES

# -- strategies ----------------------------------------------------------------


def uint(bits: int) -> st.SearchStrategy[int]:
    return st.integers(0, (1 << bits) - 1)


def raw(n: int) -> st.SearchStrategy[bytes]:
    return st.binary(min_size=n, max_size=n)


ipv6_prefixes = st.lists(
    st.builds(Ipv6Prefix, st.builds(ipaddress.IPv6Address, raw(16)), uint(8)), max_size=8
).map(tuple)
prefix_areas = st.builds(
    IpPrefixArea, st.builds(ipaddress.IPv4Address, raw(4)), uint(8), ipv6_prefixes
)
v2_extensions = st.builds(
    V2Extension,
    release=uint(4),
    seid=st.booleans(),
    roce_gid=raw(16),
    max_conns=uint(8),
    max_links=uint(8),
    feature_mask=uint(16),
    user_eids=st.lists(raw(32), max_size=8).map(tuple),
)
smcd_v2_extensions = st.builds(
    SmcdV2Extension,
    system_eid=raw(32),
    gid_chids=st.lists(st.builds(SmcdGidChid, uint(64), uint(16)), max_size=8).map(tuple),
)


@st.composite
def proposals(draw: st.DrawFn) -> ClcProposal:
    version = draw(st.sampled_from([1, 2, 2, 3]))
    area = {
        "ism_gid": draw(uint(64)),
        "ism_chid": draw(uint(16)),
        "vendor_oui": draw(raw(3)),
        "vendor_options": draw(raw(5)),
    }
    common = {"peer_id": draw(raw(8)), "gid": draw(raw(16)), "mac": draw(raw(6))}
    if version == 1:
        typev1 = draw(st.sampled_from([SmcType.R, SmcType.D, SmcType.B]))
        offset = 40 if typev1.smcd else draw(st.sampled_from([0, 40]))
        if offset == 0:
            area = {}
        return ClcProposal(
            version=1, typev1=typev1, typev2=SmcType.N, ip_area_offset=offset,
            prefix=draw(prefix_areas), **common, **area,  # type: ignore[arg-type]
        )  # fmt: skip
    typev1 = draw(st.sampled_from(list(SmcType)))
    typev2 = draw(st.sampled_from(list(SmcType)))
    return ClcProposal(
        version=version,
        typev1=typev1,
        typev2=typev2,
        ip_area_offset=40 if typev1 != SmcType.N else 0,
        prefix=draw(prefix_areas) if typev1 != SmcType.N else None,
        v2_extension=draw(v2_extensions) if typev2 != SmcType.N else None,
        smcd_v2_extension=draw(smcd_v2_extensions) if typev2.smcd else None,
        **common,  # type: ignore[arg-type]
        **area,  # type: ignore[arg-type]
    )


fces = st.builds(
    FirstContactExt,
    v2_direct=st.booleans(),
    os_type=uint(4),
    release=uint(4),
    hostname=raw(32),
    max_conns=uint(8),
    max_links=uint(8),
    feature_mask=uint(16),
    vendor_options=uint(32),
)


@st.composite
def accept_confirms(draw: st.DrawFn, cls: type[ClcAccept] | type[ClcConfirm]) -> ClcMessage:
    version = draw(st.sampled_from([1, 2, 3]))
    first_contact = draw(st.booleans())
    v2 = version >= 2
    gids: tuple[bytes, ...] = ()
    if cls is ClcConfirm and v2 and first_contact:
        gids = tuple(draw(st.lists(raw(16), max_size=CONFIRM_MAX_GIDS)))
    return cls(
        version=version,
        first_contact=first_contact,
        peer_id=draw(raw(8)),
        gid=draw(raw(16)),
        mac=draw(raw(6)),
        qpn=draw(uint(24)),
        rmb_rkey=draw(uint(32)),
        rmbe_idx=draw(uint(8)),
        rmbe_alert_token=draw(uint(32)),
        rmbe_size=draw(uint(4)),
        qp_mtu=draw(uint(4)),
        rmb_vaddr=draw(uint(64)),
        psn=draw(uint(24)),
        eid=draw(raw(32)) if v2 else bytes(32),
        fce=draw(fces) if v2 and first_contact else None,
        gid_list=gids,
    )


@st.composite
def declines(draw: st.DrawFn) -> ClcDecline:
    version = draw(st.sampled_from([1, 2, 3]))
    extra = (0, 0, 0, 0)
    if version >= 2:
        extra = (draw(uint(32)), draw(uint(32)), draw(uint(32)), draw(uint(32)))
    return ClcDecline(
        version=version,
        out_of_sync=draw(st.booleans()),
        peer_id=draw(raw(8)),
        peer_diagnosis=draw(uint(32)),
        os_type=draw(uint(4)),
        peer_diagnosis_v2=extra,
    )


messages: st.SearchStrategy[ClcMessage] = st.one_of(
    proposals(), accept_confirms(ClcAccept), accept_confirms(ClcConfirm), declines()
)

DECODERS = [
    decode_clc,
    ClcProposal.decode,
    ClcAccept.decode,
    ClcConfirm.decode,
    ClcDecline.decode,
    ClcHeader.decode,
]

# -- round trips -----------------------------------------------------------------


@given(messages)
def test_round_trip(msg: ClcMessage) -> None:
    wire = msg.encode()
    assert len(wire) == msg.length
    assert len(wire) <= CLC_MAX_LENGTH[ClcHeader.decode(wire).type]
    decoded = decode_clc(wire)
    assert decoded == msg
    assert type(decoded).decode(wire) == msg
    assert decoded.encode() == wire
    assert decode_clc(memoryview(wire)) == msg
    assert decode_clc(bytearray(wire)) == msg


@given(messages)
def test_round_trip_from_decoded_bytes(msg: ClcMessage) -> None:
    """encode(decode(b)) == b for every b the encoder can produce."""
    wire = msg.encode()
    assert decode_clc(wire).encode() == wire


# -- the fuzz invariant ------------------------------------------------------------


def rebuilt(obj: Any) -> Any:
    """``obj`` made again through its constructors, its parts too: a decoded message must
    pass the checks an encoder's caller meets (decoders build without them)."""
    if isinstance(obj, tuple):
        return tuple(rebuilt(item) for item in obj)
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        return obj
    return type(obj)(**{f.name: rebuilt(getattr(obj, f.name)) for f in dataclasses.fields(obj)})


def _only_wire_errors(data: bytes) -> None:
    """Every decoder refuses ``data`` with WireError or yields a stable message; the
    reader frames the stream exactly (each message is its own bytes, nothing lost)."""
    for decoder in DECODERS:
        try:
            msg = decoder(data)
        except WireError as e:
            assert e.reason  # a refusal says why
            continue
        if isinstance(msg, ClcHeader):
            assert ClcHeader.decode(msg.encode()) == msg
            continue
        assert rebuilt(msg) == msg  # (decoders skip the constructors' checks: they hold)
        wire = msg.encode()
        assert len(wire) == msg.length
        assert decode_clc(wire) == msg
        assert decode_clc(wire).encode() == wire
    reader = ClcReader()
    reader.feed(data)
    offset = 0
    try:
        while (framed := reader.next_message()) is not None:
            assert decode_clc(data[offset : offset + framed.length]) == framed
            offset += framed.length
    except WireError:
        return
    assert offset + reader.buffered == len(data)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    wire = bytearray(draw(messages).encode())
    for _ in range(draw(st.integers(1, 4))):
        choice = draw(st.integers(0, 3))
        if choice == 0 and wire:
            i = draw(st.integers(0, len(wire) - 1))
            wire[i] = draw(uint(8))
        elif choice == 1:
            wire = wire[: draw(st.integers(0, len(wire)))]
        elif choice == 2:
            wire += draw(st.binary(max_size=40))
        else:  # keep the length field honest so the body gets parsed
            if len(wire) >= 7:
                wire[5:7] = len(wire).to_bytes(2, "big")
    return bytes(wire)


@st.composite
def header_then_noise(draw: st.DrawFn) -> bytes:
    body = draw(st.binary(max_size=700))
    eye = draw(st.sampled_from([EYECATCHER_SMCR, EYECATCHER_SMCD]))
    length = 8 + len(body) if draw(st.booleans()) else draw(uint(16))
    head = eye + bytes([draw(st.integers(0, 6))]) + length.to_bytes(2, "big")
    return head + bytes([draw(uint(8))]) + body


fuzz_inputs = st.one_of(st.binary(max_size=800), mutated(), header_then_noise())


@given(fuzz_inputs)
def test_fuzz_only_wire_error(data: bytes) -> None:
    _only_wire_errors(data)


@pytest.mark.slow
@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(fuzz_inputs)
def test_fuzz_only_wire_error_slow(data: bytes) -> None:
    _only_wire_errors(data)


# -- header -------------------------------------------------------------------


def test_header_fields() -> None:
    hdr = ClcHeader.decode(bytes.fromhex("e2d4c3d9 02 00a0 28"))
    assert hdr == ClcHeader(EYECATCHER_SMCR, ClcType.ACCEPT, 160, 2, 2, 0)
    assert hdr.flag
    assert hdr.encode() == bytes.fromhex("e2d4c3d9 02 00a0 28")
    prop = ClcHeader.decode(bytes.fromhex("e2d4c3c4 01 009c 22"))
    assert (prop.eyecatcher, prop.typev2, prop.typev1) == (EYECATCHER_SMCD, SmcType.R, SmcType.N)


@pytest.mark.parametrize(
    ("head", "why"),
    [
        ("e2d4c3d8 02 00a0 28", "eyecatcher"),
        ("e2d4c3d9 05 00a0 28", "type"),
        ("e2d4c3d9 00 00a0 28", "type"),
        ("e2d4c3d9 02 00a0 08", "version"),
        ("e2d4c3d9 02 00a1 28", "length"),
        ("e2d4c3d9 04 001b 10", "length"),
        ("e2d4c3d9 01 028d 20", "length"),
        ("e2d4c3d9 02 00", "8 bytes"),
    ],
)
def test_header_rejects(head: str, why: str) -> None:
    with pytest.raises(WireError, match=why) as info:
        ClcHeader.decode(bytes.fromhex(head))
    assert info.value.code is None


# -- Proposal -------------------------------------------------------------------

EID = make_eid("SMC-KVM-TEST")
GID = bytes(10) + b"\xff\xff" + bytes([10, 99, 0, 11])
PEER = bytes.fromhex("c3eb525400990011")
MAC = bytes.fromhex("525400990011")


def test_proposal_smcr_v1_layout() -> None:
    v6 = (Ipv6Prefix(ipaddress.IPv6Address("2001:db8::"), 64),)
    msg = ClcProposal.smcr_v1(PEER, GID, MAC, ipv6_prefixes=v6)
    wire = msg.encode()
    assert len(wire) == 92 + 17
    assert wire[7] == 0x28
    assert wire[38:40] == b"\x00\x28"
    assert wire[40:80] == bytes(40)  # SMC-D/v2 area, no v2 extension
    assert wire[87] == 1  # IPv6 count
    assert wire[88:105] == ipaddress.IPv6Address("2001:db8::").packed + b"\x40"


def test_proposal_v1_and_v2_combined_offsets() -> None:
    """typev1 R + typev2 R: prefix at 80, v2 extension right behind it."""
    v6 = (Ipv6Prefix(ipaddress.IPv6Address("2001:db8::"), 64),) * 2
    msg = ClcProposal(
        version=2, typev1=SmcType.R, typev2=SmcType.R, peer_id=PEER, gid=GID, mac=MAC,
        ip_area_offset=40, prefix=IpPrefixArea(ipv6_prefixes=v6),
        v2_extension=V2Extension(roce_gid=GID, user_eids=(EID,)),
    )  # fmt: skip
    wire = msg.encode()
    assert wire[7] == 0x20
    assert len(wire) == 92 + 2 * 17 + 40 + 32
    x = 80 + 8 + 34
    assert int.from_bytes(wire[50:52], "big") == x - 52
    assert wire[x] == 1 and wire[x + 8 : x + 24] == GID


def test_proposal_smcd_v2_offsets() -> None:
    msg = ClcProposal(
        version=2, typev1=SmcType.N, typev2=SmcType.B,
        v2_extension=V2Extension(user_eids=(EID, EID)),
        smcd_v2_extension=SmcdV2Extension(gid_chids=(SmcdGidChid(7, 9),)),
    )  # fmt: skip
    wire = msg.encode()
    x = 80
    assert int.from_bytes(wire[x + 6 : x + 8], "big") == 32 + 64
    assert wire[x + 1] == 1  # ISM GID count
    smcd = x + 8 + 32 + 64
    assert wire[smcd + 48 : smcd + 58] == (7).to_bytes(8, "big") + (9).to_bytes(2, "big")
    assert len(wire) == 80 + 40 + 64 + 48 + 10 + 4


def _proposal_v2() -> bytearray:
    return bytearray(ClcProposal.smcr_v2(GID, (EID,)).encode())


@pytest.mark.parametrize(
    ("mutate", "why"),
    [
        (lambda b: b.__setitem__(slice(38, 40), b"\x00\x28"), "IP-area offset"),
        (lambda b: b.__setitem__(slice(38, 40), b"\x00\x29"), "max 40"),
        (lambda b: b.__setitem__(slice(50, 52), b"\x00\x1d"), "v2-extension offset"),
        (lambda b: b.__setitem__(80, 2), "truncated"),
        (lambda b: b.__setitem__(80, 9), "EID count"),
        (lambda b: b.__setitem__(slice(-4, None), b"SMCR"), "trailer"),
        (lambda b: b.__setitem__(7, 0x2A), "v2-extension offset"),  # typev2 N, offset 28
        (lambda b: b.__setitem__(7, 0x12), "no SMC type"),  # v1 header, typev1 N
    ],
)
def test_proposal_rejects(mutate: object, why: str) -> None:
    wire = _proposal_v2()
    mutate(wire)  # type: ignore[operator]
    with pytest.raises(WireError, match=why) as info:
        ClcProposal.decode(bytes(wire))
    assert info.value.code is None


def test_proposal_v1_rules() -> None:
    rfc = bytearray(ClcProposal.rfc_v1(PEER, GID, MAC).encode())
    rfc[47] = 9  # IPv6 count 9
    with pytest.raises(WireError, match="max 8"):
        ClcProposal.decode(bytes(rfc))
    rfc[47] = 1  # one IPv6 prefix announced, none present
    with pytest.raises(WireError, match=r"truncated|length"):
        ClcProposal.decode(bytes(rfc))
    rfc = bytearray(ClcProposal.rfc_v1(PEER, GID, MAC).encode())
    rfc[7] = 0x11  # SMC-D v1 needs offset 40
    with pytest.raises(WireError, match="SMC-D"):
        ClcProposal.decode(bytes(rfc))
    rfc[7] = 0x1C  # typev2 bits in a v1 header: ignored, re-encoded as 0
    assert ClcProposal.decode(bytes(rfc)).typev2 == SmcType.N


def test_proposal_reserved_ignored() -> None:
    wire = _proposal_v2()
    wire[60:80] = b"\xff" * 20  # SMC-D area reserved
    wire[82] = 0xFF  # v2 ext reserved
    wire[83] |= 0x0E  # middle bits of the release/SEID byte
    wire[84:86] = b"\xff\xff"
    wire[108:120] = b"\xff" * 12
    wire[81] = 5  # ISM GID count: unused without SMC-D
    wire[86:88] = b"\x00\x50"  # SMC-Dv2 offset: unused without SMC-D
    msg = ClcProposal.decode(bytes(wire))
    assert msg == ClcProposal.smcr_v2(GID, (EID,))
    assert msg.encode() == ClcProposal.smcr_v2(GID, (EID,)).encode()


def test_proposal_accepts_smcd_eyecatcher() -> None:
    wire = _proposal_v2()
    wire[0:4] = EYECATCHER_SMCD
    wire[-4:] = EYECATCHER_SMCD
    assert ClcProposal.decode(bytes(wire)) == ClcProposal.smcr_v2(GID, (EID,))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"version": 1, "typev1": SmcType.N, "typev2": SmcType.N},
        {"version": 1, "typev1": SmcType.R, "typev2": SmcType.R, "prefix": IpPrefixArea()},
        {"version": 2, "typev1": SmcType.R, "typev2": SmcType.N, "prefix": IpPrefixArea()},
        {"version": 2, "typev1": SmcType.N, "typev2": SmcType.R},
        {"version": 2, "typev1": SmcType.N, "typev2": SmcType.N, "prefix": IpPrefixArea()},
        {"version": 1, "typev1": SmcType.R, "typev2": SmcType.N, "prefix": IpPrefixArea(),
         "ism_gid": 1},
        {"version": 0, "typev1": SmcType.N, "typev2": SmcType.N},
        {"version": 2, "typev1": SmcType.N, "typev2": SmcType.N, "peer_id": b"x"},
    ],
)  # fmt: skip
def test_proposal_constructor_checks(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        ClcProposal(**kwargs)  # type: ignore[arg-type]


# -- Accept / Confirm --------------------------------------------------------------


def _accept(**kw: object) -> ClcAccept:
    args: dict[str, object] = {
        "version": 2, "first_contact": False, "peer_id": PEER, "gid": GID, "mac": MAC,
        "qpn": 0xABCDEF, "rmb_rkey": 0x12345678, "rmbe_alert_token": 7, "rmbe_size": 15,
        "qp_mtu": 5, "rmb_vaddr": 2**64 - 1, "psn": 0xFEDCBA, "eid": EID,
    }  # fmt: skip
    args.update(kw)
    return ClcAccept(**args)  # type: ignore[arg-type]


def test_accept_24_bit_fields() -> None:
    wire = _accept().encode()
    assert wire[38:41] == b"\xab\xcd\xef"
    assert wire[61:64] == b"\xfe\xdc\xba"
    assert wire[50] == 0xF5
    assert len(wire) == 108


def test_accept_reserved_ignored() -> None:
    wire = bytearray(_accept(first_contact=True, fce=FirstContactExt()).encode())
    wire[7] |= 0x04
    for i in (51, 60, *range(96, 104), 106, 107, *range(148, 156)):
        wire[i] = 0xFF
    wire[104] |= 0x7F
    msg = ClcAccept.decode(bytes(wire))
    assert msg == _accept(first_contact=True, fce=FirstContactExt())


@pytest.mark.parametrize(
    ("length", "fc"), [(68, False), (107, False), (109, False), (108, True), (164, True)]
)
def test_accept_exact_lengths(length: int, fc: bool) -> None:
    wire = bytearray(_accept().encode())
    wire[4] = 2
    wire[7] = 0x28 if fc else 0x20
    wire = (wire[:104] + bytes(200))[: length - 4] + EYECATCHER_SMCR
    wire[5:7] = length.to_bytes(2, "big")
    with pytest.raises(WireError, match="length") as info:
        ClcAccept.decode(bytes(wire))
    assert info.value.code is None


def test_accept_v1_length_and_trailer() -> None:
    v1 = _accept(version=1, eid=bytes(32))
    wire = v1.encode()
    assert len(wire) == 68 and wire[7] == 0x10
    assert ClcAccept.decode(wire) == v1
    with pytest.raises(WireError, match="trailer"):
        ClcAccept.decode(wire[:-1] + b"\x00")


def test_accept_typev1_rules() -> None:
    wire = bytearray(_accept().encode())
    wire[7] = 0x21  # SMC-D
    with pytest.raises(WireError) as info:
        ClcAccept.decode(bytes(wire))
    assert info.value.code == DeclineCode.MODEUNSUPP
    for typev1 in (2, 3):
        wire[7] = 0x20 | typev1
        with pytest.raises(WireError) as info:
            ClcAccept.decode(bytes(wire))
        assert info.value.code is None


def test_accept_is_not_confirm() -> None:
    with pytest.raises(WireError, match="expected CONFIRM"):
        ClcConfirm.decode(_accept().encode())


def test_confirm_gid_list() -> None:
    gids = (GID, bytes(range(16)))
    msg = ClcConfirm(
        version=2, first_contact=True, peer_id=PEER, gid=GID, mac=MAC, qpn=1, rmb_rkey=2,
        rmbe_alert_token=3, rmbe_size=2, qp_mtu=3, rmb_vaddr=4, psn=5, eid=EID,
        fce=FirstContactExt(), gid_list=gids,
    )  # fmt: skip
    wire = msg.encode()
    assert len(wire) == 160 + 4 + 32
    assert wire[156:160] == b"\x02\x00\x00\x00"
    assert ClcConfirm.decode(wire) == msg
    bad = bytearray(wire)
    bad[156] = 3
    with pytest.raises(WireError, match="length"):
        ClcConfirm.decode(bytes(bad))
    bad[156] = CONFIRM_MAX_GIDS + 1
    with pytest.raises(WireError, match="GID count"):
        ClcConfirm.decode(bytes(bad))


def test_accept_constructor_checks() -> None:
    with pytest.raises(ValueError):
        _accept(first_contact=True)  # v2 FC needs fce
    with pytest.raises(ValueError):
        _accept(gid_list=(GID,))  # Accept has no GID list
    with pytest.raises(ValueError):
        _accept(qpn=1 << 24)
    with pytest.raises(ValueError):
        _accept(version=1)  # v1 has no EID


# -- Decline -----------------------------------------------------------------------


def test_decline_linux_forms() -> None:
    v2 = ClcDecline.linux(DeclineCode.NOSMCRDEV, PEER)
    wire = v2.encode()
    assert len(wire) == 44
    assert wire[:8] == bytes.fromhex("e2d4c3d9 04 002c 20")
    assert wire[16:21] == bytes.fromhex("03030002 20")
    assert v2.code == DeclineCode.NOSMCRDEV
    sync = ClcDecline.linux(DeclineCode.SYNCERR, PEER, version=1)
    assert sync.out_of_sync and sync.os_type == 0


def test_decline_any_trailer_and_unknown_code() -> None:
    wire = bytearray(ClcDecline(version=1, peer_diagnosis=0x99990000).encode())
    wire[-4:] = b"junk"
    msg = ClcDecline.decode(bytes(wire))
    assert msg.peer_diagnosis == 0x99990000
    assert msg.code is None
    assert msg.encode()[-4:] == EYECATCHER_SMCR


def test_decline_reserved_ignored() -> None:
    wire = bytearray(ClcDecline.linux(DeclineCode.SYNCERR, PEER).encode())
    wire[7] |= 0x07  # unused bit + typev1
    wire[20] |= 0x0F
    wire[21:24] = b"\xff\xff\xff"
    assert ClcDecline.decode(bytes(wire)) == ClcDecline.linux(DeclineCode.SYNCERR, PEER)


@pytest.mark.parametrize(("version", "length"), [(1, 44), (2, 28), (3, 28)])
def test_decline_exact_lengths(version: int, length: int) -> None:
    wire = bytearray(bytes(length))
    wire[0:8] = EYECATCHER_SMCR + b"\x04" + length.to_bytes(2, "big") + bytes([version << 4])
    with pytest.raises(WireError, match="length"):
        ClcDecline.decode(bytes(wire))


# -- reader --------------------------------------------------------------------------


def test_reader_byte_by_byte_and_trailing_data() -> None:
    a = ClcProposal.smcr_v2(GID, (EID,))
    b = ClcDecline.linux(DeclineCode.PEERNOSMC, PEER)
    stream = a.encode() + b.encode() + b"hello"
    reader = ClcReader()
    got: list[ClcMessage] = []
    for i in range(len(stream)):
        reader.feed(stream[i : i + 1])
        msg = reader.next_message()
        if msg is not None:
            got.append(msg)
    assert got == [a, b]
    assert reader.trailing_data == b"hello"
    assert reader.buffered == 5
    assert reader.next_message() is None  # "hello" is not a header


def test_reader_consumes_exactly_one() -> None:
    reader = ClcReader()
    reader.feed(_accept().encode() + b"\xe2\xd4")
    assert reader.next_message() == _accept()
    assert reader.trailing_data == b"\xe2\xd4"
    assert reader.next_message() is None


def test_reader_refuses_oversize_before_body() -> None:
    reader = ClcReader()
    reader.feed(bytes.fromhex("e2d4c3d9 01 028d 20"))  # Proposal of 653 bytes
    with pytest.raises(WireError, match="length"):
        reader.next_message()
    with pytest.raises(WireError, match="length"):  # sticky
        reader.next_message()


def test_reader_expect() -> None:
    reader = ClcReader()
    reader.feed(_accept().encode()[:8])
    with pytest.raises(WireError, match="waiting for CONFIRM"):
        reader.next_message(expect=ClcType.CONFIRM)
    reader = ClcReader()
    decline = ClcDecline.linux(DeclineCode.MEM)
    reader.feed(decline.encode())
    assert reader.next_message(expect=ClcType.ACCEPT) == decline


def test_reader_bad_body_is_sticky() -> None:
    wire = bytearray(_accept().encode())
    wire[-1] = 0
    reader = ClcReader()
    reader.feed(bytes(wire))
    with pytest.raises(WireError, match="trailer"):
        reader.next_message()
    with pytest.raises(WireError, match="trailer"):
        reader.next_message()


# -- helpers ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "code"),
    [(0, 0), (16384, 0), (16385, 1), (32768, 1), (65536, 2), (65537, 3), (512 * 1024, 5),
     (512 << 20, 15), (1 << 40, 15)],
)  # fmt: skip
def test_compress_bufsize(size: int, code: int) -> None:
    assert compress_bufsize(size) == code


def test_compress_bufsize_smcd_cap() -> None:
    assert compress_bufsize(1 << 30, smcd=True) == 6


@given(st.integers(0, 15))
def test_bufsize_round_trip(code: int) -> None:
    assert uncompress_bufsize(code) == 16384 << code
    assert compress_bufsize(uncompress_bufsize(code)) == code


@given(st.integers(1, 1 << 32))
def test_compress_rounds_up(size: int) -> None:
    code = compress_bufsize(size)
    assert uncompress_bufsize(code) >= size or code == 15
    assert code == 0 or uncompress_bufsize(code - 1) < size


def test_mtu_enum() -> None:
    assert [m.size for m in IbMtu] == [256, 512, 1024, 2048, 4096]
    assert IbMtu.from_size(1024) is IbMtu.MTU_1024
    assert int(IbMtu.MTU_1024) == 3
    with pytest.raises(ValueError):
        IbMtu.from_size(1500)


def test_make_eid_and_hostname() -> None:
    assert make_eid("SMC-KVM-TEST") == b"SMC-KVM-TEST" + b" " * 20
    for bad in ("", "-A", "lower", "A" * 33, "A B"):
        with pytest.raises(ValueError):
            make_eid(bad)
    assert make_hostname("g2") == b"g2" + b" " * 30
    assert make_hostname("x" * 40) == b"x" * 32


@given(messages)
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_decode_clc_matches_type(msg: ClcMessage) -> None:
    wire = msg.encode()
    assume(len(wire) >= 8)
    assert type(decode_clc(wire)) is type(msg)
