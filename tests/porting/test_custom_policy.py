"""A policy written to RLightning's Customize Policy guide runs on rlkube after changing its imports."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from rlkube.engine.report import EpochRecord, RunStart, RunSummary
from rlkube.engine.run_paths import RunPaths
from rlkube.launch.in_process import InProcessRun
from rlkube.launch.run import resolve_policy
from rlkube.policy import BasePolicy
from rlkube.spec import parse_job

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "custom_policy.py"
DOC = ROOT / "docs" / "porting-from-rlightning.md"
EIGHT = {
    "construct_network",
    "setup_optimizer",
    "rollout_step",
    "postprocess",
    "update_dataset",
    "train",
    "get_trainable_parameters",
    "load_state_dict",
}


def job(**train: int) -> object:
    return parse_job(
        {
            "apiVersion": "rlkube.io/v1alpha1",
            "kind": "RLJob",
            "metadata": {"name": "ported"},
            "spec": {
                "policy": {
                    "type": "MyPolicy",
                    "module": "examples.custom_policy",
                    "modelCfg": {"hidden_dim": 32},
                    "optimCfg": {"lr": 0.001},
                    "algoCfg": {
                        "gamma": 0.98,
                        "gae_lambda": 0.8,
                        "clip": 0.2,
                        "update_epochs": 2,
                        "minibatches": 2,
                    },
                },
                "env": {"id": "CartPole-v1", "numEnvs": 4},
                "train": {
                    "maxEpochs": 2,
                    "stepsPerEpoch": 64,
                    "fragmentLength": 16,
                    "batchSize": 32,
                    **train,
                },
            },
        }
    )


class Recorder:
    def __init__(self, engine: InProcessRun) -> None:
        self.engine = engine
        self.initial: dict[str, float] = {}
        self.records: list[EpochRecord] = []

    def on_start(self, start: RunStart) -> None:
        self.initial = self.engine.train_policy.get_param_fingerprint()

    def on_epoch(self, record: EpochRecord) -> None:
        self.records.append(record)

    def on_finish(self, summary: RunSummary) -> None:
        pass


def test_the_guide_policy_is_found_through_spec_policy_module_and_trains_two_epochs(tmp_path: Path) -> None:
    spec = job()
    cls = resolve_policy(spec)  # imports examples.custom_policy, whose decorator registers MyPolicy
    assert cls.__name__ == "MyPolicy"
    assert issubclass(cls, BasePolicy)
    engine = InProcessRun(spec, cls, paths=RunPaths(tmp_path).create())
    recorder = Recorder(engine)
    engine.observers = [recorder]
    summary = engine.run()
    assert summary.epochs == 2
    assert summary.weight_version == 2
    assert summary.fingerprints_consistent
    assert [name for name, _ in engine.train_policy.model_list] == ["encoder", "actor", "critic"]
    assert engine.train_policy.get_param_fingerprint() != recorder.initial  # it learned something
    assert engine.eval_policy.get_param_fingerprint() == engine.train_policy.get_param_fingerprint()
    assert {"loss", "losses/policy_loss", "losses/value_loss"} <= set(recorder.records[-1].metrics)
    assert "entropy" in engine.train_policy.dataset  # extra PolicyResponse fields reach update_dataset


def test_the_example_defines_the_eight_methods_and_imports_only_the_ported_names() -> None:
    tree = ast.parse(EXAMPLE.read_text())
    (policy,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "MyPolicy"]
    assert {node.name for node in policy.body if isinstance(node, ast.FunctionDef)} >= EIGHT
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert {"rlkube.policy", "rlkube.types", "rlkube.utils.registry"} <= imported
    assert not any(name.startswith("rlightning") for name in imported)


def test_the_porting_doc_shows_the_example_s_own_import_lines() -> None:
    added = [line[1:] for line in DOC.read_text().splitlines() if re.match(r"^\+from rlkube", line)]
    assert len(added) == 3
    source = EXAMPLE.read_text()
    for line in added:
        assert line in source
