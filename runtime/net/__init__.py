"""The control plane's wire (driver and workers): gRPC servers and channels with
their token and protocol checks, the generated messages (proto/), and what a task
ships (arena arrays by reference, code, exceptions). Sits on paging/."""
