"""Running stages (driver): the pure scheduler state machine and its placement
policy, the executor that carries out its instructions on one loop thread, and
the throttle that slows a worker for straggler experiments."""
