"""Tests for smcr.wire.llc (llc_v1, llc_v2): the LLC messages (spec §3, §8, §9, §9a, §10)."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from smcr.wire.errors import WireError
from smcr.wire.llc import (
    LLC_CLASSES,
    LLC_FLAG_ADD_LNK_REJ,
    LLC_FLAG_DEL_LINK_ALL,
    LLC_FLAG_DEL_LINK_ORDERLY,
    LLC_FLAG_RESP,
    LLC_FLAG_RKEY_NEG,
    LLC_FLAG_RKEY_RETRY,
    AddLink,
    AddLinkCont,
    AddLinkV2,
    AddLinkV2Ext,
    Buffer,
    ByteOrder,
    ConfirmLink,
    ConfirmLinkV2,
    ConfirmRkey,
    ConfirmRkeyCont,
    ConfirmRkeyV2,
    DeleteLink,
    DeleteLinkReason,
    DeleteLinkV2,
    DeleteRkey,
    DeleteRkeyV2,
    LlcMessage,
    LlcType,
    RequestAddLinkV2,
    RkeyPair,
    Rtoken,
    TestLink,
    TestLinkV2,
    decode_llc,
)
from tests.support import FUZZ_EXAMPLES, LINUX_DECODED

GOLDEN_DECODED = LINUX_DECODED

MAC_S = bytes.fromhex("525400990012")  # server RoCE MAC in the golden capture
MAC_C = bytes.fromhex("525400990011")
GID_S = bytes(10) + bytes.fromhex("ffff0a63000c")  # ::ffff:10.99.0.12
GID_C = bytes(10) + bytes.fromhex("ffff0a63000b")
VADDR_S = 0xFF45874B42770000


# --------------------------------------------------------------------------- golden capture


@cache
def golden_llc() -> tuple[tuple[int, str, bytes], ...]:
    """Every LLC message of the decoded capture: (frame, summary line, raw bytes)."""
    if not GOLDEN_DECODED.exists():
        pytest.fail(f"golden capture not found: {GOLDEN_DECODED}; set SMCR_SHARED")
    found: list[tuple[int, str, bytes]] = []
    frame, summary = 0, ""
    for line in GOLDEN_DECODED.read_text().splitlines():
        head = re.match(r"\s*(\d+) \d+\.\d+ ", line)
        text = line.strip()
        if head:
            frame, summary = int(head.group(1)), ""
        elif text.startswith("LLC "):
            summary = text
        elif text.startswith("raw: ") and summary:
            found.append((frame, summary, bytes.fromhex(text[5:])))
            summary = ""
    return tuple(found)


def golden_frame(frame: int) -> bytes:
    for number, _, raw in golden_llc():
        if number == frame:
            return raw
    raise LookupError(frame)


def summary_pairs(summary: str) -> dict[str, str]:
    """The ``key=value`` pairs of a decoded.txt LLC line (``rtoken0(rkey=.. va=..)`` flattened)."""
    return {k: v.rstrip(")") for k, v in re.findall(r"(\w+)=(\S+)", summary)}


def gid_text(gid: bytes) -> str:
    return ":".join(gid[i : i + 2].hex() for i in range(0, 16, 2))


def render(msg: LlcMessage) -> dict[str, str]:
    """Our object in the notation of decoded.txt, for the fields it prints."""
    out = {"flags": f"0x{msg.flags:02x}"}
    if isinstance(msg, (ConfirmLink, AddLinkV2)):
        out["mac"] = ":".join(f"{b:02x}" for b in msg.sender_mac)
        out["gid"] = gid_text(msg.sender_gid)
        out["qpn"] = f"0x{msg.sender_qp_num:06x}"
        out["link_num"] = str(msg.link_num)
    if isinstance(msg, ConfirmLink):
        out["link_uid"] = msg.link_uid.hex()
        out["max_links"] = str(msg.max_links)
        out["max_conns"] = str(msg.max_conns)
    if isinstance(msg, AddLinkV2):
        out["qp_mtu"] = str(msg.qp_mtu)
        out["psn"] = f"0x{msg.initial_psn:06x}"
    if isinstance(msg, DeleteRkeyV2):
        out["num_rkeys"] = str(msg.num_rkeys)
        out["err_mask"] = f"0x{msg.num_invalid:02x}"
        out["rkey0"] = f"0x{(msg.rkeys or (0,))[0]:08x}"
    if isinstance(msg, ConfirmRkey):
        out["num_rkeys"] = str(len(msg.other_rtokens))
        out["rkey"] = f"0x{msg.rmb_key:08x}"
        out["va"] = f"0x{msg.rmb_vaddr:016x}"
    return out


def test_golden_has_the_llc_messages_the_readme_names() -> None:
    names = [summary.split()[1] for _, summary, _ in golden_llc()]
    assert names.count("CONFIRM_LINK_V2") == 2
    assert names.count("ADD_LINK_V2") == 2
    assert names.count("CONFIRM_RKEY_V2") == 4
    assert names.count("DELETE_RKEY_V2") == 8
    assert len(names) == 16


def test_golden_every_llc_decodes_to_the_printed_fields_and_reencodes() -> None:
    for frame, summary, raw in golden_llc():
        msg = decode_llc(raw)
        assert msg.encode() == raw, frame
        assert type(msg).decode(raw) == msg
        name = summary.split()[1]
        assert LlcType(raw[0]).name == name
        assert raw[0] == type(msg).TYPE
        assert msg.byteorder == "little"  # type: ignore[attr-defined]
        assert f"(len bytes {raw[1:3].hex(' ')})" in summary
        assert int.from_bytes(raw[1:3], "little") == len(raw)
        expected = summary_pairs(summary)
        mine = render(msg)
        assert mine == {k: expected[k] for k in mine}, frame
        assert msg.is_response == ("RESP" in summary.split())


def test_golden_confirm_link_v2_request_and_response() -> None:
    req = decode_llc(golden_frame(11))
    assert req == ConfirmLinkV2(
        flags=0x03,
        sender_mac=MAC_S,
        sender_gid=GID_S,
        sender_qp_num=0x11,
        link_num=1,
        link_uid=bytes.fromhex("00000101"),
        max_links=2,
        max_conns=255,
    )
    assert golden_frame(11)[:4] == bytes.fromhex("212c0003")
    resp = decode_llc(golden_frame(13))
    assert isinstance(resp, ConfirmLinkV2) and isinstance(resp, ConfirmLink)
    assert (resp.flags, resp.sender_mac, resp.sender_gid) == (0x83, MAC_C, GID_C)
    assert resp.is_response


def test_golden_add_link_v2_request_88_bytes() -> None:
    raw = golden_frame(15)
    assert len(raw) == 88 and raw[:4] == bytes.fromhex("22580000")
    msg = AddLinkV2.decode(raw)
    assert msg == AddLinkV2(
        flags=0,
        sender_mac=MAC_S,
        sender_gid=GID_S,
        sender_qp_num=0x12,
        link_num=2,
        qp_mtu=3,
        initial_psn=0x28AB25,
        ext=AddLinkV2Ext(
            direct=True,
            client_target_gid=GID_S,
            rkeys=(RkeyPair(rmb_key=0x3A4, rmb_key_new=0x5BC, rmb_vaddr_new=VADDR_S),),
        ),
    )
    assert msg.size == 88
    assert raw[70:72] == bytes.fromhex("0100")  # count in host (x86: little-endian) order
    assert raw[36] == 0  # decoded.txt's "init_credits": reserved in Linux 6.12


def test_golden_add_link_v2_reject_is_the_echoed_base() -> None:
    request = AddLinkV2.decode(golden_frame(15))
    reject = AddLinkV2.decode(golden_frame(17))
    assert reject.is_response and reject.is_rejected and reject.ext is None
    assert request.reject() == reject
    assert request.reject().encode() == golden_frame(17)
    assert golden_frame(17) == bytes.fromhex("222c00c0") + golden_frame(15)[4:44]


def test_golden_confirm_rkey_v2_response_is_the_echo() -> None:
    for req_frame, resp_frame in ((380, 382), (386, 388)):
        req = ConfirmRkeyV2.decode(golden_frame(req_frame))
        assert req.other_rtokens == () and not req.is_response
        assert req.response().encode() == golden_frame(resp_frame)
    first = ConfirmRkeyV2.decode(golden_frame(380))
    assert (first.rmb_key, first.rmb_vaddr) == (0x3A4, VADDR_S)


def test_golden_delete_rkey_v2_response_zeroes_the_list() -> None:
    req = DeleteRkeyV2.decode(golden_frame(367))
    assert req == DeleteRkeyV2.request((0x3A4,))
    assert req.encode() == bytes.fromhex("292c000001000000000003a4") + bytes(32)
    resp = req.response()
    assert resp.encode() == golden_frame(368) == bytes.fromhex("292c008001") + bytes(39)
    assert DeleteRkeyV2.decode(golden_frame(368)) == resp
    assert (resp.num_rkeys, resp.num_invalid, resp.rkeys) == (1, 0, ())


# --------------------------------------------------------------------------- v1, spec §3 / §9a


def v1_of(raw_v2: bytes) -> bytes:
    """The v1 twin of a 44-byte v2 message: type's low nibble, length byte 44, byte 2 zero."""
    return bytes((raw_v2[0] & 0x0F, 44, 0)) + raw_v2[3:]


