"""The worker process (workers only): its gRPC service, the task and report
threads, and its set-up of the pager and the partition store. Run it with
``clamor-worker`` or ``python -m clamor.runtime.worker``."""
