"""Per-role pod defaults shaped like charts/rlkube/values-gpu.yaml's jobDefaults (shared by render tests)."""

from __future__ import annotations

from typing import Any

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
GPU_DEFAULTS: dict[str, Any] = {
    "trainer": {
        "resources": {
            "requests": {"cpu": "8", "memory": "32Gi"},
            "limits": {"nvidia.com/gpu": 1, "memory": "64Gi"},
        },
        "tolerations": [GPU_TOLERATION],
        "nodeSelector": {"nvidia.com/gpu.present": "true"},
        "env": [{"name": "NCCL_DEBUG", "value": "WARN"}],
        "labels": {"team": "platform", "tier": "gpu"},
        "priorityClassName": "training",
    },
    "evaluator": {"resources": {"requests": {"cpu": "2", "memory": "4Gi"}}},
}