def test_v1_twins_of_the_golden_44_byte_messages() -> None:
    for frame, _, raw in golden_llc():
        if len(raw) != 44 or raw[0] == LlcType.ADD_LINK_V2:
            continue
        v2 = decode_llc(raw)
        v1 = decode_llc(v1_of(raw))
        assert v1.encode() == v1_of(raw), frame
        if isinstance(v2, DeleteRkeyV2):  # its own class: the v2 list may pass 44 bytes
            assert isinstance(v1, DeleteRkey)
            assert v1.rkeys == (v2.rkeys or (0,)) and v1.flags == v2.flags
        else:
            assert type(v1) in type(v2).__bases__, frame  # its v1 twin, a direct base
            assert isinstance(v2, type(v1))
    cl = ConfirmLink.decode(v1_of(golden_frame(11)))
    assert cl.encode()[:4] == bytes.fromhex("012c0003")
    assert cl.sender_gid == GID_S and cl.max_conns == 255


def test_confirm_link_v1_leading_bytes() -> None:
    req = ConfirmLink(
        sender_mac=MAC_S, sender_gid=GID_S, sender_qp_num=0x11, link_num=1, link_uid=bytes(4)
    )
    assert req.encode()[:4] == bytes.fromhex("012c0003")
    resp = ConfirmLink(
        flags=0x83,
        sender_mac=MAC_C,
        sender_gid=GID_C,
        sender_qp_num=0x11,
        link_num=1,
        link_uid=bytes(4),
    )
    raw = resp.encode()
    assert raw[:4] == bytes.fromhex("012c0083") and len(raw) == 44
    assert raw[4:10] == MAC_C and raw[10:26] == GID_C and raw[26:29] == b"\x00\x00\x11"
    assert raw[34:36] == b"\x02\x00" and raw[36:] == bytes(8)


