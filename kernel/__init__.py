"""The Clamor Jupyter kernel (the driver): lifecycle, kernelspec, start-up."""
