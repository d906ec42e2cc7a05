"""Wireshark agrees with smcr: every message smcr builds is recognised and decoded as meant.

A capture of :func:`smcr.sample.sample_conversation` (CLC over a synthetic TCP
stream, LLC and CDC as RoCEv2 SENDs on UDP 4791, an RDMA WRITE, ACKs) is decoded
by tshark; each message must be recognised as SMC (no "Malformed", no expert
error), and the fields tshark decodes must equal the fields smcr encoded.
scapy's RoCE layer must find every ICRC correct.

Known Wireshark 4.0 quirks the expectations spell out (each is a Wireshark
limitation, checked so that a change in either side shows up):

* ADD LINK CONTINUATION: Wireshark reads the rkey pairs from byte 6, Linux
  writes them from byte 8 (spec §3.5 [DISCREPANCY]).
* CDC: Wireshark names the consumer cursor's fields like the producer's.
* Accept: its first-contact flag is registered as ``smc.proposal.first.contact``.
"""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.l2 import Ether
from scapy.utils import rdpcap, wrpcap

from smcr.pcap import PcapWriter
from smcr.sample import SampleFrame, sample_conversation
from smcr.tools.tshark import DecodedFrame, decode
from smcr.wire.cdc import CdcMessage
from smcr.wire.clc import ClcAccept, ClcConfirm, ClcDecline, ClcProposal
from smcr.wire.llc import (
    AddLink,
    AddLinkCont,
    ConfirmLink,
    ConfirmRkey,
    DeleteLink,
    DeleteRkey,
    TestLink,
)
from smcr.wire.roce import Opcode
from tests.support import LINUX_PCAP

pytestmark = pytest.mark.tshark

Expected = dict[str, list[Any]]


@pytest.fixture(scope="module")
def sample() -> list[SampleFrame]:
    return sample_conversation()


@pytest.fixture(scope="module")
def decoded(
    sample: list[SampleFrame], tmp_path_factory: pytest.TempPathFactory
) -> list[DecodedFrame]:
    path = tmp_path_factory.mktemp("wireshark") / "sample.pcap"
    with PcapWriter(path) as writer:
        for index, item in enumerate(sample):
            writer.write(item.frame, 1_700_000_000 + index / 1000)
    frames = decode(path)
    assert len(frames) == len(sample)
    return frames


# -- normalising tshark's text ---------------------------------------------------


def _norm(value: str) -> Any:
    """tshark's ``show`` text as a comparable value: ints, addresses, stripped strings."""
    try:
        return int(value, 0)
    except ValueError:
        pass
    try:
        return ipaddress.ip_address(value)
    except ValueError:
        return value.strip()


def _gid(raw: bytes) -> Any:
    return ipaddress.IPv6Address(raw)


def _mac(raw: bytes) -> str:
    return ":".join(f"{b:02x}" for b in raw)


def _u64(raw: bytes) -> int:
    value: int = struct.unpack(">Q", raw)[0]
    return value


# -- expected fields per message type -----------------------------------------------


def _proposal(m: ClcProposal) -> Expected:
    raw = m.encode()
    exp: Expected = {
        "smc.clc_msg": [1],
        "smc.length": [len(raw)],
        "smc.proposal.smc.version": [m.version],
        "smc.proposal.smc.type": [int(m.typev1)],
    }
    if m.typev1 != 2:  # an SMC-R v1 type offered: peer id, GID, MAC, prefix area
        exp |= {
            "smc.proposal.sender.client.peer.id": [_u64(m.peer_id)],
            "smc.proposal.client.preferred.gid": [_gid(m.gid)],
            "smc.proposal.client.preferred.mac": [_mac(m.mac)],
            "smc.proposal.smcv1_subnet_ext_offset": [m.ip_area_offset],
        }
    if m.prefix is not None:
        exp |= {
            "smc.outgoing.interface.subnet.mask": [m.prefix.outgoing_subnet],
            "smc.outgoing.interface.subnet.mask.number.of.significant.bits": [m.prefix.prefix_len],
            "smc.proposal.ipv6.prefix.count": [len(m.prefix.ipv6_prefixes)],
            "smc.proposal.ipv6.prefix.value": [p.prefix for p in m.prefix.ipv6_prefixes],
            "smc.proposal.ipv6.prefix.length": [p.prefix_len for p in m.prefix.ipv6_prefixes],
        }
    if m.v2_extension is not None:
        ext = m.v2_extension
        exp |= {
            "smc.proposal.smcv2.type": [int(m.typev2)],
            "smc.proposal.eid.count": [len(ext.user_eids)],
            "smc.proposal.smc.version.relnum": [ext.release],
            "smc.proposal.rocev2.gid.ipv4": [ipaddress.IPv4Address(ext.roce_gid[12:])],
            "smc.proposal.eid": [e.decode("ascii").strip() for e in ext.user_eids],
        }
    return exp