def test_add_link_v1_layout_and_reject() -> None:
    req = AddLink(
        sender_mac=MAC_S,
        sender_gid=GID_S,
        sender_qp_num=0x12,
        link_num=2,
        qp_mtu=3,
        initial_psn=0x28AB25,
    )
    raw = req.encode()
    assert raw[:4] == bytes.fromhex("022c0000")
    assert raw[4:10] == MAC_S and raw[10:12] == b"\0\0" and raw[12:28] == GID_S
    assert raw[28:31] == b"\x00\x00\x12" and raw[31] == 2 and raw[32] == 3
    assert raw[33:36] == bytes.fromhex("28ab25") and raw[36:] == bytes(8)
    reject = req.reject()
    assert reject.encode() == bytes.fromhex("022c01c0") + raw[4:]
    assert reject.is_rejected and reject.reject_reason == 1
    assert AddLink.decode(reject.encode()) == reject


def test_add_link_v1_invitation_carries_only_mac_and_gid() -> None:
    raw = AddLink(sender_mac=MAC_C, sender_gid=GID_C).encode()
    assert raw[28:] == bytes(16)


def test_add_link_cont_pairs_start_at_byte_8_as_linux() -> None:
    pairs = (
        RkeyPair(rmb_key=1, rmb_key_new=2, rmb_vaddr_new=3),
        RkeyPair(rmb_key=4, rmb_key_new=5, rmb_vaddr_new=6),
    )
    msg = AddLinkCont(flags=0x80, link_num=2, num_rkeys=5, rkeys=pairs)
    raw = msg.encode()
    assert raw[:8] == bytes.fromhex("032c008002050000")
    assert raw[8:24] == bytes.fromhex("00000001000000020000000000000003")
    assert raw[24:40] == bytes.fromhex("00000004000000050000000000000006")
    assert raw[40:] == bytes(4)
    assert AddLinkCont.decode(raw) == msg
    one = AddLinkCont(link_num=2, num_rkeys=1, rkeys=pairs[:1])
    assert AddLinkCont.decode(one.encode()).rkeys == pairs[:1]
    assert AddLinkCont(link_num=2, num_rkeys=0).encode()[5:] == bytes(39)


def test_delete_link_lgr_idle_timeout_bytes() -> None:
    msg = DeleteLink(
        flags=LLC_FLAG_DEL_LINK_ALL | LLC_FLAG_DEL_LINK_ORDERLY,
        reason=DeleteLinkReason.PROG_INIT_TERM,
    )
    raw = msg.encode()
    assert raw == bytes.fromhex("042c006000000300 00") + bytes(35)
    back = DeleteLink.decode(raw)
    assert back == msg and back.is_all and back.is_orderly
    assert back.reason is DeleteLinkReason.PROG_INIT_TERM


def test_delete_link_response_and_unknown_reason() -> None:
    req = DeleteLink(flags=LLC_FLAG_DEL_LINK_ORDERLY, link_num=2, reason=DeleteLinkReason.LOST_PATH)
    resp = req.response()
    assert resp.encode()[:9] == bytes.fromhex("042c00a0 02 00000000")
    assert req.response(DeleteLinkReason.NOLNK).encode()[5:9] == bytes.fromhex("00100000")
    odd = DeleteLink.decode(bytes.fromhex("042c0000 01 12345678") + bytes(35))
    assert odd.reason == 0x12345678 and not isinstance(odd.reason, DeleteLinkReason)
    assert DeleteLinkReason(0x00040000) is DeleteLinkReason.PROT_VIOL


