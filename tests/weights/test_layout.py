"""The flat layout: state dict <-> manifest + one buffer, zero-copy views, digests, clear errors."""

from __future__ import annotations

import pytest
import torch
from rlkube._proto import policy_group_pb2 as pb
from rlkube.weights.copies import COPIES
from rlkube.weights.layout import LayoutError, WeightLayout, layout_of, pack_into_, views_of


def mixed_state_dict() -> dict[str, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    return {
        "actor": {
            "0.weight": torch.randn(7, 5),
            "0.bias": torch.randn(7).to(torch.bfloat16),
            "norm.scale": torch.randn(3).to(torch.float16),
        },
        "critic.head": {
            "steps": torch.tensor(11, dtype=torch.int64),
            "mask": torch.tensor([True, False, True]),
            "empty": torch.zeros(0, 4),
        },
    }


def test_pack_then_views_round_trip_every_dtype_and_shape() -> None:
    sd = mixed_state_dict()
    layout = layout_of(sd)
    buf = torch.zeros(layout.total_bytes, dtype=torch.uint8)
    pack_into_(buf, sd, layout)
    out = views_of(buf, layout)
    assert list(out) == list(sd)
    for module, params in sd.items():
        assert list(out[module]) == list(params)
        for name, tensor in params.items():
            assert out[module][name].dtype == tensor.dtype
            assert out[module][name].shape == tensor.shape
            assert torch.equal(out[module][name], tensor)


def test_offsets_are_aligned_and_entries_do_not_overlap() -> None:
    layout = layout_of(mixed_state_dict(), alignment=128)
    end = 0
    for entry in layout.entries:
        assert entry.offset % 128 == 0
        assert entry.offset >= end
        end = entry.offset + entry.nbytes
    assert layout.total_bytes % 128 == 0
    assert layout.total_bytes >= end


def test_views_share_memory_with_the_buffer() -> None:
    sd = mixed_state_dict()
    layout = layout_of(sd)
    buf = torch.zeros(layout.total_bytes, dtype=torch.uint8)
    views = views_of(buf, layout)
    buf.fill_(0)
    pack_into_(buf, sd, layout)
    assert torch.equal(views["actor"]["0.weight"], sd["actor"]["0.weight"])


def test_pack_makes_one_counted_copy_per_tensor() -> None:
    sd = mixed_state_dict()
    layout = layout_of(sd)
    buf = torch.zeros(layout.total_bytes, dtype=torch.uint8)
    COPIES.reset()
    pack_into_(buf, sd, layout)
    calls, nbytes = COPIES.snapshot()["copy_tensor_into_slot"]
    assert calls == len(layout.entries)
    assert nbytes == sum(e.nbytes for e in layout.entries)


def test_layout_survives_the_wire_and_keeps_dotted_module_names() -> None:
    layout = layout_of(mixed_state_dict())
    again = WeightLayout.from_proto(pb.WeightLayout.FromString(layout.to_proto().SerializeToString()))
    assert again == layout
    assert again.modules() == ["actor", "critic.head"]
    assert [e.name for e in again.entries][3] == "critic.head.steps"


def test_digest_changes_with_shape_dtype_or_name() -> None:
    base = layout_of({"m": {"w": torch.zeros(2, 3)}}).digest
    assert layout_of({"m": {"w": torch.zeros(2, 3)}}).digest == base
    assert layout_of({"m": {"w": torch.zeros(3, 2)}}).digest != base
    assert layout_of({"m": {"w": torch.zeros(2, 3, dtype=torch.bfloat16)}}).digest != base
    assert layout_of({"m": {"v": torch.zeros(2, 3)}}).digest != base


def test_a_tampered_wire_layout_is_rejected() -> None:
    msg = layout_of(mixed_state_dict()).to_proto()
    msg.entries[0].shape[0] = 8
    with pytest.raises(LayoutError, match="digest mismatch"):
        WeightLayout.from_proto(msg)


def test_non_tensor_values_are_named_in_the_error() -> None:
    with pytest.raises(LayoutError, match=r"state_dict\['m'\]\['_extra_state'\] is a dict"):
        layout_of({"m": {"w": torch.zeros(1), "_extra_state": {}}})


def test_packing_a_state_dict_of_another_shape_names_the_tensor() -> None:
    layout = layout_of({"m": {"w": torch.zeros(2, 3)}})
    buf = torch.zeros(layout.total_bytes, dtype=torch.uint8)
    with pytest.raises(
        LayoutError, match=r"m\.w: float32\[3, 2\] does not match the layout's float32\[2, 3\]"
    ):
        pack_into_(buf, {"m": {"w": torch.zeros(3, 2)}}, layout)


def test_non_contiguous_tensors_are_packed_by_value() -> None:
    sd = {"m": {"t": torch.arange(12.0).reshape(3, 4).t()}}
    layout = layout_of(sd)
    buf = torch.zeros(layout.total_bytes, dtype=torch.uint8)
    pack_into_(buf, sd, layout)
    assert torch.equal(views_of(buf, layout)["m"]["t"], sd["m"]["t"])