def _accept_confirm(m: ClcAccept | ClcConfirm) -> Expected:
    accept = isinstance(m, ClcAccept)
    a = "smc.accept" if accept else "smc.confirm"
    names = {
        "peer": f"{a}.sender.server.peer.id" if accept else f"{a}.sender.client.peer.id",
        "gid": f"{a}.server.preferred.gid" if accept else "smc.client.gid",
        "mac": f"{a}.server.preferred.mac" if accept else f"{a}.client.mac",
        "qpn": f"{a}.server.qp.number" if accept else f"{a}.client.qp.number",
        "rkey": f"{a}.server.rmb.rkey" if accept else f"{a}.client.rmb.rkey",
        "idx": f"{a}.server.tcp.conn.index" if accept else f"{a}.client.tcp.conn.index",
        "token": (f"{a}.server.rmb.element.alert.token" if accept
                  else "smc.client.rmb.element.alert.token"),
        "vaddr": (f"{a}.server.rmb.virtual.address" if accept
                  else "smc.client.rmb.virtual.address"),
        "psn": f"{a}.initial.psn" if accept else "smc.initial.psn",
    }
    exp: Expected = {
        "smc.clc_msg": [2 if accept else 3],
        "smc.length": [len(m.encode())],
        # Wireshark 4.0 registers the Accept's flag under a Proposal field name.
        ("smc.proposal.first.contact" if accept else f"{a}.first.contact"): [
            int(m.first_contact)
        ],
        names["peer"]: [_u64(m.peer_id)],
        names["gid"]: [_gid(m.gid)],
        names["mac"]: [_mac(m.mac)],
        names["qpn"]: [m.qpn],
        names["rkey"]: [m.rmb_rkey],
        names["idx"]: [m.rmbe_idx],
        names["token"]: [m.rmbe_alert_token],
        f"{a}.rmb.buffer.size": [m.rmbe_size],
        f"{a}.qp.mtu.value": [m.qp_mtu],
        names["vaddr"]: [m.rmb_vaddr],
        names["psn"]: [m.psn],
    }
    if m.version >= 2:
        exp[f"{a}.eid"] = [m.eid.decode("ascii").strip()]
    if m.fce is not None:
        exp[f"{a}.peer.host.name"] = [m.fce.hostname.decode("ascii").strip()]
        exp[f"{a}.os.type"] = [m.fce.os_type]
        exp[f"{a}.smc.version.relnum"] = [m.fce.release]
    if m.gid_list:
        exp["smc.confirm.gid.list.entry_count"] = [len(m.gid_list)]
        exp["smc.confirm.gid.list.entry"] = [_gid(g) for g in m.gid_list]
    return exp


def _decline(m: ClcDecline) -> Expected:
    codes = [m.peer_diagnosis, *(m.peer_diagnosis_v2 if m.version >= 2 else ())]
    exp: Expected = {
        "smc.clc_msg": [4],
        "smc.length": [len(m.encode())],
        "smc.decline.smc.version": [m.version],
        "smc.decline.osync": [int(m.out_of_sync)],
        "smc.sender.peer.id": [_u64(m.peer_id)],
        "smc.peer.diag.info": codes,
    }
    if m.version >= 2:
        exp["smc.decline.os.type"] = [m.os_type]
    return exp


def _confirm_link(m: ConfirmLink) -> Expected:
    return {
        "smc.llc_msg": [0x01],
        "smc.confirm.link.response": [int(m.is_response)],
        "smc.confirm.link.sender.mac": [_mac(m.sender_mac)],
        "smc.sender.gid": [_gid(m.sender_gid)],
        "smc.confirm.link.sender.qp.number": [m.sender_qp_num],
        "smc.confirm.link.number": [m.link_num],
        "smc.confirm.link.sender.link.userid": [int.from_bytes(m.link_uid, "big")],
        "smc.confirm.link.max.links": [m.max_links],
    }


def _add_link(m: AddLink) -> Expected:
    return {
        "smc.llc_msg": [0x02],
        "smc.add.link.response": [int(m.is_response)],
        "smc.add.link.response.rejected": [int(m.is_rejected)],
        "smc.add.link.sender.mac": [_mac(m.sender_mac)],
        "smc.add.link.sender.gid": [_gid(m.sender_gid)],
        "smc.add.link.sender.qp.number": [m.sender_qp_num],
        "smc.add.link.link.number": [m.link_num],
        "smc.add.link.qp.mtu.value": [m.qp_mtu],
        "smc.add.link.initial.psn": [m.initial_psn],
    }