def test_confirm_rkey_v1_with_other_rtokens() -> None:
    others = (
        Rtoken(link_id=2, rmb_key=0x5BC, rmb_vaddr=VADDR_S),
        Rtoken(link_id=3, rmb_key=0x5BD, rmb_vaddr=VADDR_S + 1),
    )
    msg = ConfirmRkey(rmb_key=0x3A4, rmb_vaddr=VADDR_S, other_rtokens=others)
    raw = msg.encode()
    assert raw[:5] == bytes.fromhex("062c000002")
    assert raw[5:9] == bytes.fromhex("000003a4") and raw[9:17] == VADDR_S.to_bytes(8, "big")
    assert raw[17] == 2 and raw[18:22] == bytes.fromhex("000005bc")
    assert raw[30] == 3 and raw[43] == 0
    assert ConfirmRkey.decode(raw) == msg
    assert msg.response().encode()[:4] == bytes.fromhex("062c0080")
    neg = msg.response(negative=True)
    assert neg.flags == LLC_FLAG_RESP | LLC_FLAG_RKEY_NEG | LLC_FLAG_RKEY_RETRY
    assert neg.encode()[4:] == raw[4:]


def test_confirm_rkey_cont_decodes_and_encodes() -> None:
    tokens = tuple(Rtoken(link_id=i, rmb_key=i * 10, rmb_vaddr=i * 100) for i in (1, 2, 3))
    msg = ConfirmRkeyCont(num_rkeys=4, rtokens=tokens)
    raw = msg.encode()
    assert raw[:5] == bytes.fromhex("082c000004") and raw[5] == 1 and raw[31] == 3
    assert decode_llc(raw) == msg
    short = ConfirmRkeyCont(num_rkeys=1, rtokens=tokens[:1])
    assert short.encode()[18:] == bytes(26)


def test_delete_rkey_v1_count_mask_and_list() -> None:
    msg = DeleteRkey(rkeys=(0x3AF, 0x3A4))
    raw = msg.encode()
    assert raw[:8] == bytes.fromhex("092c000002000000")
    assert raw[8:16] == bytes.fromhex("000003af000003a4") and raw[16:] == bytes(28)
    resp = msg.response(err_mask=0x40)
    assert resp.encode()[:6] == bytes.fromhex("092c00a00240")
    assert resp.rkeys == msg.rkeys  # v1 echoes the list
    assert DeleteRkey.decode(resp.encode()) == resp
    assert msg.response().encode()[:6] == bytes.fromhex("092c00800200")


def test_test_link_v1_and_v2_echo() -> None:
    data = bytes(range(16))
    req = TestLink(user_data=data)
    raw = req.encode()
    assert raw[:4] == bytes.fromhex("072c0000") and raw[4:20] == data and raw[20:] == bytes(24)
    assert req.response().encode() == bytes.fromhex("072c0080") + raw[4:]
    v2 = TestLinkV2(user_data=data, byteorder="big")
    assert v2.encode()[:4] == bytes.fromhex("27002c00")
    assert v2.response().encode()[:4] == bytes.fromhex("27002c80")  # echo keeps the header
    assert TestLinkV2.decode(v2.response().encode()) == v2.response()


def test_request_add_link_v2_and_its_response() -> None:
    msg = RequestAddLinkV2(gids=(GID_C, GID_S))
    raw = msg.encode()
    assert len(raw) == 60 and raw[:4] == bytes.fromhex("253c0000")
    assert raw[4:24] == bytes(20) and raw[24] == 2 and raw[25:28] == bytes(3)
    assert raw[28:44] == GID_C and raw[44:60] == GID_S
    assert decode_llc(raw) == msg
    resp = msg.response()
    assert resp.encode() == bytes.fromhex("252c0080") + bytes(40)
    assert decode_llc(resp.encode()) == resp
    one = RequestAddLinkV2(gids=(GID_C,))
    assert len(one.encode()) == 44


def test_delete_link_v2_response_keeps_request_byteorder() -> None:
    req = DeleteLinkV2(flags=LLC_FLAG_DEL_LINK_ORDERLY, link_num=2, reason=0x10000)
    assert req.encode()[:4] == bytes.fromhex("242c0020")
    big = DeleteLinkV2.decode(bytes.fromhex("24002c20") + req.encode()[4:])
    assert big.byteorder == "big" and big.response().encode()[:4] == bytes.fromhex("24002ca0")


# --------------------------------------------------------------------------- byte order


def test_v2_big_endian_length_is_accepted_and_kept() -> None:
    raw = bytes.fromhex("21002c03") + golden_frame(11)[4:]
    msg = decode_llc(raw)
    assert isinstance(msg, ConfirmLinkV2) and msg.byteorder == "big"
    assert msg.encode() == raw


