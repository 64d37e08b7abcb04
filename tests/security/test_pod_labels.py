"""Only the operator's pods carry the job-pod label the NetworkPolicy admits by; users cannot set it."""

from __future__ import annotations

import copy

import pytest
from rlkube import contract as c
from rlkube.spec import RESERVED_LABEL, SpecError, parse_job
from rlkube_operator import render as r
from rlkube_operator.settings import RenderSettings

from tests.conftest import MINIMAL_JOB


def job(**spec: object):  # type: ignore[no-untyped-def]
    document = copy.deepcopy(MINIMAL_JOB)
    document["spec"].update(spec)
    return parse_job(document)


def test_the_spec_refuses_the_job_pod_label_in_either_roles_overrides() -> None:
    assert RESERVED_LABEL == c.LABEL_JOB_POD
    for role in ("trainer", "evaluator"):
        with pytest.raises(SpecError, match=f"spec.{role}.labels"):
            job(**{role: {"labels": {c.LABEL_JOB_POD: "someone-else"}}})


def test_every_rendered_pod_carries_it_and_mounts_the_jobs_credential_read_only() -> None:
    rendered = job(evaluator={"labels": {"team": "a"}})
    for role in (c.Role.TRAIN, c.Role.EVAL):
        template = r.render_pod_template(rendered, role, RenderSettings())
        assert template["metadata"]["labels"][c.LABEL_JOB_POD] == "cartpole"
        (volume,) = [v for v in template["spec"]["volumes"] if v["name"] == "credential"]
        assert volume["secret"]["secretName"] == c.secret_name("cartpole")
        (container,) = template["spec"]["containers"]
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == "credential"]
        assert mount == {"name": "credential", "mountPath": c.TOKEN_DIR, "readOnly": True}
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["RLKUBE_TOKEN_FILE"] == c.TOKEN_PATH
        assert "RLKUBE_TLS_DIR" not in env


def test_a_tls_secret_in_the_spec_is_mounted_and_named_to_the_runtime() -> None:
    template = r.render_pod_template(
        job(security={"tlsSecretName": "cartpole-tls"}), c.Role.EVAL, RenderSettings()
    )
    (volume,) = [v for v in template["spec"]["volumes"] if v["name"] == "tls"]
    assert volume["secret"]["secretName"] == "cartpole-tls"
    env = {e["name"]: e.get("value") for e in template["spec"]["containers"][0]["env"]}
    assert env["RLKUBE_TLS_DIR"] == c.TLS_DIR


def test_the_credential_secret_holds_the_token_it_is_given() -> None:
    import base64

    secret = r.render_credential_secret(job(), RenderSettings(), token="t0k3n")
    assert secret["metadata"]["name"] == "cartpole-credential"
    assert base64.b64decode(secret["data"][c.TOKEN_KEY]) == b"t0k3n"
