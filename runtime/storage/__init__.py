"""Where stage outputs live (driver and workers): the partition store, spilling
beyond its memory budget, and the bulk channel that moves partitions between
processes over plain TCP. Sits on net/ and paging/."""
