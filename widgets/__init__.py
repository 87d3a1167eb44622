"""Live views of a Clamor cluster: Bokeh figures shown as ipywidgets (DESIGN 8)."""
