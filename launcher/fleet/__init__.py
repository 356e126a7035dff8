"""The fleet: `launch_server --dp-size N`, N whole servers on this machine behind one router endpoint.

    run.py         the entry point: check the flags, plan, start, print the ready line, supervise, drain
    plan.py        each replica's cores, ports and launch_server flags (ReplicaSpec)
    core_split.py  the allowed CPUs cut into disjoint sets, NUMA node by node
    replica.py     one replica: an ordinary launch_server, pinned to its cores, restartable
    router.py      sglang-router in front of the replicas (RouterSettings, RouterProcess)
    supervisor.py  Fleet: owns the replicas and the router; start, supervise, shutdown
    bound_exec.py  exec a command that dies with the supervisor (the router)
    router_main.py the router process: sglang-router with the API key from the environment

A replica knows nothing of the fleet: it is one server, and the fleet only starts it, watches it
and signals it.
"""
