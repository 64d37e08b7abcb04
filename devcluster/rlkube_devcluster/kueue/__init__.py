"""Kueue in the dev cluster: built from its Go module at a pinned release, run beside the control plane.

* :mod:`.build`: builds Kueue's manager (``go install sigs.k8s.io/kueue/cmd/kueue@v0.17.0``) and
  caches it outside the checkout, keyed by the version; finds its CRDs and webhook manifests in the
  module's source.
* :mod:`.manager`: the CRDs, certificates, configuration and webhooks a manager outside a cluster
  needs, and the manager as a process in a private mount namespace.
"""
