"""clamor's only C code: the arena allocator, numpy handler, pagers and page servers.

`_native` is compiled by cffi from the sources beside this file (build.py);
Python code reaches it through the typed faces in runtime/arena.py and
runtime/pager.py, never directly from user code.
"""
