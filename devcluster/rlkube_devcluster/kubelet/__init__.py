"""The node agent: the pods a real scheduler binds to a Node run as processes on this machine.

``NodeAgent`` (node_agent.py) registers its Node, keeps its Lease, and runs each bound pod's
container as a process; api_client.py is its client of the API server, sandbox.py makes the node's
directories and the pods' volumes, podnet.py (with network_thread.py) maps a job's service names
and ports to this host's, downward.py fills in the downward API, pod_run.py builds a container's
process, pod_status.py reports it as a kubelet does and termination.py reads its termination
message (docs/cluster-in-a-box.md).
"""
