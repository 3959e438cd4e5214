"""One module per source format (its reader, then its ``SPEC``); :mod:`.registry` lists them."""
