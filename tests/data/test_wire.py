"""TensorDicts cross the wire as a manifest plus raw bytes, and come back equal without a copy."""

from __future__ import annotations

import json

import pytest
import torch
from rlkube.data.wire import ALIGNMENT, Manifest, WireError, decode, encode, payload_pieces
from tensordict import NonTensorData, TensorDict


def sample_td() -> TensorDict:
    return TensorDict(
        {
            "observation": torch.randn(3, 4, 5),
            "action": torch.randint(0, 7, (3, 4)),
            "terminated": torch.rand(3, 4) > 0.5,
            "log_prob": torch.randn(3, 4).to(torch.bfloat16),
            "value": torch.randn(3, 4).half(),
            "count": torch.arange(12, dtype=torch.int32).reshape(3, 4),
            "next": {"observation": torch.randn(3, 4, 5), "empty": torch.zeros(3, 4, 0)},
        },
        batch_size=[3, 4],
    )


def test_round_trip_keeps_every_key_dtype_shape_and_value() -> None:
    td = sample_td()
    manifest, payload = encode(td)
    back = decode(manifest, payload)
    assert back.batch_size == td.batch_size
    assert set(back.keys(True, True)) == set(td.keys(True, True))
    for key in td.keys(True, True):
        assert back[key].dtype == td[key].dtype, key
        assert torch.equal(back[key], td[key]), key


def test_nested_keys_are_joined_with_a_slash() -> None:
    manifest, _ = encode(sample_td())
    assert "next/observation" in {meta.key for meta in manifest.tensors}


def test_decode_views_the_payload_without_copying() -> None:
    manifest, payload = encode(sample_td())
    back = decode(manifest, payload)
    payload[manifest.tensors[0].offset : manifest.tensors[0].offset + 4] = b"\x00\x00\x80\x3f"  # 1.0f
    first = manifest.tensors[0].key
    assert back[tuple(first.split("/"))].reshape(-1)[0].item() == 1.0


def test_offsets_are_aligned() -> None:
    manifest, payload = encode(sample_td())
    assert all(meta.offset % ALIGNMENT == 0 for meta in manifest.tensors)
    assert len(payload) == manifest.total_bytes


def test_read_only_bytes_decode_too() -> None:
    td = sample_td()
    manifest, payload = encode(td)
    back = decode(manifest, bytes(payload))
    assert torch.equal(back["action"], td["action"])


def test_manifest_survives_json() -> None:
    manifest, payload = encode(sample_td())
    again = Manifest.from_dict(json.loads(json.dumps(manifest.to_dict())))
    assert again == manifest
    assert torch.equal(decode(again, payload)["observation"], decode(manifest, payload)["observation"])


def test_non_contiguous_and_scalar_batch_tensors_encode() -> None:
    td = TensorDict({"x": torch.randn(4, 6).t(), "y": torch.tensor(3.0)}, batch_size=[])
    back = decode(*encode(td))
    assert torch.equal(back["x"], td["x"])
    assert back["y"].item() == 3.0


def test_short_payload_is_refused() -> None:
    manifest, payload = encode(sample_td())
    with pytest.raises(WireError, match="payload has"):
        decode(manifest, payload[:-8])


def test_non_tensor_leaves_are_refused() -> None:
    td = TensorDict({"x": torch.zeros(2), "note": NonTensorData("hello", batch_size=[2])}, batch_size=[2])
    with pytest.raises(WireError, match="note: only tensors travel"):
        encode(td)


def test_keys_with_a_slash_are_refused() -> None:
    td = TensorDict({"a/b": torch.zeros(2)}, batch_size=[2])
    with pytest.raises(WireError, match="may not contain"):
        encode(td)


def test_payload_pieces_join_to_the_encoded_payload() -> None:
    td = sample_td()
    manifest, payload = encode(td)
    assert b"".join(payload_pieces(td, manifest)) == bytes(payload)
