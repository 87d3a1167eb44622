"""Generated gRPC/protobuf modules for the control plane (see README.md)."""
