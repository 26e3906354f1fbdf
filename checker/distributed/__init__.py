"""The thin distributed layer: torchrun's environment, the process group, the int64 exchange, and the
run protocol every job runs (:mod:`checker.distributed.exchange`).

Only :mod:`checker.distributed.group` imports torch (the session imports it when the group is made);
the wire format, the launch environment, liveness and the protocol are pure, so the verdict and the
protocol's branches are tested without a process group (tests/test_protocol.py, tests/fakes.py).
"""