def _add_link_cont(m: AddLinkCont) -> Expected:
    # Wireshark 4.0 reads the first pair from byte 6; Linux (and smcr) write it at 8.
    raw = m.encode()
    rkey1, rkey2, vaddr = struct.unpack_from(">IIQ", raw, 6)
    return {
        "smc.llc_msg": [0x03],
        "smc.add.link.cont.link.number": [m.link_num],
        "smc.add.link.cont.rkey.number": [m.num_rkeys],
        "smc.add.link.cont.rmb.RTok1.Rkey1": [rkey1],
        "smc.add.link.cont.rmb.RTok1.Rkey2": [rkey2],
        "smc.add.link.cont.rmb.RTok1.virt": [vaddr],
    }


def _delete_link(m: DeleteLink) -> Expected:
    return {
        "smc.llc_msg": [0x04],
        "smc.delete.link.response": [int(m.is_response)],
        "smc.delete.link.all": [int(m.is_all)],
        "smc.delete.link.orderly": [int(m.is_orderly)],
        "smc.delete.link.number": [m.link_num],
        "smc.delete.link.reason.code": [int(m.reason)],
    }


def _confirm_rkey(m: ConfirmRkey) -> Expected:
    return {
        "smc.llc_msg": [0x06],
        "smc.confirm.rkey.response": [int(m.is_response)],
        "smc.confirm.rkey.number.qp": [len(m.other_rtokens)],
        "smc.confirm.rkey.new.rkey": [m.rmb_key, *(t.rmb_key for t in m.other_rtokens)],
        "smc.confirm.rkey.new.virt": [m.rmb_vaddr, *(t.rmb_vaddr for t in m.other_rtokens)],
        "smc.confirm.rkey.link.number": [t.link_id for t in m.other_rtokens],
    }


def _delete_rkey(m: DeleteRkey) -> Expected:
    return {
        "smc.llc_msg": [0x09],
        "smc.delete.rkey.response": [int(m.is_response)],
        "smc.delete.rkey.count": [len(m.rkeys)],
        "smc.delete.rkey.error.mask": [m.err_mask],
        "smc.delete.rkey.deleted": list(m.rkeys),
    }


def _test_link(m: TestLink) -> Expected:
    return {"smc.llc_msg": [0x07], "smc.test.link.response": [int(m.is_response)]}


def _cdc(m: CdcMessage) -> Expected:
    p, c = m.producer_cursor, m.consumer_cursor
    flags, state = int(m.producer_flags), int(m.connection_state_flags)
    return {
        "smc.llc_msg": [0xFE],
        "smc.rmbe.ctrl.seqno": [m.sequence_number],
        "smc.rmbe.ctrl.alert.token": [m.alert_token],
        # Wireshark 4.0 gives the consumer cursor the producer cursor's field names.
        "smc.rmbe.ctrl.prod.wrap.seq": [p.wrap, c.wrap],
        "smc.rmbe.ctrl.peer.prod.curs": [p.count, c.count],
        "smc.rmbe.ctrl.write.blocked": [int(bool(flags & 0x80))],
        "smc.rmbe.ctrl.urgent.pending": [int(bool(flags & 0x40))],
        "smc.rmbe.ctrl.urgent.present": [int(bool(flags & 0x20))],
        "smc.rmbe.ctrl.cons.update.requested": [int(bool(flags & 0x10))],
        "smc.rmbe.ctrl.failover.validation": [int(bool(flags & 0x08))],
        "smc.rmbe.ctrl.peer.sending.done": [int(bool(state & 0x80))],
        "smc.rmbe.ctrl.peer.closed.conn": [int(bool(state & 0x40))],
        "smc.rmbe.ctrl.peer.abnormal.close": [int(bool(state & 0x20))],
    }


EXPECTATIONS: list[tuple[type, Callable[[Any], Expected]]] = [
    (ClcProposal, _proposal),
    (ClcAccept, _accept_confirm),
    (ClcConfirm, _accept_confirm),
    (ClcDecline, _decline),
    (ConfirmLink, _confirm_link),
    (AddLink, _add_link),
    (AddLinkCont, _add_link_cont),
    (DeleteLink, _delete_link),
    (ConfirmRkey, _confirm_rkey),
    (DeleteRkey, _delete_rkey),
    (TestLink, _test_link),
    (CdcMessage, _cdc),
]


def _expected(message: object) -> Expected:
    for cls, build in EXPECTATIONS:
        if isinstance(message, cls):
            return build(message)
    raise AssertionError(f"no expectation for {type(message).__name__}")


# -- the tests ------------------------------------------------------------------


