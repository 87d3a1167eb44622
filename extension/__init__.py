"""jupyter-server extension: REST API and dashboard pages for Clamor clusters (DESIGN 8)."""
