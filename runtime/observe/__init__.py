"""What the driver records and shows (driver): telemetry of tasks, the snapshots
the views read, the read-only Observer service for other processes, and the
registry through which a notebook server finds its kernels' clusters."""
