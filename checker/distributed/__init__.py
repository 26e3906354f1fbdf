"""The thin distributed layer: torchrun's environment, the process group, the int64 exchange.

Only :mod:`checker.distributed.group` imports torch; the wire format and the launch environment are pure so
the verdict can be tested without a process group.
"""
