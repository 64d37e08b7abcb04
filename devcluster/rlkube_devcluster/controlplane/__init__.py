"""The real Kubernetes control plane: built from source at a pinned version, started on loopback.

* :mod:`.build`: builds kube-apiserver, kube-controller-manager and kube-scheduler from the Go
  module in ``devcluster/kubernetes/`` (go.mod pins k8s.io/kubernetes) and caches the binaries
  outside the checkout, keyed by the version and go.sum, so only the first build on a machine pays.
* :mod:`.pki`: the certificate authority, serving and client certificates, and the
  service-account signing key (the ``openssl`` command line).
* :mod:`.cluster`: etcd, the API server, the controller-manager and the scheduler as processes in a
  temporary directory, a kubeconfig for each identity, and a clean stop.
"""