def test_add_link_v2_big_endian_length_and_count() -> None:
    le = golden_frame(15)
    be = bytearray(le)
    be[1:3] = b"\x00\x58"
    be[70:72] = b"\x00\x01"
    msg = AddLinkV2.decode(bytes(be))
    assert msg.byteorder == "big" and msg.encode() == bytes(be)
    assert msg.reject().encode() == golden_frame(17)  # responder writes its own order
    assert msg.reject(byteorder="big").encode()[:4] == bytes.fromhex("22002cc0")


def test_add_link_v2_count_in_the_other_order_is_refused() -> None:
    mixed = bytearray(golden_frame(15))
    mixed[70:72] = b"\x00\x01"  # length little-endian, count big-endian
    with pytest.raises(WireError, match="rkey count"):
        AddLinkV2.decode(bytes(mixed))


def test_v2_length_must_match_size() -> None:
    raw = bytearray(golden_frame(11))
    raw[1:3] = b"\x2d\x00"
    with pytest.raises(WireError, match="length field"):
        decode_llc(bytes(raw))
    with pytest.raises(WireError):
        decode_llc(golden_frame(11) + b"\0")  # 45 bytes, length still 44


def test_palindromic_length_normalises_byteorder() -> None:
    rkeys = tuple(range(1, 256))
    msg = DeleteRkeyV2.request(rkeys, byteorder="big")
    assert msg.size == 1028 and msg.encode()[1:3] == b"\x04\x04"
    assert msg.byteorder == "little"
    assert DeleteRkeyV2.decode(msg.encode()) == msg
    gids = tuple(bytes([i]) * 16 for i in range(191))
    req = RequestAddLinkV2(gids=gids, byteorder="big")
    assert req.size == 0x0C0C and req.byteorder == "little"
    assert decode_llc(req.encode()) == req


def test_delete_rkey_v2_longer_than_44_bytes() -> None:
    rkeys = tuple(range(100, 110))
    msg = DeleteRkeyV2.request(rkeys)
    raw = msg.encode()
    assert len(raw) == 48 and raw[1:3] == b"\x30\x00" and raw[4] == 10
    assert decode_llc(raw) == msg
    resp = msg.response(num_invalid=2)
    assert resp.encode() == bytes.fromhex("292c00a00a02") + bytes(38)
    assert resp.flags & LLC_FLAG_RKEY_NEG


# --------------------------------------------------------------------------- strictness


def test_decode_llc_refuses_unknown_types_and_cdc() -> None:
    for type_byte in (0x00, 0x05, 0x0A, 0x20, 0x23, 0x28, 0x2A, 0x11, 0xFE, 0xFF):
        raw = bytes((type_byte, 44)) + bytes(42)
        with pytest.raises(WireError) as info:
            decode_llc(raw)
        assert info.value.code is None
    with pytest.raises(WireError, match="CDC"):
        decode_llc(bytes.fromhex("fe2c0001") + bytes(40))
    with pytest.raises(WireError, match="empty"):
        decode_llc(b"")


@pytest.mark.parametrize("size", [0, 1, 4, 43, 45, 48])
def test_v1_size_must_be_44(size: int) -> None:
    raw = (bytes((0x07, 44)) + bytes(size))[:size]
    with pytest.raises(WireError):
        TestLink.decode(raw)
    with pytest.raises(WireError):
        decode_llc(raw)


def test_v1_length_byte_must_be_44() -> None:
    raw = bytearray(TestLink().encode())
    raw[1] = 48
    with pytest.raises(WireError, match="length byte"):
        decode_llc(bytes(raw))


def test_decoder_refuses_another_type() -> None:
    with pytest.raises(WireError, match="type"):
        ConfirmLink.decode(TestLink().encode())
    with pytest.raises(WireError, match="type"):
        ConfirmLinkV2.decode(v1_of(golden_frame(11)))


def test_v2_size_limits() -> None:
    ext = AddLinkV2Ext(
        client_target_gid=GID_S,
        rkeys=(RkeyPair(rmb_key=1, rmb_key_new=2, rmb_vaddr_new=3),) * 507,
    )
    biggest = AddLinkV2(sender_mac=MAC_S, sender_gid=GID_S, ext=ext)
    assert biggest.size == 8184 and decode_llc(biggest.encode()) == biggest
    with pytest.raises(ValueError):
        AddLinkV2Ext(client_target_gid=GID_S, rkeys=ext.rkeys * 2)
    too_big = bytearray(8196)
    too_big[0:5] = bytes.fromhex("2904200000")  # length 8196, little-endian
    with pytest.raises(WireError, match="8192"):
        decode_llc(bytes(too_big))


