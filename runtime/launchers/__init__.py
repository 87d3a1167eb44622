"""Where workers run (driver): local subprocesses, SSH hosts, or inside a Dask
cluster. Every launcher starts the same ``clamor-worker`` command."""
