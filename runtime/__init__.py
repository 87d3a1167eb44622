"""The driver and worker runtime: arena, pager, shipping, control plane, workers.

It never imports UI code (ipywidgets, bokeh, ipykernel, jupyter-server); the
kernel and the widgets build on it, not the other way round.
"""
