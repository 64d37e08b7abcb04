"""An API emulator on kmock, for the real kopf operator and the real kubectl (testing tier 3).

``Emulator`` (server.py) answers the Kubernetes API; ``Store`` (store.py) keeps objects by the
API server's rules; controllers.py adds the StatefulSet controller, garbage collection and a
kubelet that runs nothing; ``EmulatedCluster`` (cluster.py) runs all of it on a thread and writes
kubeconfigs. ``ProcessKubelet`` (process_kubelet.py, with sandbox.py, podnet.py, pod_run.py and
pod_status.py) runs the pods as local processes: the cluster-in-a-box (docs/cluster-in-a-box.md).
"""