def test_counts_out_of_range_are_refused() -> None:
    rkey = bytearray(ConfirmRkey(rmb_key=1, rmb_vaddr=2).encode())
    rkey[4] = 3  # Linux would use 2 of them; the spec allows 0..2
    with pytest.raises(WireError, match="additional rtokens"):
        decode_llc(bytes(rkey))
    delete = bytearray(DeleteRkey(rkeys=(1,)).encode())
    for bad in (0, 9):
        delete[4] = bad
        with pytest.raises(WireError, match="DELETE RKEY count"):
            decode_llc(bytes(delete))
    v2 = bytearray(DeleteRkeyV2.request((1,)).encode())
    v2[4] = 0
    with pytest.raises(WireError, match="no rkeys"):
        decode_llc(bytes(v2))
    v2[4] = 9  # 9 rkeys fit 44 bytes (8 + 36); 10 need 48
    assert DeleteRkeyV2.decode(bytes(v2)).num_rkeys == 9
    v2[4] = 10
    with pytest.raises(WireError, match="10 rkeys"):
        decode_llc(bytes(v2))
    ral = bytearray(RequestAddLinkV2(gids=(GID_C,)).encode())
    ral[24] = 2
    with pytest.raises(WireError, match="2 GIDs"):
        decode_llc(bytes(ral))


def test_add_link_v2_odd_sizes_are_refused() -> None:
    raw = golden_frame(15)
    for size in (45, 71, 73, 87, 89):
        body = bytearray((raw + bytes(8))[:size])
        body[1:3] = size.to_bytes(2, "little")
        with pytest.raises(WireError):
            AddLinkV2.decode(bytes(body))


def test_reserved_bytes_are_ignored_and_sent_as_zero() -> None:
    cases: list[tuple[LlcMessage, list[int]]] = [
        (
            ConfirmLink(
                sender_mac=MAC_S, sender_gid=GID_S, sender_qp_num=1, link_num=1, link_uid=bytes(4)
            ),
            [2, *range(36, 44)],
        ),
        (AddLink(sender_mac=MAC_S, sender_gid=GID_S, qp_mtu=3), [10, 11, 36, 43]),
        (
            AddLinkCont(
                link_num=1,
                num_rkeys=1,
                rkeys=(RkeyPair(rmb_key=1, rmb_key_new=2, rmb_vaddr_new=3),),
            ),
            [2, 6, 7, *range(24, 44)],
        ),
        (DeleteLink(link_num=1), [2, *range(9, 44)]),
        (ConfirmRkey(rmb_key=1, rmb_vaddr=2), [2, *range(17, 44)]),
        (DeleteRkey(rkeys=(5,)), [2, 6, 7, *range(12, 44)]),
        (TestLink(), [2, *range(20, 44)]),
        (DeleteRkeyV2.request((5,)), [6, 7, *range(12, 44)]),
        (DeleteRkeyV2.request((5,)).response(), list(range(8, 44))),
        (RequestAddLinkV2(), [*range(4, 24), *range(25, 44)]),
    ]
    for msg, offsets in cases:
        raw = bytearray(msg.encode())
        for off in offsets:
            raw[off] = 0xA5
        back = decode_llc(bytes(raw))
        assert back == msg, type(msg).__name__
        assert back.encode() == msg.encode()
    high = bytearray(cases[1][0].encode())
    high[2] = 0xF1  # ADD LINK byte 2: high nibble reserved, low nibble the reason
    high[32] = 0xF3  # high nibble reserved, low nibble qp_mtu
    add = AddLink.decode(bytes(high))
    assert (add.reject_reason, add.qp_mtu) == (1, 3)
    ext = bytearray(golden_frame(15))
    ext[44] |= 0x7F
    ext[45] = ext[62] = 0xFF
    assert AddLinkV2.decode(bytes(ext)) == AddLinkV2.decode(golden_frame(15))


def test_constructors_refuse_values_that_do_not_fit() -> None:
    with pytest.raises(ValueError):
        ConfirmLink(
            sender_mac=b"\0" * 5, sender_gid=GID_S, sender_qp_num=1, link_num=1, link_uid=bytes(4)
        )
    with pytest.raises(ValueError):
        AddLink(sender_mac=MAC_S, sender_gid=GID_S, sender_qp_num=1 << 24)
    with pytest.raises(ValueError):
        AddLinkCont(link_num=1, num_rkeys=3)
    with pytest.raises(ValueError):
        DeleteRkey(rkeys=())
    with pytest.raises(ValueError):
        DeleteRkeyV2(flags=LLC_FLAG_RESP, num_rkeys=1, rkeys=(1,))
    with pytest.raises(ValueError):
        ConfirmLinkV2(
            sender_mac=MAC_S,
            sender_gid=GID_S,
            sender_qp_num=1,
            link_num=1,
            link_uid=bytes(4),
            byteorder="middle",  # type: ignore[arg-type]
        )


