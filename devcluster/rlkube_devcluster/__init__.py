"""The dev cluster behind ``make cluster``: real Kubernetes on this machine, node agents, the operator.

A source root of its own (``devcluster/``), not part of the ``rlkube`` wheel: it lives in the
repository, next to the CRD it installs (``crds/rljob.yaml``), and is on the path wherever the
project's tools run (pytest, mypy, lint-imports, ``make cluster``).

* :mod:`.controlplane`: the real Kubernetes control plane (etcd, kube-apiserver,
  kube-controller-manager, kube-scheduler) built from the pinned Go module in
  ``devcluster/kubernetes/`` and started on loopback, with an audit log of the operators' requests.
* :mod:`.kubelet`: the node agent, a kubelet-shaped client of that API server that runs the pods
  bound to its Node as local processes (the cluster-in-a-box, docs/cluster-in-a-box.md).
* :mod:`.real_cluster`: the two together, with the RLJob CRD installed.
* :mod:`.operator_process`, :mod:`.coordinators`: the operator as a process, and fake
  coordinators for ``--simulate-training`` and the operator tests.
* :mod:`.cli`: ``python -m rlkube_devcluster`` (``make cluster``).

The runtime and the operator never import it (an import-linter contract); it drives the operator
only as a process (or as a pod, installed by its Helm chart), as a cluster does.
"""

from __future__ import annotations

from pathlib import Path

#: The repository this source root belongs to (crds/, examples/, runs/).
REPO = Path(__file__).resolve().parents[2]
