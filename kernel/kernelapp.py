"""The kernel application: ipykernel's ``IPKernelApp`` running :class:`ClamorKernel`."""

from __future__ import annotations

from typing import ClassVar

from clamor.kernel.kernel import ClamorKernel
from ipykernel.kernelapp import IPKernelApp
from traitlets import Type

__all__ = ["ClamorKernelApp", "main"]


class ClamorKernelApp(IPKernelApp):
    """``python -m clamor.kernel``: accepts every ``IPKernelApp`` option (``-f``, ``--debug``)."""

    name = "clamor-kernel"
    classes: ClassVar[list] = [*IPKernelApp.classes, ClamorKernel]  # --ClamorKernel.page_size
    kernel_class = Type(ClamorKernel, klass="ipykernel.kernelbase.Kernel").tag(config=True)


def main() -> None:
    """Launch the kernel (blocks until it shuts down)."""
    ClamorKernelApp.launch_instance()