def test_memoryview_and_bytearray_inputs() -> None:
    raw = golden_frame(15)
    slot = bytearray(raw + bytes(100))  # e.g. a receive slot, cut to the byte length
    assert decode_llc(memoryview(slot)[: len(raw)]) == decode_llc(raw)
    assert decode_llc(bytearray(raw)) == decode_llc(raw)


# --------------------------------------------------------------------------- hypothesis

u8 = st.integers(0, 0xFF)
u24 = st.integers(0, (1 << 24) - 1)
u32 = st.integers(0, (1 << 32) - 1)
u64 = st.integers(0, (1 << 64) - 1)
macs = st.binary(min_size=6, max_size=6)
gids = st.binary(min_size=16, max_size=16)
ORDERS: tuple[ByteOrder, ...] = ("little", "big")
orders = st.sampled_from(ORDERS)
rtokens = st.builds(Rtoken, link_id=u8, rmb_key=u32, rmb_vaddr=u64)
pairs = st.builds(RkeyPair, rmb_key=u32, rmb_key_new=u32, rmb_vaddr_new=u64)


def tuples(elements: st.SearchStrategy[Any], size: int) -> st.SearchStrategy[tuple[Any, ...]]:
    return st.lists(elements, min_size=size, max_size=size).map(tuple)


def confirm_links(cls: type[ConfirmLink], **extra: Any) -> st.SearchStrategy[Any]:
    return st.builds(
        cls,
        flags=u8,
        sender_mac=macs,
        sender_gid=gids,
        sender_qp_num=u24,
        link_num=u8,
        link_uid=st.binary(min_size=4, max_size=4),
        max_links=u8,
        max_conns=u8,
        **extra,
    )


def add_link_conts() -> st.SearchStrategy[AddLinkCont]:
    return u8.flatmap(
        lambda n: st.builds(
            AddLinkCont, flags=u8, link_num=u8, num_rkeys=st.just(n), rkeys=tuples(pairs, min(n, 2))
        )
    )


def confirm_rkey_conts() -> st.SearchStrategy[ConfirmRkeyCont]:
    return u8.flatmap(
        lambda n: st.builds(
            ConfirmRkeyCont, flags=u8, num_rkeys=st.just(n), rtokens=tuples(rtokens, min(n, 3))
        )
    )


def delete_rkey_v2s() -> st.SearchStrategy[DeleteRkeyV2]:
    requests = st.lists(u32, min_size=1, max_size=40).flatmap(
        lambda keys: st.builds(
            DeleteRkeyV2,
            flags=u8.map(lambda f: f & 0x7F),
            num_rkeys=st.just(len(keys)),
            num_invalid=u8,
            rkeys=st.just(tuple(keys)),
            byteorder=orders,
        )
    )
    responses = st.builds(
        DeleteRkeyV2,
        flags=u8.map(lambda f: f | 0x80),
        num_rkeys=u8,
        num_invalid=u8,
        byteorder=orders,
    )
    return st.one_of(requests, responses)


STRATEGIES: dict[type[LlcMessage], st.SearchStrategy[Any]] = {
    ConfirmLink: confirm_links(ConfirmLink),
    ConfirmLinkV2: confirm_links(ConfirmLinkV2, byteorder=orders),
    AddLink: st.builds(
        AddLink,
        flags=u8,
        reject_reason=st.integers(0, 15),
        sender_mac=macs,
        sender_gid=gids,
        sender_qp_num=u24,
        link_num=u8,
        qp_mtu=st.integers(0, 15),
        initial_psn=u24,
    ),
    AddLinkV2: st.builds(
        AddLinkV2,
        flags=u8,
        sender_mac=macs,
        sender_gid=gids,
        sender_qp_num=u24,
        link_num=u8,
        qp_mtu=st.integers(0, 15),
        initial_psn=u24,
        byteorder=orders,
        ext=st.none()
        | st.builds(
            AddLinkV2Ext,
            direct=st.booleans(),
            client_target_gid=gids,
            rkeys=st.lists(pairs, max_size=12).map(tuple),
        ),
    ),
    AddLinkCont: add_link_conts(),
    DeleteLink: st.builds(
        DeleteLink, flags=u8, link_num=u8, reason=st.sampled_from(DeleteLinkReason) | u32
    ),
    DeleteLinkV2: st.builds(
        DeleteLinkV2,
        flags=u8,
        link_num=u8,
        reason=st.sampled_from(DeleteLinkReason) | u32,
        byteorder=orders,
    ),
    ConfirmRkey: st.builds(
        ConfirmRkey,
        flags=u8,
        rmb_key=u32,
        rmb_vaddr=u64,
        other_rtokens=st.lists(rtokens, max_size=2).map(tuple),
    ),
    ConfirmRkeyV2: st.builds(
        ConfirmRkeyV2,
        flags=u8,
        rmb_key=u32,
        rmb_vaddr=u64,
        other_rtokens=st.lists(rtokens, max_size=2).map(tuple),
        byteorder=orders,
    ),
    ConfirmRkeyCont: confirm_rkey_conts(),
    DeleteRkey: st.builds(
        DeleteRkey, flags=u8, err_mask=u8, rkeys=st.lists(u32, min_size=1, max_size=8).map(tuple)
    ),
    DeleteRkeyV2: delete_rkey_v2s(),
    TestLink: st.builds(TestLink, flags=u8, user_data=gids),
    TestLinkV2: st.builds(TestLinkV2, flags=u8, user_data=gids, byteorder=orders),
    RequestAddLinkV2: st.builds(
        RequestAddLinkV2, flags=u8, byteorder=orders, gids=st.lists(gids, max_size=12).map(tuple)
    ),
}
any_message = st.one_of(*STRATEGIES.values())


