"""The paging data plane (driver and workers): the shared arena and its allocator,
the native pagers that version, serve and demand-page its pages, and their typed
Python face. Imports only the runtime's shared vocabulary (errors, credentials)."""
