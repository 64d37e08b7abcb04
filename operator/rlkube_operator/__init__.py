"""rlkube's Kubernetes operator: RLJob -> ConfigMap, Services, train and eval StatefulSets.

Pure modules (no I/O; take observations and time as arguments): ``render``, ``status``,
``crd``. I/O: ``handlers`` (kopf), ``main``. This package never imports torch or the heavy
runtime (checked by import-linter).
"""