def test_every_llc_class_has_a_strategy() -> None:
    assert set(STRATEGIES) == set(LLC_CLASSES.values())


@pytest.mark.parametrize("cls", list(STRATEGIES), ids=lambda c: c.__name__)
def test_round_trip(cls: type[LlcMessage]) -> None:
    @settings(max_examples=60, deadline=None)
    @given(STRATEGIES[cls])
    def check(msg: LlcMessage) -> None:
        raw = msg.encode()
        assert raw[0] == cls.TYPE
        assert len(raw) == (44 if cls.TYPE < 0x20 else int.from_bytes(raw[1:3], msg.byteorder))  # type: ignore[attr-defined]
        assert cls.decode(raw) == msg
        assert decode_llc(raw) == msg
        assert type(decode_llc(raw)) is cls
        assert cls.decode(raw).encode() == raw
        assert cls.decode(memoryview(raw)) == msg

    check()


@given(any_message)
def test_responses_round_trip(msg: LlcMessage) -> None:
    replies: list[LlcMessage] = []
    if isinstance(
        msg, (TestLink, ConfirmRkey, DeleteLink, DeleteRkey, DeleteRkeyV2, RequestAddLinkV2)
    ):
        replies.append(msg.response())
    if isinstance(msg, (AddLink, AddLinkV2)):
        replies.append(msg.reject())
    for reply in replies:
        assert reply.is_response
        assert decode_llc(reply.encode()) == reply
        if isinstance(reply, AddLink | AddLinkV2):
            assert reply.flags & LLC_FLAG_ADD_LNK_REJ
            assert reply.encode()[4:44] == msg.encode()[4:44]


DECODERS: list[Callable[[Buffer], LlcMessage]] = [
    decode_llc,
    *(cls.decode for cls in LLC_CLASSES.values()),
]


def assert_only_wire_errors(data: bytes) -> None:
    """Every decoder either refuses ``data`` with WireError or yields a stable message."""
    for decoder in DECODERS:
        try:
            msg = decoder(data)
        except WireError:
            continue
        again = decode_llc(msg.encode())
        assert again == msg
        assert again.encode() == msg.encode()


@st.composite
def llc_like(draw: st.DrawFn) -> bytes:
    """Bytes that look like an LLC: a plausible type byte and a size-matching length."""
    type_byte = draw(st.sampled_from([*LLC_CLASSES, 0x05, 0x23, 0x28, 0xFE, 0x00]))
    size = draw(
        st.sampled_from([44, 44, 48, 60, 72, 88, 104, 1028, 8192, 8193]) | st.integers(0, 140)
    )
    head = draw(st.binary(max_size=min(size, 140)))
    data = bytearray(head + bytes(size - len(head)))
    if size:
        data[0] = type_byte
    if size >= 3 and type_byte & 0x20:
        data[1:3] = (size & 0xFFFF).to_bytes(2, draw(orders))
        if size > 70 and type_byte == 0x22 and draw(st.booleans()):
            data[70:72] = ((size - 72) // 16 & 0xFFFF).to_bytes(2, draw(orders))
    elif size >= 2 and draw(st.booleans()):
        data[1] = 44
    return bytes(data)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A valid message with a few bytes changed, cut short or extended."""
    data = bytearray(draw(any_message).encode())
    for _ in range(draw(st.integers(0, 3))):
        data[draw(st.integers(0, len(data) - 1))] = draw(u8)
    how = draw(st.sampled_from(("keep", "cut", "extend")))
    if how == "cut":
        del data[draw(st.integers(0, len(data))) :]
    elif how == "extend":
        data += draw(st.binary(min_size=1, max_size=20))
    return bytes(data)


fuzz_inputs = st.one_of(st.binary(max_size=120), llc_like(), mutated())


@settings(max_examples=300, deadline=None)
@given(fuzz_inputs)
def test_fuzz_decoders_raise_only_wire_error(data: bytes) -> None:
    assert_only_wire_errors(data)


@pytest.mark.slow
@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(fuzz_inputs)
def test_fuzz_decoders_raise_only_wire_error_slow(data: bytes) -> None:
    assert_only_wire_errors(data)
