"""Regenerate clamor_pb2.py and clamor_pb2_grpc.py from clamor.proto (``make proto``).

The schema is compiled from a temporary tree laid out as ``clamor/runtime/net/proto/``
so that the gRPC module imports ``from clamor.runtime.net.proto import clamor_pb2``.
Use grpcio-tools 1.62.x (see README.md): newer versions emit version checks that
would raise the grpcio/protobuf floors declared in pyproject.toml.
"""

import pathlib
import shutil
import sys
import tempfile

from grpc_tools import protoc

HERE = pathlib.Path(__file__).resolve().parent


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        package = pathlib.Path(tmp, "clamor", "runtime", "net", "proto")
        package.mkdir(parents=True)
        shutil.copy(HERE / "clamor.proto", package)
        args = [
            "grpc_tools.protoc",
            f"-I{tmp}",
            f"--python_out={tmp}",
            f"--grpc_python_out={tmp}",
            str(package / "clamor.proto"),
        ]
        if protoc.main(args) != 0:
            return 1
        for name in ("clamor_pb2.py", "clamor_pb2_grpc.py"):
            shutil.copy(package / name, HERE / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
