"""The process kubelet: the emulator's pods run as processes on this machine (the cluster-in-a-box).

``ProcessKubelet`` (process_kubelet.py) schedules each pod onto a simulated node and runs its
container's command; sandbox.py makes the nodes and the pods' volumes, podnet.py maps the job's
service names and ports to this host's, pod_run.py builds a container's process, pod_status.py
reports it as a kubelet does and termination.py reads its termination message
(docs/cluster-in-a-box.md).
"""
