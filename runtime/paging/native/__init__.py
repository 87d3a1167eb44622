"""clamor's only C code: the arena allocator, numpy handler, pagers and page servers.

`_native` is compiled by cffi from the sources beside this file (build.py);
Python code reaches it through the typed faces in runtime/paging/arena.py and
runtime/paging/pager.py, never directly from user code.
"""
