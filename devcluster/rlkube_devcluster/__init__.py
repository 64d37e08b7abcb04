"""The dev cluster behind ``make cluster``: a Kubernetes API emulator, kubelets, and the real operator.

A source root of its own (``devcluster/``), not part of the ``rlkube`` wheel: it lives in the
repository, next to the CRD it serves (``crds/rljob.yaml``), and is on the path wherever the
project's tools run (pytest, mypy, lint-imports, ``make cluster``).

* :mod:`.emulator`: the API server (kmock underneath): storage by the API server's rules,
  admission (schemas, CEL, strict field validation), OpenAPI v3, watches, the StatefulSet
  controller and garbage collection. Plain Kubernetes: it imports nothing of rlkube.
* :mod:`.controlplane`: the real Kubernetes control plane (etcd, kube-apiserver,
  kube-controller-manager, kube-scheduler) built from the pinned Go module in
  ``devcluster/kubernetes/`` and started on loopback; the tests of tests/kubernetes run on it.
* :mod:`.kubelet`: the process kubelet, which runs the pods the emulator holds as local processes
  (the cluster-in-a-box, docs/cluster-in-a-box.md).
* :mod:`.operator_process`, :mod:`.coordinators`: the operator as a process, and fake
  coordinators for ``--simulate-training``.
* :mod:`.cli`: ``python -m rlkube_devcluster`` (``make cluster``).

The runtime and the operator never import it (an import-linter contract); it drives the operator
only as a process, as a cluster does.
"""

from __future__ import annotations

from pathlib import Path

#: The repository this source root belongs to (crds/, examples/, runs/).
REPO = Path(__file__).resolve().parents[2]
