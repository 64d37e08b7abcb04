"""An API emulator on kmock, for the real kopf operator and the real kubectl (testing tier 3).

``Emulator`` (server.py) answers the Kubernetes API; ``Store`` (store.py) keeps objects by the
API server's rules; controllers.py adds the StatefulSet controller, garbage collection and a
kubelet that runs nothing; ``EmulatedCluster`` (cluster.py) runs all of it on a thread and writes
kubeconfigs. The process kubelet, which runs the pods as local processes, is
:mod:`rlkube_devcluster.kubelet`.
"""