def test_every_message_kind_is_in_the_sample(sample: list[SampleFrame]) -> None:
    kinds = {type(item.message) for item in sample if item.message is not None}
    assert kinds == {cls for cls, _ in EXPECTATIONS}
    decline_versions = {m.version for m in (i.message for i in sample) if isinstance(m, ClcDecline)}
    assert decline_versions == {1, 2}


def test_no_frame_is_malformed(decoded: list[DecodedFrame]) -> None:
    bad = [(f.number, f.errors) for f in decoded if f.malformed or f.errors]
    assert bad == []


def test_every_message_is_recognised_as_smc(
    sample: list[SampleFrame], decoded: list[DecodedFrame]
) -> None:
    for item, frame in zip(sample, decoded, strict=True):
        if item.message is not None:
            assert "smc" in frame.protocols, (frame.number, item.note, frame.protocols)
        else:
            assert "smc" not in frame.protocols, (frame.number, item.note)
        if item.kind == "roce":
            assert "infiniband" in frame.protocols, (frame.number, item.note)


def test_wireshark_decodes_the_fields_smcr_encoded(
    sample: list[SampleFrame], decoded: list[DecodedFrame]
) -> None:
    checked = 0
    for item, frame in zip(sample, decoded, strict=True):
        if item.message is None:
            continue
        for name, want in _expected(item.message).items():
            got = [_norm(v) for v in frame.values(name)]
            assert got == want, f"frame {frame.number} ({item.note}): {name}"
            checked += 1
    assert checked > 200  # every field of every message above, not a sample of them


def test_wireshark_reads_the_roce_headers_smcr_built(
    sample: list[SampleFrame], decoded: list[DecodedFrame]
) -> None:
    for item, frame in zip(sample, decoded, strict=True):
        if item.packet is None:
            continue
        bth = item.packet.bth
        assert _norm(frame.first("infiniband.bth.opcode")) == int(bth.opcode)
        assert _norm(frame.first("infiniband.bth.destqp")) == bth.dest_qp
        assert _norm(frame.first("infiniband.bth.psn")) == bth.psn
        assert _norm(frame.first("infiniband.bth.a")) == int(bth.ack_req)
        assert _norm(frame.first("udp.dstport")) == 4791
        if bth.opcode == Opcode.RDMA_WRITE_ONLY:
            reth = item.packet.reth
            assert reth is not None
            assert _norm(frame.first("infiniband.reth.va")) == reth.va
            assert _norm(frame.first("infiniband.reth.r_key")) == reth.r_key
            assert _norm(frame.first("infiniband.reth.dmalen")) == reth.dma_length
        if bth.opcode == Opcode.ACKNOWLEDGE:
            aeth = item.packet.aeth
            assert aeth is not None
            assert _norm(frame.first("infiniband.aeth.msn")) == aeth.msn


def test_scapy_finds_every_icrc_correct(sample: list[SampleFrame]) -> None:
    roce = [item for item in sample if item.kind == "roce"]
    assert len(roce) > 30
    for item in roce:
        packet = Ether(item.frame)
        assert packet[UDP].dport == 4791
        bth = packet[BTH]
        ip = packet[IP]
        assert ip.ttl == 1 and ip.id == 0 and ip.flags == "DF"
        # scapy recomputes the ICRC from the dissected layers (its argument is unused).
        assert item.frame[-4:] == bth.compute_icrc(b""), item.note


def test_sample_capture_is_written_exclusively(tmp_path: Path) -> None:
    path = tmp_path / "exists.pcap"
    path.write_bytes(b"")
    with pytest.raises(FileExistsError):
        PcapWriter(path)


@pytest.mark.parametrize("port", [44818, 48898])  # EtherNet/IP, ADS: ports Wireshark assigns
def test_clc_on_a_port_wireshark_gives_another_protocol_still_decodes(
        port: int, tmp_path: Path) -> None:  # fmt: skip
    """A server's ephemeral port may be one Wireshark hands to another dissector, which
    would then take the CLC messages; :func:`decode` lets SMC's heuristic look first.
    The kernel's own capture, its server moved to ``port``: every CLC message still SMC."""
    packets = rdpcap(str(LINUX_PCAP))
    server = min(min(p[TCP].sport, p[TCP].dport) for p in packets if TCP in p)
    for p in packets:
        if TCP in p:
            p[TCP].sport = port if p[TCP].sport == server else p[TCP].sport
            p[TCP].dport = port if p[TCP].dport == server else p[TCP].dport
            del p[TCP].chksum
    path = tmp_path / "moved.pcap"
    wrpcap(str(path), [p.__class__(bytes(p)) for p in packets])
    clc = [int(f.first("smc.clc_msg")) for f in decode(path) if f.values("smc.clc_msg")]
    assert clc == [1, 2, 3] * 2, clc  # two connections: Proposal, Accept, Confirm each
